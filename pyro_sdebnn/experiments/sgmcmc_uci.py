# SPDX-License-Identifier: Apache-2.0
"""UCI Boston with a 2-hidden-layer MLP: RMSE and test log-likelihood of SGLD, SGHMC, fSGLD and fSGHMC.

fSGLD and fSGHMC ([1], :class:`~pyro_sdebnn.infer.mcmc.FSGLD`, :class:`~pyro_sdebnn.infer.mcmc.FSGHMC`) run the
SGLD [2] and SGHMC [3] updates on a potential whose prior term is a Gaussian process evaluated at the network
outputs on measurement points, instead of a weight prior (the potential is written out in
:mod:`pyro_sdebnn.experiments.fsgmcmc_gap`).

Protocol (after Wu et al. [1], Sec. 5.2): 10 random 90/10 splits of :func:`pyro_sdebnn.data.uci_boston` (Boston
housing, Harrison & Rubinfeld [4]; standardised on the training split), a 13-50-50-1 tanh
:class:`~pyro_sdebnn.infer.mcmc.BayesianMLP` (fan-in scaled N(0, 1/fan_in) weight priors) with a sampled noise scale
(``sigma ~ LogNormal(-1, 1)``), minibatches of 32, 500 burn-in iterations, then 15 samples every 50 iterations,
every chain warm-started by 500 Adam steps; step sizes 1e-5 (SGLD, fSGLD) and 1e-3 (SGHMC, fSGHMC, friction 10).
SGLD/SGHMC keep the weight priors; fSGLD/fSGHMC drop them and use a
GP prior (RBF kernel with one lengthscale per feature, fitted by the exact marginal likelihood on the training
split) at fixed measurement points: all training inputs plus 40 box points ([1] uses all training inputs when
N < 1000), so the Cholesky factor is computed once. The prior of ``sigma`` is kept.

Reported: mean ± standard error over splits of the test RMSE and test log-likelihood (original units, thousands
of dollars), and the wall time per split. Compare the four methods with each other on the same splits (the
numbers in the tables of [1] are not reproduced here). ``--quick``: 2 splits, 100 burn-in iterations, 5 samples
every 10. Outputs: ``sgmcmc_uci.md`` / ``.csv`` (summary), ``sgmcmc_uci_splits.csv``.

**References**

1. M. Wu, J. Xuan, J. Lu (2024). Functional Stochastic Gradient MCMC for Bayesian Neural Networks.
   arXiv:2409.16632.
2. Max Welling, Yee Whye Teh (2011). Bayesian Learning via Stochastic Gradient Langevin Dynamics. ICML 2011.
3. Tianqi Chen, Emily B. Fox, Carlos Guestrin (2014). Stochastic Gradient Hamiltonian Monte Carlo. ICML 2014.
4. D. Harrison, D. L. Rubinfeld (1978). Hedonic Housing Prices and the Demand for Clean Air.
   Journal of Environmental Economics and Management 5(1).
"""

from __future__ import annotations

import argparse

import pyro.contrib.gp as gp
import torch
from pyro.infer import MCMC
from tqdm.auto import tqdm

from pyro_sdebnn.data import uci_boston
from pyro_sdebnn.data.uci import NUM_UCI_SPLITS
from pyro_sdebnn.distributions import fit_gp_kernel
from pyro_sdebnn.experiments import REGISTRY
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.experiments import _harness as common
from pyro_sdebnn.infer.mcmc import BayesianMLP, FSGHMC, FSGLD, SGHMC, SGLD
from pyro_sdebnn.infer.mcmc.arviz import posterior_prediction
from pyro_sdebnn.infer.mcmc.functional import MeasurementPoints

NAME = "sgmcmc-uci"
#: What ``--quick`` does (shown by ``--help``).
QUICK = "2 splits, 100 burn-in iterations, 5 samples every 10"
DESCRIPTION = REGISTRY[NAME].description  # the one line of --help

__all__ = ["DESCRIPTION", "METHODS", "NAME", "add_arguments", "run"]

METHODS = ("SGLD", "SGHMC", "fSGLD", "fSGHMC")
STEP_SIZES = {"SGLD": 1e-5, "SGHMC": 1e-3, "fSGLD": 1e-5, "fSGHMC": 1e-3}
FRICTION = 10.0
BATCH = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:

    parser.add_argument("--splits", type=check.int_range(1, NUM_UCI_SPLITS), default=None,
                        help=f"number of splits, 1 to {NUM_UCI_SPLITS} (default 10; --quick: 2)")
    parser.add_argument("--methods", nargs="+", action=check.Distinct, default=list(METHODS), choices=METHODS)
    parser.add_argument("--backend", default="auto", choices=("auto", "eager", "fx", "compile"))


