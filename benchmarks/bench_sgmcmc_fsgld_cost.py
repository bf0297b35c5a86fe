# SPDX-License-Identifier: Apache-2.0
"""Step cost of fSGLD relative to SGLD at M = 80 measurement points (40 training inputs + 40 box points).

Same network (1-50-50-1 regression MLP, :class:`~pyro_sdebnn.infer.mcmc.BayesianMLP`), same minibatch (32 of 200
points of the 1-D gap toy), same backend; fSGLD redraws the measurement points at every step (the default: sets drawn
and factorised 64 at a time in one batched call, each step then applying its set's Cholesky factor with two
triangular solves), every 10 steps (``redraw_every=10``), or keeps them fixed (precision matrix computed once). A row
"SGLD, batch 112" times SGLD on 32 + 80 inputs: the cost of the network pass that every fSGLD step makes, without any
GP term. Reported: median and spread (min-max) of the per-step wall-time ratio over ``--repeats`` repeats, and the
median ratio of process CPU time; within a repeat the kernels take turns in rounds of one ``sample`` call each, so that
a change in the load of a shared machine falls on all of them alike. The project's target: <= 1.6x.

Usage::

    python benchmarks/bench_sgmcmc_fsgld_cost.py [--quick] [--backends fx compile] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import pyro.contrib.gp as gp
import torch

from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer.mcmc import BayesianMLP, FSGLD, SGLD
from pyro_sdebnn.infer.mcmc.functional import MeasurementPoints


def _stepper(kernel, x, y):
    with pyro.validation_enabled(False):
        kernel.setup(0, x, y)
    state = {"params": kernel.initial_params}

    def step():
        state["params"] = kernel.sample(state["params"])

    return step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=check.positive_int, default=1)
    parser.add_argument("--repeats", type=check.positive_int, default=5)
    parser.add_argument("--backends", nargs="+", default=["fx", "compile"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pyro.set_rng_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(100, generator=g) * 3 - 4, torch.rand(100, generator=g) * 3 + 1]).unsqueeze(-1)
    y = (x[:, 0] ** 3 + 3 * torch.randn(200, generator=g)) / 20
    num_steps, calls = 10, (5 if args.quick else 50)
    rows = []
    # timing only: every chain starts at a prior draw (map_steps=0) and steps at 1e-6; at 1e-5 the divergence check
    # (the potential rising far above its running level) stops fSGLD on this problem within a few hundred steps
    for backend in args.backends:
        steppers = {}
        model = BayesianMLP([1, 50, 50, 1], noise_scale=0.2)
        steppers["SGLD"] = _stepper(
            SGLD(model, step_size=1e-6, num_steps=num_steps, subsample_size=32, backend=backend, map_steps=0), x, y)
        # the network alone on 32 + 80 inputs: the floor of any fSGLD step that evaluates f on [x_B; X_M]
        steppers["SGLD, batch 112 = 32 + 80 (network floor)"] = _stepper(
            SGLD(model, step_size=1e-6, num_steps=num_steps, subsample_size=112, backend=backend, map_steps=0),
            x, y)
        for label, redraw, every in (
            ("redrawn every step", True, 1),
            ("redrawn every 10 steps", True, 10),
            ("fixed", False, 1),
        ):
            points = MeasurementPoints(x, 40, 40, redraw=redraw, redraw_every=every)
            kernel = FSGLD(model, gp_prior=gp.kernels.RBF(1), measurement_points=points, step_size=1e-6,
                           num_steps=num_steps, subsample_size=32, backend=backend, map_steps=0)
            steppers[f"fSGLD (X_M {label})"] = _stepper(kernel, x, y)
        for step in steppers.values():  # warm-up past the first batches of sets (compilation happens there)
            for _ in range(20):
                step()
        times = {k: [] for k in steppers}
        cpu = {k: [] for k in steppers}
        for _ in range(args.repeats):
            wall_total, cpu_total = dict.fromkeys(steppers, 0.0), dict.fromkeys(steppers, 0.0)
            for _ in range(calls):  # the kernels take turns, one sample call each
                for k, step in steppers.items():
                    t0, c0 = time.perf_counter(), time.process_time()
                    step()
                    wall_total[k] += time.perf_counter() - t0
                    cpu_total[k] += time.process_time() - c0
            for k in steppers:
                times[k].append(wall_total[k] / (calls * num_steps))
                cpu[k].append(cpu_total[k] / (calls * num_steps))
        for k, ts in times.items():
            ratios = [t / s for t, s in zip(ts, times["SGLD"])]
            cpu_ratio = statistics.median([c / s for c, s in zip(cpu[k], cpu["SGLD"])])
            rows.append((backend, k, 1e3 * statistics.median(ts), statistics.median(ratios), min(ratios), max(ratios),
                         cpu_ratio))
    print("| backend | kernel | ms/step (median) | ratio vs SGLD (median) | ratio min-max | CPU-time ratio |")
    print("|---|---|---|---|---|---|")
    for backend, k, ms, med, lo, hi, cpu_ratio in rows:
        print(f"| {backend} | {k} | {ms:.3f} | {med:.2f} | {lo:.2f}-{hi:.2f} | {cpu_ratio:.2f} |")


if __name__ == "__main__":
    main()
