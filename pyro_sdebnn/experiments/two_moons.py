# SPDX-License-Identifier: Apache-2.0
"""The head-to-head calibration study on Two Moons: every method of the library.

Protocol: 200 training points of :func:`pyro_sdebnn.data.two_moons` (noise 0.2), 500 held-out test
points from another random state, and a validation set from a third random state for temperature
scaling. Each weight-space method trains a 2-50-50-2 ReLU network with sensible defaults (fSGLD
and fSGHMC a 2-50-50-1 network with a Bernoulli logit, so that one GP prior sits on that logit; the
SDE-BNN its continuous-depth network with a width-50 field) and predicts class probabilities on the
test set. Reported per method: accuracy, ECE (10 equal-width bins; Naeini et al. [2], Guo et al. [1]),
Brier score ([3]) and NLL of the predictive mean :math:`\\bar p = \\frac1S\\sum_s p_s`, the same after
temperature scaling, and the wall time of fitting plus predicting. With :math:`B_b` the test points whose
confidence :math:`\\max_c \\bar p_c` falls in bin :math:`b`,

.. math::

    \\mathrm{ECE} = \\sum_b \\frac{|B_b|}{N}\\,\\big|\\mathrm{acc}(B_b) - \\mathrm{conf}(B_b)\\big|, \\qquad
    \\mathrm{Brier} = \\frac1N \\sum_n \\sum_c (\\bar p_{nc} - \\mathbb 1[y_n = c])^2.

Temperature scaling (Guo et al. [1]) divides the predictive log-probabilities by
:math:`T` fitted on the validation set (:func:`pyro_sdebnn.metrics.fit_temperature`),
:math:`p_T \\propto \\bar p^{1/T}` -- for a single network exactly logit temperature scaling.

Outputs in ``--output``: the table ``two_moons_table.md`` / ``.csv`` (rewritten as each method finishes),
reliability diagrams (a panel per method family of ``FAMILIES``), predictive heat maps, the deep ensemble's
uncertainty decomposition, the SG-MCMC chain diagnostics in function space and a ``README.md`` describing the run
(every file is listed on the page :doc:`/choosing_a_method`). A method not available in this installation is listed
as "not implemented" with the reason, never dropped; after Ctrl-C the files hold the methods finished so far.

Methods are adapters in :data:`ADAPTERS`: a function ``(data, settings) -> predict`` that trains the
method and returns a function mapping inputs to a
:class:`~pyro_sdebnn.predictive.ClassificationPrediction`.

**References**

1. Chuan Guo, Geoff Pleiss, Yu Sun, Kilian Q. Weinberger (2017). On Calibration of Modern Neural Networks. ICML 2017.
2. M. P. Naeini, G. F. Cooper, M. Hauskrecht (2015). Obtaining Well Calibrated Probabilities Using Bayesian
   Binning. AAAI 2015.
3. Glenn W. Brier (1950). Verification of Forecasts Expressed in Terms of Probability. Monthly Weather Review 78(1).
"""

from __future__ import annotations

import argparse
import copy
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyro.contrib.gp as gp
import torch
from pyro.infer import MCMC, Predictive, SVI
from pyro.optim import PyroOptim
from torch import Tensor
from tqdm.auto import tqdm

from pyro_sdebnn.data import two_moons
from pyro_sdebnn.experiments import REGISTRY
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.experiments import _harness as common
from pyro_sdebnn.infer import (
    ClassificationPrediction, DeepEnsemble, Laplace, MAPEstimate, MCDropout, MeanFieldVI, NeuralSDEGuide,
    SamplingFreeBNN, TracePathKL_ELBO, train_svi,
)
from pyro_sdebnn.infer import mcmc as sgmcmc
from pyro_sdebnn.infer._svi_baseline import PyroBNN
from pyro_sdebnn.infer.mcmc.arviz import posterior_prediction
from pyro_sdebnn.nn import SDEBNN
from pyro_sdebnn.nn._mlp import make_mlp
from pyro_sdebnn.nn.mnvi import to_mnvi

NAME = "two-moons"
#: What ``--quick`` does (shown by ``--help``).
QUICK = ("16-16 hidden units, 30 epochs (15 for SVI), 10 predictive samples, 2 ensemble members, 20 + 10 SG-MCMC "
         "samples thinned by 2, a 25x25 grid")
