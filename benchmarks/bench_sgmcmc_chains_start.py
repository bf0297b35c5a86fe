# SPDX-License-Identifier: Apache-2.0
"""SG-MCMC runs of ``K`` vectorised chains: the chains' gradients together in the warm start, the eager start and the
warm-up's curvature estimate, against chain by chain.

``--workload two-moons`` (default): ``MCMC(SGLD(BayesianMLP([2, 50, 50, 1]), num_steps=10, subsample_size=32,
vectorized_chains=K), warmup_steps=50, num_samples=50).run(x, y)`` on Two Moons (200 points): 1000 inner steps, of
which the automatic MAP warm start takes 100 Adam steps (10 % of the run) and ``backend="auto"`` the first 100
eagerly, the rest traced (the trace included).

``--workload diabetes``: the SG-MCMC run of ``pyro-sdebnn benchmark realdata-nuts`` on scikit-learn's diabetes data
(353 training points, a 10-32-1 tanh network, a loader of batch 64, seed 0): ``MCMC(Kernel(model, num_steps=10,
vectorized_chains=2), warmup_steps=400, num_samples=400).run(loader)`` with ``--kernel SGHMC`` or ``SGLD`` (and
``--chains K`` vectorised chains in place of 2). Its warm-up adapts the mass matrix and checks the step by the
curvature estimate (SGLD at 5 positions, 20 power iterations each; SGHMC at 12, 10 each), each iteration taking the
gradient at every chain's two finite-difference points on 6 minibatches. Besides the whole run, the warm-up (set-up
and warm start included) and the curvature estimates alone are timed (wall and CPU).

The other variant computes the chains' gradients chain by chain in those phases (``_chains_gradient`` returning
``None``, as for a model that ``vmap`` cannot run); the traced steps are the same. One untimed run of each first (the
trace imports torch's compiler once per process), then the two interleaved in every repeat, alternating which goes
first; the ratio chain-by-chain / together of each repeat is reported (median, min-max), of the wall times and of
the process's CPU times (less sensitive to other processes on a shared core).

Usage::

    python benchmarks/bench_sgmcmc_chains_start.py [--chains 8] [--repeats 5] [--threads 1]
    python benchmarks/bench_sgmcmc_chains_start.py --workload diabetes [--kernel SGHMC] [--chains 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import torch
from pyro.infer import MCMC
from torch.utils.data import DataLoader, TensorDataset

from pyro_sdebnn.data import two_moons
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer.mcmc import SGHMC, SGLD, BayesianMLP


def _timed_run(kernel, together: bool, *args) -> dict[str, float]:
    """Run ``MCMC`` over ``kernel``: wall and CPU seconds of the run, of its warm-up (set-up included) and of the
    warm-up's curvature estimates."""
    if not together:
        kernel._chains_gradient = lambda *args: None  # chain by chain
    check, curvature = kernel._stable_step, [0.0, 0.0]

    def timed_check(positions):
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return check(positions)
        finally:
            curvature[0] += time.perf_counter() - start
            curvature[1] += time.process_time() - cpu

    kernel._stable_step = timed_check
    warmup_end = []

    def hook(kernel, params, stage, i):
        if stage.startswith("Warmup") and not warmup_end:
            warmup_end.append(None)  # set at the first sample below
        elif stage.startswith("Sample") and warmup_end and warmup_end[0] is None:
            warmup_end[0] = time.perf_counter(), time.process_time()

    mcmc = MCMC(kernel, num_samples=kernel.bench_samples, warmup_steps=kernel.bench_warmup, hook_fn=hook,
                disable_progbar=True)
    start, start_cpu = time.perf_counter(), time.process_time()
    mcmc.run(*args)
    end, cpu = time.perf_counter(), time.process_time() - start_cpu
    nan = (float("nan"), float("nan"))
    warmup = warmup_end[0] if warmup_end else nan
    return {"wall": end - start, "cpu": cpu, "warmup": warmup[0] - start, "warmup_cpu": warmup[1] - start_cpu,
            "curvature": curvature[0], "curvature_cpu": curvature[1]}


