# SPDX-License-Identifier: Apache-2.0
"""A short default SG-MCMC run of ``K`` vectorised chains: the chains' gradients together in the warm start and the
eager start, against chain by chain.

``MCMC(SGLD(BayesianMLP([2, 50, 50, 1]), num_steps=10, subsample_size=32, vectorized_chains=K), warmup_steps=50,
num_samples=50).run(x, y)`` on Two Moons (200 points): 1000 inner steps, of which the automatic MAP warm start takes
100 Adam steps (10 % of the run) and ``backend="auto"`` the first 100 eagerly, the rest traced (the trace included).
The other variant computes the chains' gradients chain by chain in those two phases (``_chains_gradient`` returning
``None``, as for a model that ``vmap`` cannot run); the traced steps are the same. One untimed run of each first (the
trace imports torch's compiler once per process), then the two interleaved in every repeat, alternating which goes
first; the ratio chain-by-chain / together of each repeat is reported (median, min-max), of the wall times and of
the process's CPU times (less sensitive to other processes on a shared core).

Usage::

    python benchmarks/bench_sgmcmc_chains_start.py [--chains 8] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import torch
from pyro.infer import MCMC

from pyro_sdebnn.data import two_moons
from pyro_sdebnn.infer.mcmc import BayesianMLP, SGLD


def _run(x, y, chains: int, together: bool) -> tuple[float, float]:
    pyro.set_rng_seed(0)
    kernel = SGLD(BayesianMLP([2, 50, 50, 1], likelihood="bernoulli"), num_steps=10, subsample_size=32,
                  vectorized_chains=chains)
    if not together:
        kernel._chains_gradient = lambda *args: None  # chain by chain
    mcmc = MCMC(kernel, num_samples=50, warmup_steps=50, disable_progbar=True)
    start, cpu = time.perf_counter(), time.process_time()
    mcmc.run(x, y)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert kernel.map_steps_taken == 100 and kernel.backend_used == "fx"
    return seconds, cpu


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = two_moons(n_train=200, n_test=10, noise=0.2, seed=0)
    x, y = data.x_train, data.y_train.float()
    for together in (True, False):
        _run(x, y, args.chains, together)
    ratios, cpu_ratios = [], []
    for i in range(args.repeats):
        times = {}
        for together in ((True, False) if i % 2 == 0 else (False, True)):
            times[together] = _run(x, y, args.chains, together)
        ratios.append(times[False][0] / times[True][0])
        cpu_ratios.append(times[False][1] / times[True][1])
        print(f"together {times[True][0]:.2f} s (CPU {times[True][1]:.2f} s), chain by chain {times[False][0]:.2f} s "
              f"(CPU {times[False][1]:.2f} s), ratio {ratios[-1]:.3f} (CPU {cpu_ratios[-1]:.3f})", flush=True)
    out = {"chains": args.chains, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
           "ratio_max": max(ratios), "cpu_ratio_median": statistics.median(cpu_ratios),
           "cpu_ratio_min": min(cpu_ratios), "cpu_ratio_max": max(cpu_ratios)}
    print(out)
    return out


if __name__ == "__main__":
    import warnings

    from pyro_sdebnn.infer.mcmc.diagnostics import SamplerWarning

    warnings.simplefilter("ignore", SamplerWarning)  # a 50-draw run has not mixed: not what is measured here
    main()