DESCRIPTION = REGISTRY[NAME].description  # the one line of --help

__all__ = ["ADAPTERS", "DESCRIPTION", "NAME", "Settings", "add_arguments", "run"]


Predictor = Callable[[Tensor], "object"]


@dataclass
class Settings:
    """Training budget shared by the adapters (``quick`` shrinks everything for CI)."""

    hidden: tuple[int, ...] = (50, 50)
    epochs: int = 300
    svi_epochs: int = 300
    batch_size: int = 32
    svi_batch_size: int = 64
    lr: float = 1e-2
    weight_decay: float = 1e-4
    dropout: float = 0.1
    num_samples: int = 100
    num_members: int = 5
    mcmc_warmup: int = 200
    mcmc_samples: int = 100
    mcmc_thinning: int = 10
    grid_size: int = 80
    sde_epochs: int = 100
    sde_dt: float = 0.1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @classmethod
    def quick(cls, device: torch.device) -> "Settings":
        return cls(
            hidden=(16, 16), epochs=30, svi_epochs=15, batch_size=50, svi_batch_size=50, num_samples=10, num_members=2,
            mcmc_warmup=20, mcmc_samples=10, mcmc_thinning=2, grid_size=25, sde_epochs=5, sde_dt=0.25, device=device,
        )


@dataclass
class Data:
    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor


def _mlp(settings: Settings, dropout: float = 0.0):
    return make_mlp([2, *settings.hidden, 2], "relu", dropout=dropout, device=settings.device)


# --------------------------------------------------------------------------- adapters
#: ``{key: (display name, adapter)}`` in table order.
ADAPTERS: dict[str, tuple[str, Callable]] = {}


def _adapter(key: str, display: str):
    def decorator(fn):
        ADAPTERS[key] = (display, fn)
        return fn

    return decorator


@_adapter("map", "Point estimate (MAP, AutoDelta)")
def _map(data: Data, s: Settings) -> Predictor:
    fit = MAPEstimate(_mlp(s), "categorical").fit(
        data.x_train, data.y_train, num_epochs=s.svi_epochs, lr=s.lr, batch_size=s.svi_batch_size,
        weight_decay=s.weight_decay,
    )
    return fit.predict


def _laplace(structure: str, subset: str):
    def adapter(data: Data, s: Settings) -> Predictor:
        la = Laplace(_mlp(s), "categorical", subset=subset, hessian_structure=structure).fit(
            data.x_train, data.y_train, num_epochs=s.epochs, lr=s.lr, batch_size=s.batch_size,
            weight_decay=s.weight_decay,
        )
        return lambda x: la.predict(x, pred_type="glm", link_approx="mc", num_samples=s.num_samples)

    return adapter


_adapter("laplace", "Laplace (full GGN, linearised)")(_laplace("full", "all"))
_adapter("laplace-kron", "Laplace (KFAC, linearised)")(_laplace("kron", "all"))
_adapter("laplace-last-layer", "Laplace (last layer, full)")(_laplace("full", "last_layer"))


@_adapter("mc-dropout", "MC-dropout")
def _mc_dropout(data: Data, s: Settings) -> Predictor:
    fit = MCDropout(_mlp(s, s.dropout), "categorical", num_samples=s.num_samples).fit(
        data.x_train, data.y_train, num_epochs=s.epochs, lr=s.lr, batch_size=s.batch_size, weight_decay=s.weight_decay
    )
    return fit.predict


@_adapter("deep-ensemble", "Deep ensemble")
def _deep_ensemble(data: Data, s: Settings) -> Predictor:
    fit = DeepEnsemble(lambda: _mlp(s), "categorical", num_members=s.num_members).fit(
        data.x_train, data.y_train, num_epochs=s.epochs, lr=s.lr, batch_size=s.batch_size, weight_decay=s.weight_decay
    )
    return fit.predict


@_adapter("mfvi", "Mean-field VI (AutoNormal)")
def _mfvi(data: Data, s: Settings) -> Predictor:
    fit = MeanFieldVI(_mlp(s), "categorical", prior_scale=1.0).fit(
        data.x_train, data.y_train, num_epochs=s.svi_epochs, lr=s.lr, batch_size=s.svi_batch_size
    )
    return lambda x: fit.predict(x, num_samples=s.num_samples)


