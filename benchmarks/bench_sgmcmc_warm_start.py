# SPDX-License-Identifier: Apache-2.0
"""One SGLD epoch with every default, set-up included, against a hand-written SGLD loop over the same loader.

``MCMC(SGLD(model, num_steps=len(loader)), num_samples=1, warmup_steps=0).run(loader)`` on a 784-400-400-10 tanh
MLP over a 10,000-image loader (batch 128, 79 steps), Pyro's validation left on: the time includes building the
potential and the automatic MAP warm start (bounded by one epoch and 10 % of the run's steps: 8 Adam steps here);
the default backend takes a run this short eagerly, untraced. The plain loop is ``plain_sgld_epoch`` of
``bench_scale.py``. The two are interleaved in every repeat, the first repeat (the first run in a fresh process)
included; the ratio of each repeat's times is reported (median, min-max). Target: <= 1.5.

``--chains K`` runs ``K`` vectorised chains (``SGLD(..., vectorized_chains=K)``; their warm start and eager steps
compute the chains' gradients together) against ``K`` hand-written loops, one after another.

Usage::

    python benchmarks/bench_sgmcmc_warm_start.py [--n 10000] [--repeats 5] [--threads 1] [--chains 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from pyro_sdebnn.experiments import _arg_types as check

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import _flat_loader, plain_sgld_epoch  # noqa: E402


def ours_epoch(loader, chains: int = 1) -> tuple[float, int]:
    from pyro.infer import MCMC

    from pyro_sdebnn.infer.mcmc import BayesianMLP, SGLD

    start = time.perf_counter()
    model = BayesianMLP([784, 400, 400, 10], likelihood="categorical", activation="tanh")
    kernel = SGLD(model, num_steps=len(loader), vectorized_chains=chains)  # every other setting a default
    MCMC(kernel, num_samples=1, warmup_steps=0, disable_progbar=True).run(loader)  # Pyro's validation on, as default
    return time.perf_counter() - start, kernel.map_steps_taken


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=check.positive_int, default=10_000)
    parser.add_argument("--repeats", type=check.positive_int, default=5)
    parser.add_argument("--threads", type=check.positive_int, default=1)
    parser.add_argument("--chains", type=check.positive_int, default=1,
                        help="vectorised chains (against as many plain loops)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    loader = _flat_loader(args.n)
    ratios, warm = [], None
    for _ in range(args.repeats):
        ours, warm = ours_epoch(loader, args.chains)
        plain = 0.0
        for _ in range(args.chains):
            plain_net = nn.Sequential(nn.Linear(784, 400), nn.Tanh(), nn.Linear(400, 400), nn.Tanh(),
                                      nn.Linear(400, 10))
            start = time.perf_counter()
            plain_sgld_epoch(plain_net, loader, 1e-3, torch.device("cpu"))
            plain += time.perf_counter() - start
        ratios.append(ours / plain)
        print(f"ours {ours:.2f} s, plain {plain:.2f} s, ratio {ours / plain:.3f}", flush=True)
    out = {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
           "warm_start_steps": warm, "steps_per_epoch": len(loader), "chains": args.chains}
    print(out)
    return out


if __name__ == "__main__":
    main()
