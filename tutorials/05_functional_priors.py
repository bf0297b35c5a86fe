# SPDX-License-Identifier: Apache-2.0
"""Tutorial 5 -- Functional priors: fSGLD on the 1-D gap toy with an RBF and an NNGP Gaussian-process prior.

Run it as a script::

    python tutorials/05_functional_priors.py --output outputs/tutorial_05     # a few minutes
    python tutorials/05_functional_priors.py --quick --output /tmp/t05         # the CI smoke run

What you learn:

1. a prior over *functions* instead of weights: fSGLD (``pyro_sdebnn.infer.mcmc.FSGLD``) keeps the network and the
   likelihood of an ordinary Pyro model but replaces the weight prior by a GP prior on the network's outputs at
   measurement points (training inputs + uniform points in a widened box, redrawn every step);
2. the model only has to record its outputs in ``pyro.deterministic("f", ...)``; the kernel reads them at the
   measurement points by running ``model(X_M)``;
3. the GP kernel is fitted by its marginal likelihood (``fit_gp_kernel``) and then frozen; an RBF kernel and the
   NNGP kernel of an infinitely wide erf network (``pyro_sdebnn.kernels.NNGP``) give different extrapolations;
4. weight-space SGLD with an isotropic N(0, 1) prior puts arbitrary wiggles in the gap between the two data
   clusters; the functional prior makes the gap behave like the GP.
"""

# %% [markdown]
# ## Setup
from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib
import pyro
import pyro.contrib.gp as gp
import torch
from pyro.infer import MCMC

from pyro_sdebnn.data import gap_regression_1d
from pyro_sdebnn.distributions import fit_gp_kernel
from pyro_sdebnn.infer.mcmc import BayesianMLP, FSGLD, SGLD
from pyro_sdebnn.infer.mcmc.arviz import posterior_prediction
from pyro_sdebnn.infer.mcmc.functional import MeasurementPoints
from pyro_sdebnn.kernels import NNGP
from pyro_sdebnn.metrics import interval_coverage

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budget (CI smoke run)")
    parser.add_argument("--output", type=Path, default=Path("outputs/tutorial_05"), help="folder for the figures")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    pyro.set_rng_seed(args.seed)
    warmup, samples, thin, fit_steps = (5, 10, 10, 20) if args.quick else (20, 80, 100, 300)

    # %% [markdown]
    # ## Data and model
    # 20 points of y = x^3 + N(0, 3^2) on [-4, -1] ∪ [1, 4], targets standardised; a 1-50-50-1 tanh network with the
    # known noise scale.
    data = gap_regression_1d(n_train=20, n_test=200, seed=args.seed, standardize=True)
    x, y = data.x_train, data.y_train
    noise = 3.0 / data.y_scale

    # %% [markdown]
    # ## Two GP priors, fitted on the data and frozen
    rbf = fit_gp_kernel(gp.kernels.RBF(1), x, y, num_steps=fit_steps)
    # erf has a closed-form NNGP kernel (tanh needs a 2-D quadrature: ~1 s per 80x80 kernel matrix)
    nngp = fit_gp_kernel(NNGP(depth=2, weight_variance=1.0, bias_variance=0.1, activation="erf"), x, y,
                         num_steps=fit_steps)
    print(f"RBF: variance {float(rbf.variance):.2f}, lengthscale {float(rbf.lengthscale):.2f}")

    # %% [markdown]
    # ## Sampling
    # Measurement points: 40 training inputs (all 20 here) + 40 uniform points on the data range widened by 50 %
    # on each side, redrawn at every step. The functional potential is stiff (the prior term scales like
    # |J|^2 / jitter), hence the small step size; every chain starts from a MAP fit (``map_steps``).
    runs = {
        "SGLD, N(0,1) weights": lambda m: SGLD(m, step_size=1e-5, num_steps=thin, map_steps=300, map_lr=1e-2),
        "fSGLD, RBF prior": lambda m: FSGLD(m, gp_prior=rbf, measurement_points=MeasurementPoints(x, 40, 40),
                                            step_size=1e-5, num_steps=thin, map_steps=300, map_lr=1e-2),
        "fSGLD, NNGP prior": lambda m: FSGLD(m, gp_prior=nngp, measurement_points=MeasurementPoints(x, 40, 40),
                                             step_size=1e-5, num_steps=thin, map_steps=300, map_lr=1e-2),
    }
    xt = data.x_test[:, 0]
    gap, far = xt.abs() < 1, xt.abs() > 4
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.6), sharey=True)
    for ax, (name, make_kernel) in zip(axes, runs.items()):
        pyro.set_rng_seed(args.seed)
        model = BayesianMLP([1, 50, 50, 1], noise_scale=noise)
        mcmc = MCMC(make_kernel(model), num_samples=samples, warmup_steps=warmup, disable_progbar=args.quick)
        start = time.perf_counter()
        mcmc.run(x, y)
        pred = posterior_prediction(model, mcmc.get_samples(), data.x_test)
        sd = pred.variance.sqrt() * data.y_scale
        cover = float(interval_coverage(pred.loc[:, gap], pred.scale[:, gap], data.y_test[gap]))
        print(f"{name:<22s} {time.perf_counter() - start:5.1f} s | predictive sd in the gap {sd[gap].mean():6.1f}, "
              f"beyond |x| > 4 {sd[far].mean():6.1f} | 95% coverage in the gap {cover:.2f}")
        mean = pred.mean * data.y_scale + data.y_loc
        ax.fill_between(xt, mean - 2 * sd, mean + 2 * sd, alpha=0.3)
        ax.plot(xt, mean, lw=1.5)
        ax.plot(xt, xt**3, "k--", lw=1)
        ax.scatter(x[:, 0], y * data.y_scale + data.y_loc, s=10, c="k", zorder=3)
        ax.set_ylim(-250, 250)
        ax.set_title(name, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output / "functional_priors.png", dpi=90)
    plt.close(fig)
    print(f"\nfigures written to {args.output}")


if __name__ == "__main__":
    main()
