# SPDX-License-Identifier: Apache-2.0
"""The 1-D gap toy (after Wu et al. [1], Sec. 5.1): SGLD, SGHMC, fSGLD, fSGHMC predictive bands and coverage.

fSGLD and fSGHMC ([1]) run the SGLD [2] and SGHMC [3] updates on a potential whose prior term is a
Gaussian process :math:`\\mathcal{GP}(m, k)` evaluated at the network outputs :math:`f_M = f(X_M; w)` on
measurement points :math:`X_M`, instead of a weight prior:

.. math::

    \\tilde U(w) = \\frac{N}{n} \\sum_{i \\in B} -\\log p(y_i \\mid f(x_i; w))
    + \\tfrac12 (f_M - m_M)^\\top \\big(k(X_M, X_M) + \\delta I\\big)^{-1} (f_M - m_M),

with :math:`B` a minibatch of size :math:`n` and :math:`\\delta` a small jitter.

Data: :func:`pyro_sdebnn.data.gap_regression_1d` (20 points, ``y = x^3 + N(0, 3^2)``, ``x ~ U[-4,-1] ∪ U[1,4]``,
targets standardised, test grid on [-6, 6]). Model: :class:`~pyro_sdebnn.infer.mcmc.BayesianMLP` 1-50-50-1 (tanh)
with the known noise scale 3 (in standardised units) and N(0, 1) weight priors for SGLD/SGHMC; fSGLD/fSGHMC drop
the weight prior and use a GP prior with an RBF kernel fitted by the exact marginal likelihood
(:func:`pyro_sdebnn.distributions.fit_gp_kernel`) at 40 training + 40 box measurement points redrawn every step.
Schedule as in [1], Sec. 5.1: 2000 burn-in iterations, then 8000 iterations keeping every 100th (80 samples);
here with full-batch gradients and all chains warm-started by 500 Adam steps on their own potential.
``--quick``: 200 burn-in, 40 samples every 20 iterations (a smoke test, not a result).

Reported per method: predictive standard deviation and 95 % interval coverage in three regions of the test grid
(the training range ``1 <= |x| <= 4``, the gap ``|x| < 1``, extrapolation ``|x| > 4``), RMSE and test
log-likelihood on the training range (original units), wall time. Outputs: ``fsgmcmc_gap.png`` (predictive
bands), ``fsgmcmc_gap.md`` / ``.csv``.

**References**

1. M. Wu, J. Xuan, J. Lu (2024). Functional Stochastic Gradient MCMC for Bayesian Neural Networks.
   arXiv:2409.16632.
2. Max Welling, Yee Whye Teh (2011). Bayesian Learning via Stochastic Gradient Langevin Dynamics. ICML 2011.
3. Tianqi Chen, Emily B. Fox, Carlos Guestrin (2014). Stochastic Gradient Hamiltonian Monte Carlo. ICML 2014.
"""

from __future__ import annotations

import argparse

import pyro
import pyro.contrib.gp as gp
import torch
from pyro.infer import MCMC
from tqdm.auto import tqdm

from pyro_sdebnn.data import gap_regression_1d
from pyro_sdebnn.distributions import fit_gp_kernel
from pyro_sdebnn.experiments import REGISTRY
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.experiments import _harness as common
from pyro_sdebnn.infer import RegressionPrediction
from pyro_sdebnn.infer.mcmc import BayesianMLP, FSGHMC, FSGLD, SGHMC, SGLD
from pyro_sdebnn.infer.mcmc.arviz import posterior_prediction
from pyro_sdebnn.infer.mcmc.functional import MeasurementPoints
from pyro_sdebnn.metrics import interval_coverage

NAME = "fsgmcmc-gap"
#: What ``--quick`` does (shown by ``--help``).
QUICK = "200 burn-in iterations, 40 samples every 20 (a smoke test, not a result)"
DESCRIPTION = REGISTRY[NAME].description  # the one line of --help

__all__ = ["DESCRIPTION", "METHODS", "NAME", "add_arguments", "run"]

METHODS = ("SGLD", "SGHMC", "fSGLD", "fSGHMC")
STEP_SIZES = {"SGLD": 1e-5, "SGHMC": 1e-4, "fSGLD": 1e-5, "fSGHMC": 1e-4}  # largest stable steps, full batch
FRICTION = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--methods", nargs="+", action=check.Distinct, default=list(METHODS), choices=METHODS)
    parser.add_argument("--n-train", type=check.int_range(2), default=20, help="training points, >= 2 (default 20)")
    parser.add_argument("--backend", default="auto", choices=("auto", "eager", "fx", "compile"))


