# SPDX-License-Identifier: Apache-2.0
"""Gradient variance of the three path-KL estimators on a problem with a known posterior ([1], Figs. 4, 10).

Problem: :class:`pyro_sdebnn.testing.OUEndpointProblem` -- an OU prior path (σ = 0.8, θ = 1, D = 1)
observed at t1 with Gaussian noise s = 0.3. Its exact posterior drift correction is
``OUEndpointDrift(alpha=1)``; the variational family is ``alpha * c*(w, t)`` with a scalar ``alpha``.
For each step size ``dt`` and each ``alpha`` (1 = the true posterior, 0.5 = half way from the prior),
the variance over ``--samples`` single-path estimates of d(-ELBO)/d alpha is reported for ``stl``,
``analytic`` and ``full_mc``. Expected: at alpha = 1 the ``stl`` variance goes to 0 as dt -> 0 (its
only remaining source is the time discretisation), while ``full_mc``'s does not -- the "sticking the landing"
property [2] of the path-space KL estimator of [1, 3].

Usage::

    python benchmarks/bench_sdebnn_gradvar.py [--samples 256] [--dts 0.1,0.05,0.02,0.01,0.005]
                                              [--output FILE] [--figure FILE.png]

**References**

[1] Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural Networks
    with Stochastic Differential Equations". Proceedings of AISTATS 2022, PMLR 151.

[2] Geoffrey Roeder, Yuhuai Wu, David Duvenaud (2017). "Sticking the Landing: Simple, Lower-Variance Gradient
    Estimators for Variational Inference". NeurIPS 2017.

[3] Xuechen Li, Ting-Kam Leonard Wong, Ricky T. Q. Chen, David Duvenaud (2020). "Scalable Gradients for
    Stochastic Differential Equations". AISTATS 2020.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.ops import euler_maruyama_kl
from pyro_sdebnn.ops.sde_solve import time_grid
from pyro_sdebnn.ops.sde_solve import brownian_increments
from pyro_sdebnn.testing import OUEndpointProblem

ESTIMATORS = ("stl", "analytic", "full_mc")


def gradient_variance(problem: OUEndpointProblem, alpha: float, dt: float, estimator: str, samples: int) -> float:
    times = time_grid(problem.t_span, dt, dtype=torch.float64)
    drift = problem.drift(alpha)
    torch.manual_seed(0)
    dB = brownian_increments(times, (samples, 1))
    sol = euler_maruyama_kl(problem.init, times, dB, problem.sigma, problem.theta, drift, estimator=estimator)
    loss = sol.kl - problem.log_likelihood(sol.path[:, -1])
    grads = torch.stack([torch.autograd.grad(li, drift.alpha, retain_graph=True)[0] for li in loss])
    return grads.var().item()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=check.int_range(2), default=256)
    parser.add_argument("--dts", default="0.1,0.05,0.02,0.01,0.005")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--figure", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    problem = OUEndpointProblem(torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64), 0.3, 0.8)
    dts = [float(d) for d in args.dts.split(",")]
    results = {}
    rows = ["| alpha | dt | " + " | ".join(f"var {e}" for e in ESTIMATORS) + " |", "|---|---|---|---|---|"]
    for alpha in (1.0, 0.5):
        for dt in dts:
            values = {e: gradient_variance(problem, alpha, dt, e, args.samples) for e in ESTIMATORS}
            results[(alpha, dt)] = values
            rows.append(f"| {alpha} | {dt} | " + " | ".join(f"{values[e]:.3g}" for e in ESTIMATORS) + " |")
            print(rows[-1], flush=True)
    table = (f"d(-ELBO)/d alpha variance over {args.samples} paths, OU endpoint problem (sigma 0.8, s 0.3)\n\n"
             + "\n".join(rows) + "\n")
    print(table)
    if args.output is not None:
        args.output.write_text(table)
    if args.figure is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
        for ax, alpha in zip(axes, (1.0, 0.5)):
            for e in ESTIMATORS:
                ax.loglog(dts, [results[(alpha, dt)][e] for dt in dts], marker="o", label=e)
            ax.set_title(f"alpha = {alpha}" + (" (true posterior)" if alpha == 1.0 else ""))
            ax.set_xlabel("dt")
        axes[0].set_ylabel("gradient variance")
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(args.figure, dpi=120)
        plt.close(fig)
    return {f"{a}-{d}": v for (a, d), v in results.items()}


if __name__ == "__main__":
    main()