_NUM_PROBES = 4


def _sgmcmc(kernel_name: str):
    def adapter(data: Data, s: Settings) -> Predictor:
        model = PyroBNN(_mlp(s), "categorical", prior_scale=1.0)
        kernel_cls = getattr(sgmcmc, kernel_name)
        # SGLD (Welling & Teh 2011) with step 1e-3 / SGHMC (Chen, Fox & Guestrin 2014) with step 1e-2 and friction 1
        # (the kernels' defaults), batch 32, warm-up then thinned samples.
        kwargs = dict(step_size=1e-3, num_steps=s.mcmc_thinning, subsample_size=min(s.batch_size, len(data.x_train)))
        if kernel_name == "SGHMC":
            kwargs.update(step_size=1e-2, friction=1.0)
        kernel = kernel_cls(model, **kwargs)
        mcmc = MCMC(kernel, num_samples=s.mcmc_samples, warmup_steps=s.mcmc_warmup, disable_progbar=True)
        with common.Timer() as sampling:
            mcmc.run(data.x_train, data.y_train)
        samples = mcmc.get_samples()
        predict = _SampledPredictor(Predictive(model, posterior_samples=samples, return_sites=("outputs",)))
        # Function-space chain diagnostics (weight-space ESS is uninformative for networks): the class-1
        # probability at a few test inputs, per draw.
        predict.diagnostics = {
            "probe_probs": predict(data.x_test[:_NUM_PROBES]).probs[..., 1].detach(),
            "sampling_seconds": sampling.seconds,
        }
        return predict

    return adapter


class _SampledPredictor:
    """Class probabilities per posterior draw from a :class:`~pyro.infer.Predictive` of the ``"outputs"`` logits,
    with the chain ``diagnostics`` of the run that drew them (``None`` until set)."""

    def __init__(self, predictive) -> None:
        self.predictive = predictive
        self.diagnostics: dict | None = None

    def __call__(self, x: Tensor):
        outputs = self.predictive(x)["outputs"]
        return ClassificationPrediction(outputs.reshape(-1, *outputs.shape[-2:]).softmax(-1))


_adapter("sgld", "SGLD")(_sgmcmc("SGLD"))
_adapter("sghmc", "SGHMC")(_sgmcmc("SGHMC"))


def _functional_sgmcmc(kernel_name: str, step_size: float, friction: float = 0.1):
    def adapter(data: Data, s: Settings) -> Predictor:
        # One GP prior on the class-1 logit: RBF with logit standard deviation 2 and length scale 0.5 (the
        # width of a moon); measurement points = training inputs + uniform box points, redrawn every step.
        model = sgmcmc.BayesianMLP([2, *s.hidden, 1], likelihood="bernoulli", activation="relu").to(s.device)
        kernel_gp = gp.kernels.RBF(2, variance=torch.tensor(4.0), lengthscale=torch.tensor(0.5)).to(s.device)
        kwargs = dict(gp_prior=kernel_gp, step_size=step_size, num_steps=s.mcmc_thinning,
                      subsample_size=min(s.batch_size, len(data.x_train)))  # --n-train may be below the batch size
        if kernel_name == "FSGHMC":
            kwargs["friction"] = friction
        kernel = getattr(sgmcmc, kernel_name)(model, **kwargs)
        mcmc = MCMC(kernel, num_samples=s.mcmc_samples, warmup_steps=s.mcmc_warmup, disable_progbar=True)
        mcmc.run(data.x_train, data.y_train.to(data.x_train.dtype))
        samples = mcmc.get_samples()

        def predict(x: Tensor):  # Bernoulli likelihood site -> two-class probabilities per draw
            return posterior_prediction(model, samples, x)

        return predict

    return adapter


# Step sizes from a small search on this problem (seed 0, test accuracy): fSGLD diverged at 3e-4 and 1e-3, so
# 1e-4; fSGHMC with friction 0.1 reached 0.84 at 1e-4 and collapsed at 3e-4, while friction 10
# (eta * c = 0.01) at 1e-3 reached 0.94.
_adapter("fsgld", "fSGLD (GP functional prior)")(_functional_sgmcmc("FSGLD", 1e-4))
_adapter("fsghmc", "fSGHMC (GP functional prior)")(_functional_sgmcmc("FSGHMC", 1e-3, friction=10.0))