def _kernel(method, model, gp_kernel, x, thin, backend):
    common = dict(step_size=STEP_SIZES[method], num_steps=thin, subsample_size=BATCH, map_steps=500, map_lr=1e-2,
                  backend=backend)
    if method == "SGLD":
        return SGLD(model, **common)
    if method == "SGHMC":
        return SGHMC(model, friction=FRICTION, **common)
    points = MeasurementPoints(x, x.shape[0], 40, margin=0.1, redraw=False)
    functional = dict(gp_prior=gp_kernel, measurement_points=points, prior_sites=("sigma",))
    if method == "fSGLD":
        return FSGLD(model, **functional, **common)
    return FSGHMC(model, friction=FRICTION, **functional, **common)


def run(args: argparse.Namespace) -> dict:
    num_splits = args.splits if args.splits is not None else (2 if args.quick else 10)
    if not 1 <= num_splits <= NUM_UCI_SPLITS:
        raise ValueError(f"--splits must be in [1, {NUM_UCI_SPLITS}], got {num_splits}")
    warmup, samples, thin = (100, 5, 10) if args.quick else (500, 15, 50)
    device = torch.device(args.device)
    per_split: list[dict] = []
    try:
        with common.cpu_threads(1):  # small network: intra-op threads only add synchronisation on a shared CPU
            for k in tqdm(range(num_splits), desc="sgmcmc-uci splits"):
                split = uci_boston(split=k)
                x, y = split.x_train.to(device), split.y_train.to(device)
                gp_kernel = None
                if any(m.startswith("f") for m in args.methods):
                    kernel = gp.kernels.RBF(x.shape[1], lengthscale=torch.ones(x.shape[1]))
                    gp_kernel = fit_gp_kernel(kernel, x.cpu(), y.cpu(), num_steps=100 if args.quick else 300).to(device)
                for method in args.methods:
                    common.fresh_start(args.seed + k)
                    model = BayesianMLP([x.shape[1], 50, 50, 1], noise_scale=None, fan_in_scaling=True)
                    with common.Timer() as timer:
                        mcmc = MCMC(_kernel(method, model, gp_kernel, x, thin, args.backend), num_samples=samples,
                                    warmup_steps=warmup // thin, disable_progbar=True)
                        mcmc.run(x, y)
                    pred = posterior_prediction(model, mcmc.get_samples(), split.x_test.to(device))
                    scores = common.regression_metrics(pred, split.y_test.to(device), split.y_scale)
                    per_split.append({"split": k, "method": method, "rmse": scores["rmse"],
                                      "test_ll": scores["test_ll"], "seconds": timer.seconds})
                    _write(args, per_split, num_splits)  # the tables so far, rewritten as each run finishes
    except KeyboardInterrupt:
        summary = _write(args, per_split, num_splits, interrupted=True) if per_split else {}
        raise common.Interrupted(summary, f"{len(per_split)} of {num_splits * len(args.methods)} (split, method) "
                                          "runs finished") from None
    return _write(args, per_split, num_splits)


def _write(args: argparse.Namespace, per_split: list[dict], num_splits: int, interrupted: bool = False) -> dict:
    """``sgmcmc_uci_splits.csv`` (every run so far) and the summary ``sgmcmc_uci.md`` / ``.csv``; the summary."""
    out = args.output
    common.write_csv(out / "sgmcmc_uci_splits.csv", per_split)
    summary: dict[str, dict[str, tuple[float, float]]] = {}
    splits: dict[str, int] = {}
    for method in args.methods:
        rows = [r for r in per_split if r["method"] == method]
        if rows:
            summary[method] = {key: common.mean_se([r[key] for r in rows]) for key in ("rmse", "test_ll", "seconds")}
            splits[method] = len(rows)
    common.write_csv(out / "sgmcmc_uci.csv", [
        {"method": method, "splits": splits[method], "rmse_mean": s["rmse"][0], "rmse_se": s["rmse"][1],
         "test_ll_mean": s["test_ll"][0], "test_ll_se": s["test_ll"][1], "seconds_mean": s["seconds"][0]}
        for method, s in summary.items()
    ])
    header = ("method", "splits", "test RMSE", "test log-likelihood", "seconds / split")
    cells = [[method, splits[method], f"{s['rmse'][0]:.2f} ± {s['rmse'][1]:.2f}",
              f"{s['test_ll'][0]:.2f} ± {s['test_ll'][1]:.2f}", f"{s['seconds'][0]:.1f}"]
             for method, s in summary.items()]
    done = "" if len(per_split) == num_splits * len(args.methods) else (
        " -- INTERRUPTED, the splits finished so far" if interrupted else " -- in progress, the splits finished so far")
    (out / "sgmcmc_uci.md").write_text(
        f"# sgmcmc-uci: Boston, {num_splits} splits ({'quick smoke test' if args.quick else 'full'}){done}\n\n"
        + common.markdown_table(header, cells))
    return {m: {"rmse": s["rmse"][0], "rmse_se": s["rmse"][1], "test_ll": s["test_ll"][0],
                "test_ll_se": s["test_ll"][1], "splits": splits[m]} for m, s in summary.items()}