def run_two_moons(x, y, chains: int, together: bool) -> dict[str, float]:
    pyro.set_rng_seed(0)
    kernel = SGLD(BayesianMLP([2, 50, 50, 1], likelihood="bernoulli"), num_steps=10, subsample_size=32,
                  vectorized_chains=chains)
    kernel.bench_warmup, kernel.bench_samples = 50, 50
    out = _timed_run(kernel, together, x, y)
    assert kernel.map_steps_taken == 100 and kernel.backend_used == "fx"
    return out


def diabetes_data():
    """The training split, network and settings of ``pyro-sdebnn benchmark realdata-nuts`` on diabetes."""
    from pyro_sdebnn.experiments import realdata_nuts

    s = realdata_nuts._settings(False)
    x, _, y, _, _ = realdata_nuts._load("diabetes", s["max_train"])
    return realdata_nuts._model(x.shape[1], s["hidden"], False), x, y, s


def run_diabetes(model, x, y, s, kernel_name: str, together: bool, chains: int = 2) -> dict[str, float]:
    """``realdata_nuts._sgmcmc`` with seed 0 (``chains`` vectorised chains: the protocol's 2 by default), timed."""
    pyro.set_rng_seed(0)
    loader = DataLoader(TensorDataset(x, y), batch_size=s["batch"], shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    kernel = {"SGLD": SGLD, "SGHMC": SGHMC}[kernel_name](model, num_steps=s["num_steps"], vectorized_chains=chains)
    kernel.bench_warmup, kernel.bench_samples = s["warmup"], s["samples"]
    out = _timed_run(kernel, together, loader)
    assert kernel.diagnostics()["mass matrix adapted"]
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["two-moons", "diabetes"], default="two-moons")
    parser.add_argument("--chains", type=check.positive_int, default=None,
                        help="vectorised chains (default: two-moons 8, diabetes 2)")
    parser.add_argument("--kernel", choices=["SGLD", "SGHMC"], default="SGHMC", help="the kernel (diabetes)")
    parser.add_argument("--repeats", type=check.positive_int, default=5)
    parser.add_argument("--threads", type=check.positive_int, default=1)
    args = parser.parse_args(argv)
    if args.chains is None:
        args.chains = 8 if args.workload == "two-moons" else 2
    torch.set_num_threads(args.threads)
    if args.workload == "two-moons":
        data = two_moons(n_train=200, n_test=10, noise=0.2, seed=0)
        x, y = data.x_train, data.y_train.float()

        def run(together):
            return run_two_moons(x, y, args.chains, together)
    else:
        model, x, y, s = diabetes_data()

        def run(together):
            return run_diabetes(model, x, y, s, args.kernel, together, args.chains)

    for together in (True, False):
        run(together)
    ratios: dict[str, list[float]] = {}
    for i in range(args.repeats):
        times = {}
        for together in ((True, False) if i % 2 == 0 else (False, True)):
            times[together] = run(together)
        timed = [key for key in times[True] if times[True][key] > 0]  # two-moons: too short to adapt, no curvature
        for key in timed:
            ratios.setdefault(key, []).append(times[False][key] / times[True][key])
        print(", ".join(f"{key}: together {times[True][key]:.2f} s, chain by chain {times[False][key]:.2f} s, ratio "
                        f"{ratios[key][-1]:.3f}" for key in timed), flush=True)
    out = {"workload": args.workload, "chains": args.chains}
    if args.workload == "diabetes":
        out["kernel"] = args.kernel
    for key, values in ratios.items():
        name = "ratio" if key == "wall" else f"{key}_ratio"
        out.update({f"{name}_median": statistics.median(values), f"{name}_min": min(values),
                    f"{name}_max": max(values)})
    print(out)
    return out


if __name__ == "__main__":
    import warnings

    from pyro_sdebnn.infer.mcmc.diagnostics import SamplerWarning

    warnings.simplefilter("ignore", SamplerWarning)  # short runs have not mixed: not what is measured here
    main()