@_adapter("mnvi", "MNVI (sampling-free)")
def _mnvi(data: Data, s: Settings) -> Predictor:
    bnn = SamplingFreeBNN(to_mnvi(_mlp(s)), "categorical", num_data=len(data.y_train), prior_scale=1.0).to(s.device)
    bnn.fit(
        data.x_train, data.y_train, num_epochs=s.svi_epochs, batch_size=s.svi_batch_size,
        optim=PyroOptim(torch.optim.Adam, {"lr": s.lr}),
    )
    return lambda x: bnn.predict(x, num_samples=s.num_samples)


@_adapter("sdebnn", "SDE-BNN")
def _sdebnn(data: Data, s: Settings) -> Predictor:
    # Diffusion sigma 0.2 (one of the values Xu et al. 2022, "Infinitely Deep Bayesian Neural Networks with
    # Stochastic Differential Equations", select from: 0.1, 0.2, 0.5), a time-conditioned MLP field, Euler
    # steps; the width of the field follows the MLP baselines' hidden width.
    net = SDEBNN(
        in_dim=2, out_dim=2, hidden=s.hidden[0], augment=0, sigma=0.2, dt=s.sde_dt, likelihood="categorical"
    ).to(s.device)
    guide = NeuralSDEGuide(net, drift_hidden=s.hidden[0]).to(s.device)
    svi = SVI(net.model, guide, PyroOptim(torch.optim.Adam, {"lr": s.lr}), TracePathKL_ELBO(estimator="stl"))
    train_svi(svi, (data.x_train, data.y_train), num_epochs=s.sde_epochs, batch_size=s.batch_size)  # NaN: raises
    return lambda x: net.predict(x, guide, num_samples=s.num_samples)


# --------------------------------------------------------------------------- evaluation
@dataclass
class Result:
    key: str
    name: str
    status: str
    seconds: float = float("nan")
    metrics: dict[str, float] = field(default_factory=dict)
    test_probs: Tensor | None = None
    grid_probs: Tensor | None = None  # (S, grid points, 2): class probabilities per posterior draw
    diagnostics: dict | None = None


# ECE with 10 bins in the table, also with 15 (Guo et al. 2017) and 20 bins (Schmitt & Roth 2021) in the CSV.
_METRIC_COLUMNS = ("accuracy", "ece", "brier", "nll", "ece_ts", "brier_ts", "nll_ts", "temperature")
_CSV_COLUMNS = ("method", "status", *_METRIC_COLUMNS, "ece15", "ece20", "seconds")


def _evaluate(key: str, name: str, adapter: Callable, data: Data, s: Settings, grid: Tensor) -> Result:
    try:
        with common.Timer() as timer:
            predict = adapter(data, s)
            test_probs = predict(data.x_test).mean_probs.detach()
    except (NotImplementedError, ImportError) as err:
        return Result(key, name, f"not implemented: {err}")
    val_probs = predict(data.x_val).mean_probs.detach()
    grid_probs = predict(grid).probs.detach()
    metrics = common.calibrated_metrics(test_probs, data.y_test, val_probs, data.y_val)
    diagnostics = getattr(predict, "diagnostics", None)
    return Result(key, name, "ok", timer.seconds, metrics, test_probs, grid_probs, diagnostics)


def _write_tables(results: list[Result], out: Path) -> None:
    common.write_csv(out / "two_moons_table.csv", [
        {"method": r.name, "status": r.status, **r.metrics, "seconds": common.fmt(r.seconds, 2)} for r in results
    ], _CSV_COLUMNS)
    header = ("method", "accuracy", "ECE", "Brier", "NLL", "ECE (TS)", "Brier (TS)", "NLL (TS)", "T", "seconds")
    rows = [
        [r.name, *(common.fmt(r.metrics[c]) for c in _METRIC_COLUMNS[:-1]), common.fmt(r.metrics["temperature"], 2),
         common.fmt(r.seconds, 1)] if r.status == "ok" else [r.name, r.status, *[""] * (len(header) - 2)]
        for r in results
    ]
    (out / "two_moons_table.md").write_text(common.markdown_table(header, rows))


