# SPDX-License-Identifier: Apache-2.0
"""End-to-end wall time of ``MCMC.run`` with the SG-MCMC backends ``fx``, ``compile`` and ``auto``.

SGLD on the 2-50-50-1 MLP (binary labels, N = 1000, batch 32, ``num_steps=10``) run by :class:`pyro.infer.MCMC`
for a short run (the settings of ``pyro-sdebnn benchmark two-moons``: 200 warm-up + 100 samples = 3000 inner steps)
and a long one (2000 + 2000 samples = 40000 inner steps). The time includes building the step (tracing; compiling for
``compile``, and for ``auto`` once it decides to). ``auto`` should be close to the better of the two fixed choices
in both runs. Compilation time depends on the inductor cache (warm after the first run on a machine); the script
compiles once before timing so that every compile uses a warm cache, which favours ``compile``.

Usage::

    python benchmarks/bench_sgmcmc_auto.py [--threads 1] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import torch
from pyro.infer import MCMC

from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer.mcmc import BayesianMLP, SGLD


def _run(backend, x, y, warmup, samples):
    kernel = SGLD(BayesianMLP([2, 50, 50, 1], likelihood="bernoulli"), step_size=1e-4, num_steps=10,
                  subsample_size=32, backend=backend)
    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=warmup, disable_progbar=True)
    t0 = time.perf_counter()
    mcmc.run(x, y)
    return time.perf_counter() - t0, kernel.backend_used


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=check.positive_int, default=1)
    parser.add_argument("--repeats", type=check.positive_int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pyro.set_rng_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 2, generator=g)
    y = (x[:, 0] > 0).float()
    runs = [("short (200 + 100 samples x 10 steps)", 200, 100), ("long (2000 + 2000 samples x 10 steps)", 2000, 2000)]
    if args.quick:
        runs = [(name, w // 10, s // 10) for name, w, s in runs]
    _run("compile", x, y, 2, 2)  # warm the inductor cache
    print("| run | backend | wall s (median) | min-max | backend used at the end |")
    print("|---|---|---|---|---|")
    for name, warmup, samples in runs:
        times = {b: [] for b in ("fx", "compile", "auto")}
        used = {}
        for _ in range(args.repeats):
            for backend in times:
                seconds, used[backend] = _run(backend, x, y, warmup, samples)
                times[backend].append(seconds)
        for backend, ts in times.items():
            spread = f"{min(ts):.2f}-{max(ts):.2f}"
            print(f"| {name} | {backend} | {statistics.median(ts):.2f} | {spread} | {used[backend]} |")


if __name__ == "__main__":
    main()