def _kernel(method, model, gp_kernel, x, steps, backend):
    common = dict(step_size=STEP_SIZES[method], num_steps=steps, map_steps=500, map_lr=1e-2, backend=backend)
    if method == "SGLD":
        return SGLD(model, **common)
    if method == "SGHMC":
        return SGHMC(model, friction=FRICTION, **common)
    points = MeasurementPoints(x, 40, 40, margin=0.5)
    if method == "fSGLD":
        return FSGLD(model, gp_prior=gp_kernel, measurement_points=points, **common)
    return FSGHMC(model, gp_prior=gp_kernel, measurement_points=points, friction=FRICTION, **common)


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    pyro.set_rng_seed(args.seed)
    split = gap_regression_1d(args.n_train, 200, args.seed, standardize=True)
    x, y = split.x_train.to(device), split.y_train.to(device)
    x_test, y_test = split.x_test.to(device), split.y_test.to(device)
    noise = 3.0 / split.y_scale
    warmup, samples, thin = (200, 40, 20) if args.quick else (2000, 80, 100)
    xt = x_test[:, 0]
    regions = {"train": (xt.abs() >= 1) & (xt.abs() <= 4), "gap": xt.abs() < 1, "extrapolation": xt.abs() > 4}
    rows: list[dict] = []
    predictions: dict = {}
    try:
        with common.cpu_threads(1):  # tiny network: intra-op threads only add synchronisation
            gp_kernel = fit_gp_kernel(gp.kernels.RBF(1), x.cpu(), y.cpu(), num_steps=300).to(device)
            for method in tqdm(args.methods, desc="fsgmcmc-gap"):
                common.fresh_start(args.seed)
                model = BayesianMLP([1, 50, 50, 1], noise_scale=noise)
                kernel = _kernel(method, model, gp_kernel, x, thin, args.backend)
                with common.Timer() as timer:
                    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=warmup // thin, disable_progbar=True)
                    mcmc.run(x, y)
                pred = posterior_prediction(model, mcmc.get_samples(), x_test)
                if not isinstance(pred, RegressionPrediction):  # the Gaussian likelihood of BayesianMLP
                    raise TypeError(f"expected a RegressionPrediction, got {type(pred).__name__}")
                row = {"method": method, "seconds": timer.seconds,
                       "divergences": len(mcmc.diagnostics()["divergences"]["chain 0"])}
                for region, mask in regions.items():
                    row[f"std_{region}"] = float(pred.variance[mask].sqrt().mean() * split.y_scale)
                    row[f"coverage95_{region}"] = float(interval_coverage(pred.loc[:, mask], pred.scale[:, mask],
                                                                          y_test[mask]))
                train_range = common.regression_metrics(pred, y_test, split.y_scale, mask=regions["train"])
                row["rmse_train_range"], row["test_ll_train_range"] = train_range["rmse"], train_range["test_ll"]
                rows.append(row)
                predictions[method] = pred
                _write(args, rows, predictions, split, x, y, x_test)  # the table and figure so far
    except KeyboardInterrupt:  # the files again: Ctrl-C may have come while they were being written
        if rows:
            _write(args, rows, predictions, split, x, y, x_test)
        raise common.Interrupted(_summary(rows), f"{len(rows)} of {len(args.methods)} methods finished") from None
    return _summary(rows)


def _summary(rows: list[dict]) -> dict:
    return {row["method"]: {k: v for k, v in row.items() if k != "method"} for row in rows}


def _write(args, rows: list[dict], predictions: dict, split, x, y, x_test) -> None:
    """``fsgmcmc_gap.png`` (a panel per finished method), ``fsgmcmc_gap.md`` / ``.csv``."""
    xt = x_test[:, 0]
    fig = common.figure(figsize=(4 * len(rows), 3.5))
    axes = fig.subplots(1, len(rows), sharey=True, squeeze=False)[0]
    to_orig = lambda t: (t * split.y_scale + split.y_loc).cpu()  # noqa: E731
    for ax, row in zip(axes, rows):
        pred = predictions[row["method"]]
        mean, std = to_orig(pred.mean), pred.variance.sqrt().cpu() * split.y_scale
        ax.fill_between(xt.cpu(), mean - 2 * std, mean + 2 * std, alpha=0.3, label="±2 sd")
        ax.plot(xt.cpu(), mean, lw=1.5, label="predictive mean")
        ax.plot(xt.cpu(), xt.cpu() ** 3, "k--", lw=1, label="x³")
        ax.scatter(x[:, 0].cpu(), to_orig(y), s=12, c="k", zorder=3)
        ax.set(title=f"{row['method']}  (gap cov. {row['coverage95_gap']:.2f})", ylim=(-250, 250), xlabel="x")
    axes[0].legend(loc="upper left", fontsize=7)
    common.save_figure(fig, args.output / "fsgmcmc_gap.png", dpi=120)
    common.write_csv(args.output / "fsgmcmc_gap.csv", rows)
    cells = [[f"{v:.3g}" if isinstance(v, float) else v for v in row.values()] for row in rows]
    (args.output / "fsgmcmc_gap.md").write_text(
        f"# fsgmcmc-gap ({'quick smoke test' if args.quick else 'full schedule'}, seed {args.seed})\n\n"
        + common.markdown_table(list(rows[0]), cells))