def _write_readme(results: list[Result], args, s: Settings, data: Data, total: float, extra_files: list[str]) -> None:
    command = "pyro-sdebnn benchmark two-moons" + (" --quick" if args.quick else "") + f" --seed {args.seed}"
    hidden = "-".join(map(str, s.hidden))
    blocks = [
        f"Command: `{command} --output {args.output}`; total wall time {total:.1f} s on {args.device}.",
        f"Data: `pyro_sdebnn.data.two_moons(n_train={len(data.y_train)}, n_test={len(data.y_test)}, noise=0.2, "
        f"seed={args.seed})`; validation set for temperature scaling: {len(data.y_val)} points from another "
        f"random state. Network: 2-{hidden}-2 ReLU MLP (logits for 2 classes); fSGLD/fSGHMC: 2-{hidden}-1 "
        f"(Bernoulli logit); SDE-BNN: width-{s.hidden[0]} time-conditioned MLP field, sigma 0.2.",
        f"Settings: {s.epochs} epochs Adam (lr {s.lr}, batch {s.batch_size}, weight decay {s.weight_decay}) for "
        f"torch-trained methods; {s.svi_epochs} SVI epochs (batch {s.svi_batch_size}) for Pyro SVI methods (MAP, "
        f"MFVI, MNVI); SDE-BNN {s.sde_epochs} epochs with Euler step {s.sde_dt}; {s.num_samples} predictive samples; "
        f"{s.num_members} ensemble members; dropout {s.dropout}; SG-MCMC step 1e-3 (SGHMC 1e-2, fSGLD 1e-4), "
        f"friction 1 (SGHMC) and 10 (fSGHMC), batch {s.batch_size}, {s.mcmc_warmup} warm-up + {s.mcmc_samples} "
        "samples thinned by "
        f"{s.mcmc_thinning}; functional priors: RBF GP on the class-1 logit (variance 4, length scale 0.5).",
        f"Metrics on the {len(data.y_test)} test points: accuracy, ECE (10 equal-width bins), Brier score, NLL (nats) "
        "of the predictive mean; `(TS)` after temperature scaling of the predictive log-probabilities (T fitted on "
        "the validation set); seconds = fit + test prediction. The CSV also has ECE with 15 and 20 bins.",
        "Files: `two_moons_table.md` / `.csv`, `reliability.png`, `heatmaps.png`, `uncertainty_decomposition.png`.",
    ]
    if extra_files:
        blocks += [
            "SG-MCMC chain diagnostics in function space (class-1 probability at the first "
            f"{_NUM_PROBES} test points; one chain each, Pyro's ESS): " + ", ".join(f"`{f}`" for f in extra_files),
            (args.output / "sgmcmc_ess.md").read_text(),
        ]
    missing = [r for r in results if r.status != "ok"]
    if missing:
        blocks.append("Not run, or failed:\n\n" + "\n".join(f"- {r.name}: {r.status}" for r in missing))
    blocks.append((args.output / "two_moons_table.md").read_text())
    common.write_readme(args.output / "README.md", "Two Moons head-to-head", blocks)


#: The reliability diagram's panels: method families, each ``(title, [adapter keys])``.
FAMILIES = (
    ("point estimate and Laplace", ("map", "laplace", "laplace-kron", "laplace-last-layer")),
    ("ensembles and dropout", ("deep-ensemble", "mc-dropout")),
    ("variational", ("mfvi", "mnvi", "sdebnn")),
    ("SG-MCMC", ("sgld", "sghmc", "fsgld", "fsghmc")),
)


def _write_figures(results: list[Result], data: Data, grid_axes: tuple[Tensor, Tensor], out: Path) -> None:
    """``reliability.png`` (a panel per method family), ``heatmaps.png`` and ``uncertainty_decomposition.png`` of
    the methods that finished."""
    ok = [r for r in results if r.status == "ok" and r.test_probs is not None and r.grid_probs is not None]
    if not ok:
        return
    test_probs = {r.name: r.test_probs for r in ok if r.test_probs is not None}
    grid_probs = {r.name: r.grid_probs for r in ok if r.grid_probs is not None}
    families = {title: [r.name for r in ok if r.key in keys] for title, keys in FAMILIES}
    others = [r.name for r in ok if not any(r.key in keys for _, keys in FAMILIES)]
    families = {title: names for title, names in {**families, "other": others}.items() if names}
    common.plot_reliability_curves(test_probs, data.y_test, out / "reliability.png", groups=families, xlim=(0.45, 1.0),
                                   title="Two Moons reliability diagram (10 equal-width bins; empty bins omitted)")
    p1 = {name: probs[..., 1] for name, probs in grid_probs.items()}  # p(y=1|x) per posterior draw
    common.plot_grid_heatmaps({name: (p.mean(0), p.std(0, unbiased=False)) for name, p in p1.items()}, grid_axes,
                              data.x_train, data.y_train, out / "heatmaps.png")
    ensemble = next((r.name for r in ok if r.key == "deep-ensemble"), ok[0].name)
    common.plot_uncertainty_decomposition(ensemble, grid_probs[ensemble], grid_axes,
                                          out / "uncertainty_decomposition.png")


