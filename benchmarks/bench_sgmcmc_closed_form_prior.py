# SPDX-License-Identifier: Apache-2.0
"""What the closed-form gradient of fixed Normal priors buys an SG-MCMC step: SGLD with and without it.

Two SGLD kernels on a 2-50-50-1 tanh MLP (:class:`~pyro_sdebnn.infer.mcmc.BayesianMLP`, binary labels, 1,000
points, batch 32, step 1e-4, ``backend="fx"``, 10 inner steps per ``kernel.sample``), one with the kernel's default
``closed_form_prior=True`` (the prior term of the gradient added in closed form) and one with
``closed_form_prior=False`` (the prior's log-density traced and differentiated with the rest of the model). After a
warm-up of 13 samples each, the two are timed in alternating order, ``--repeats`` repeats of 500 inner steps; the
median and the (min, max) of the per-repeat ratio without / with are printed, with the number of nodes of each
traced step graph. The device stays in the library only if the ratio is at least 1.2.

Usage::

    python benchmarks/bench_sgmcmc_closed_form_prior.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import torch

from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer.mcmc import SGLD, BayesianMLP

SIZES, BATCH, N, ETA = [2, 50, 50, 1], 32, 1000, 1e-4


def _stepper(x, y, closed_form_prior: bool):
    model = BayesianMLP(SIZES, likelihood="bernoulli", activation="tanh")
    kernel = SGLD(model, step_size=ETA, num_steps=10, subsample_size=BATCH, backend="fx",
                  closed_form_prior=closed_form_prior)
    with pyro.validation_enabled(False):
        kernel.setup(0, x, y)
    state = {"params": kernel.initial_params}

    def sample():
        state["params"] = kernel.sample(state["params"])

    return sample, kernel


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=check.positive_int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, SIZES[0], generator=gen)
    y = (x.sum(-1) > 0).float()
    steppers = {"without": _stepper(x, y, False), "with": _stepper(x, y, True)}
    for sample, _ in steppers.values():
        for _ in range(13):
            sample()
    nodes = {name: len(list(kernel._graph_module.graph.nodes)) for name, (_, kernel) in steppers.items()}
    ratios, per_step = [], {name: [] for name in steppers}
    for repeat in range(args.repeats):
        times = {}
        for name in ("without", "with") if repeat % 2 == 0 else ("with", "without"):
            sample = steppers[name][0]
            start = time.perf_counter()
            for _ in range(50):
                sample()
            times[name] = (time.perf_counter() - start) / 500
            per_step[name].append(times[name])
        ratios.append(times["without"] / times["with"])
    result = {"ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "nodes": nodes,
              "us_per_step": {name: 1e6 * statistics.median(v) for name, v in per_step.items()}}
    print(f"without / with closed-form prior: {result['ratio']:.2f} ({result['min']:.2f}-{result['max']:.2f}); "
          f"{result['us_per_step']['without']:.1f} vs {result['us_per_step']['with']:.1f} us per inner step; "
          f"graph nodes {nodes['without']} vs {nodes['with']}")
    return result


if __name__ == "__main__":
    main()