# --------------------------------------------------------------------------- entry points
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--methods", nargs="+", action=check.Distinct, default=None, metavar="KEY",
        help=f"subset of methods to run (default: all): {' '.join(ADAPTERS)}",
    )
    parser.add_argument("--n-train", type=check.positive_int, default=200, help="training points (default 200)")
    parser.add_argument("--n-test", type=check.positive_int, default=500, help="held-out test points (default 500)")
    parser.add_argument("--n-val", type=check.positive_int, default=200,
                        help="validation points for temperature scaling (default 200)")
    parser.add_argument(
        "--threads", type=check.positive_int, default=1,
        help="torch intra-op CPU threads (default 1: these networks are too small to gain from more)",
    )


def run(args: argparse.Namespace) -> dict:
    """Train every method, write the table and figures, return ``{method: metrics}``."""
    device = torch.device(getattr(args, "device", "cpu"))
    seed = int(getattr(args, "seed", 0))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    methods = common.check_methods(getattr(args, "methods", None) or list(ADAPTERS), list(ADAPTERS))
    s = Settings.quick(device) if getattr(args, "quick", False) else Settings(device=device)
    split = two_moons(n_train=getattr(args, "n_train", 200), n_test=getattr(args, "n_test", 500), noise=0.2, seed=seed)
    val = two_moons(n_train=getattr(args, "n_val", 200), n_test=1, noise=0.2, seed=seed + 1)
    data = Data(*(t.to(device) for t in (split.x_train, split.y_train, val.x_train, val.y_train,
                                         split.x_test, split.y_test)))
    grid_axes = (torch.linspace(-2.5, 3.5, s.grid_size, device=device),
                 torch.linspace(-2.0, 2.5, s.grid_size, device=device))
    grid = torch.stack(torch.meshgrid(*grid_axes, indexing="xy"), -1).reshape(-1, 2)

    results: list[Result] = []
    interrupted = False
    with common.cpu_threads(getattr(args, "threads", 1), device), common.Timer() as timer:
        bar = tqdm(methods, desc="two-moons", unit="method")
        try:
            for key in bar:
                name, adapter = ADAPTERS[key]
                bar.set_postfix_str(key)
                common.fresh_start(seed)  # the same random state for every method, no Pyro params left by another
                try:
                    results.append(_evaluate(key, name, adapter, data, copy.copy(s), grid))
                except Exception as err:  # a failing method is reported in the table, not hidden
                    traceback.print_exc()
                    results.append(Result(key, name, f"failed: {type(err).__name__}: {str(err)[:120]}"))
                _write_tables(results, out)  # the table so far, rewritten as each method finishes
        except KeyboardInterrupt:  # Ctrl-C: write what is finished, then tell the caller
            bar.close()
            interrupted = True
            results += [Result(key, ADAPTERS[key][0], "not run: interrupted") for key in methods[len(results):]]
    finished = sum(r.status != "not run: interrupted" for r in results)
    _write_tables(results, out)
    _write_figures(results, data, grid_axes, out)
    ok = [r for r in results if r.status == "ok"]
    chains = {r.name: (r.diagnostics["probe_probs"], r.diagnostics["sampling_seconds"]) for r in ok if r.diagnostics}
    extra_files = common.write_chain_diagnostics(chains, out) if chains else []
    _write_readme(results, args, s, data, timer.seconds, extra_files)
    summary = {r.key: ({**r.metrics, "seconds": r.seconds} if r.status == "ok" else r.status) for r in results}
    if interrupted:
        raise common.Interrupted(summary, f"{finished} of {len(methods)} methods finished") from None
    return summary
