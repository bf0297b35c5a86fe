# SPDX-License-Identifier: Apache-2.0
"""UCI Boston with a 13-50-2 network: MNVI vs sampling-free MFVI vs MC-dropout vs a deep ensemble ([1], Table 1).

Boston housing [5], one hidden layer of 50 ReLU units and a heteroscedastic Gaussian output (mean, log-variance),
features and target standardised on the training part. Two evaluation protocols (``--protocol``):

- ``paper`` (default): the partition of the authors' released code for [1], 10-fold cross-validation with
  ``sklearn.model_selection.KFold(10, shuffle=True, random_state=1)`` (:func:`paper_fold`), repeated for
  ``--runs`` runs (default 20) with different training seeds; mean over runs ± standard error over runs;
- ``splits``: the 20 random 90/10 splits of :func:`pyro_sdebnn.data.uci_boston` (Hernández-Lobato & Adams [6]).

Reported per method: test log-likelihood and RMSE in the original units (thousands of dollars), fit time.

- **MNVI / MFVI** (:class:`~pyro_sdebnn.infer.SamplingFreeBNN`, :class:`~pyro_sdebnn.infer.SamplingFree_ELBO`)
  maximise :math:`\\sum_n \\mathbb E_q[\\log p(y_n \\mid x_n, w)] - \\beta_e\\,\\mathrm{KL}(q \\,\\|\\, p)`
  with the schedule of the authors' released code, which differs from App. B of [1] (:func:`build_network`,
  :func:`fit_sampling_free`): 200 epochs of SGD; at epochs 100 and 150 the KL weight :math:`\\beta_e` goes
  0.01 -> 0.1 -> 1 *and* the learning rate is multiplied by 0.1 (``--kl-final`` < 1 makes the last weight a cold
  posterior, Wenzel et al. [4]). Prediction in one forward pass.
- **MC-dropout** ([2]; :class:`~pyro_sdebnn.infer.MCDropout`) and **deep ensemble** ([3];
  :class:`~pyro_sdebnn.infer.DeepEnsemble`): the baselines' own ``fit`` for the same number of epochs, on the same
  folds / splits.

The rest of the schedule, the options, the outputs and the published figures are on the page
:doc:`/methods/mnvi` (section "Reproducing UCI Boston"). ``--quick`` is a smoke test, not a result.

**References**

1. J. Schmitt, S. Roth (2021). Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise. DAGM German Conference on Pattern Recognition (GCPR) 2021.
2. Y. Gal, Z. Ghahramani (2016). Dropout as a Bayesian Approximation: Representing Model Uncertainty
   in Deep Learning. ICML 2016.
3. B. Lakshminarayanan, A. Pritzel, C. Blundell (2017). Simple and Scalable Predictive Uncertainty
   Estimation using Deep Ensembles. NeurIPS 2017.
4. Florian Wenzel et al. (2020). How Good is the Bayes Posterior in Deep Neural Networks Really? ICML 2020.
5. D. Harrison, D. L. Rubinfeld (1978). Hedonic Housing Prices and the Demand for Clean Air.
   Journal of Environmental Economics and Management 5(1).
6. J. M. Hernández-Lobato, R. P. Adams (2015). Probabilistic Backpropagation for Scalable Learning of
   Bayesian Neural Networks. ICML 2015.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from pyro.optim import PyroLRScheduler
from sklearn.model_selection import KFold
from tqdm.auto import tqdm

from pyro_sdebnn.data import uci_boston
from pyro_sdebnn.data.split import DataSplit, _check_dtype, _standardize_columns, _to_split
from pyro_sdebnn.data.uci import NUM_UCI_SPLITS, _boston_arrays
from pyro_sdebnn.experiments import REGISTRY
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.experiments import _harness as common
from pyro_sdebnn.infer import DeepEnsemble, MCDropout, PiecewiseKLSchedule, SamplingFreeBNN
from pyro_sdebnn.nn._mlp import make_mlp
from pyro_sdebnn.nn.mnvi import MFLinear, MNConcat, MNLinear, MNReLU, MNSequential

NAME = "mnvi-uci"
#: What ``--quick`` does (shown by ``--help``).
QUICK = "1 run over 2 of the 10 folds (--protocol splits: 2 splits), 20 epochs, 2 ensemble members"
DESCRIPTION = REGISTRY[NAME].description  # the one line of --help

__all__ = ["DESCRIPTION", "METHODS", "NAME", "PROTOCOLS", "add_arguments", "build_network", "fit_sampling_free",
           "paper_fold", "run"]


METHODS = ("mnvi", "mfvi", "mc-dropout", "ensemble")
PROTOCOLS = ("paper", "splits")
PRIOR_VARIANCE = 10.0  # Schmitt & Roth (2021), Table 3 (boston)
BATCH_SIZE = 64  # Schmitt & Roth (2021), Table 3 (boston)
NUM_FOLDS = 10  # the authors' released code: KFold(10, shuffle=True, random_state=1)
HIDDEN = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:

    parser.add_argument("--protocol", choices=PROTOCOLS, default="paper",
                        help="paper: the authors' 10-fold partition repeated over --runs runs (default); "
                             "splits: the 20 random 90/10 splits of the library")
    parser.add_argument("--runs", type=check.positive_int, default=None,
                        help="--protocol paper: runs over the 10 folds (default 20; --quick: 1)")
    parser.add_argument("--folds", type=check.int_range(1, NUM_FOLDS), default=None,
                        help=f"--protocol paper: evaluate the first FOLDS of the {NUM_FOLDS} folds "
                             f"(default {NUM_FOLDS}; --quick: 2)")
    parser.add_argument("--splits", type=check.int_range(1, NUM_UCI_SPLITS), default=None,
                        help=f"--protocol splits: number of splits, 1 to {NUM_UCI_SPLITS} (default 20; --quick: 2)")
    parser.add_argument("--epochs", type=check.positive_int, default=None,
                        help="training epochs (default 200; --quick: 20)")
    parser.add_argument("--methods", nargs="+", action=check.Distinct, default=list(METHODS), choices=METHODS,
                        help="methods to run")
    parser.add_argument("--kl-final", type=check.nonnegative_float, default=1.0,
                        help="KL weight of the last quarter of training (Schmitt & Roth 2021: 1; "
                             "< 1 is a cold posterior)")


def paper_fold(fold: int, *, dtype: torch.dtype = torch.float32):
    """Fold ``fold`` of the 10-fold partition of UCI Boston used by the authors' code for Schmitt & Roth (2021).

    The partition is ``sklearn.model_selection.KFold(10, shuffle=True, random_state=1)`` over the 506 rows
    (test folds of 51 rows for folds 0-5, 50 rows for folds 6-9); features and target are standardised
    with the mean and (population) standard deviation of the training part, as in
    :func:`pyro_sdebnn.data.uci_boston`, whose :class:`~pyro_sdebnn.data.split.DataSplit` it returns.

    :param int fold: ``0 <= fold < 10``.
    :param torch.dtype dtype: floating dtype of features and targets.

    >>> split = paper_fold(0)
    >>> split.x_train.shape, split.x_test.shape
    (torch.Size([455, 13]), torch.Size([51, 13]))
    """
    if isinstance(fold, bool) or not isinstance(fold, int) or not 0 <= fold < NUM_FOLDS:
        raise ValueError(f"fold must be an int in [0, {NUM_FOLDS}), got {fold!r}")
    dtype = _check_dtype(dtype)
    x, y = _boston_arrays()
    train_idx, test_idx = list(KFold(NUM_FOLDS, shuffle=True, random_state=1).split(x))[fold]
    x_train, x_test, _, _ = _standardize_columns(x[train_idx], x[test_idx])
    y_train, y_test, y_loc, y_scale = _standardize_columns(y[train_idx], y[test_idx])
    return _to_split(x_train, y_train, x_test, y_test, dtype=dtype, classification=False, y_loc=float(y_loc),
                     y_scale=float(y_scale))


def build_network(kind: str, in_features: int, *, device=None, dtype=None) -> torch.nn.Module:
    """The regression network of the authors' code: ``in``-50-ReLU, then separate mean and log-variance heads.

    Each head is its own Bayesian layer (:class:`~pyro_sdebnn.nn.mnvi.MNLinear` for ``"mnvi"``,
    :class:`~pyro_sdebnn.nn.mnvi.MFLinear` for ``"mfvi"``), so for MNVI the two heads have separate noise
    variances :math:`\\alpha`; weights are Xavier-normal (Xavier Glorot, Yoshua Bengio (2010), "Understanding the
    difficulty of training deep feedforward neural networks", AISTATS 2010), biases zero. The output is ``(N, 2)`` =
    (mean, log-variance).

    >>> from pyro_sdebnn.ops.moments import Moments
    >>> build_network("mnvi", 13)(Moments(torch.randn(4, 13), None)).mean.shape
    torch.Size([4, 2])
    """
    if kind not in ("mnvi", "mfvi"):
        raise ValueError(f"kind must be 'mnvi' or 'mfvi', got {kind!r}")
    layer = MNLinear if kind == "mnvi" else MFLinear
    kw = {"device": device, "dtype": dtype}
    net = MNSequential(layer(in_features, HIDDEN, **kw), MNReLU(),
                       MNConcat(layer(HIDDEN, 1, **kw), layer(HIDDEN, 1, **kw)))
    for module in net.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.xavier_normal_(module.weight)
            torch.nn.init.zeros_(module.bias)
    return net


def fit_sampling_free(kind: str, x: torch.Tensor, y: torch.Tensor, *, epochs: int = 200, kl_final: float = 1.0):
    """Train MNVI or MFVI on ``(x, y)`` with the schedule of the authors' code; return the fitted BNN.

    SGD (lr 0.05, momentum 0.9), batch 64, prior variance 10; with milestones ``E/2`` and ``3E/4`` of
    ``E = epochs``, the KL weight goes 0.01 -> 0.1 -> ``kl_final`` and the learning rate is multiplied by 0.1
    at each milestone; the whole gradient is clipped by its infinity norm at 1.

    :param str kind: ``"mnvi"`` or ``"mfvi"``.
    :param Tensor x: standardised inputs ``(N, D)``; the network follows their device and dtype.
    :param Tensor y: standardised targets ``(N,)``.
    :param int epochs: training epochs (200 in the authors' code).
    :param float kl_final: KL weight of the last phase (1: the ELBO; < 1: a cold posterior).
    :return: the fitted :class:`~pyro_sdebnn.infer.SamplingFreeBNN`.
    """
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}")
    if not kl_final >= 0:
        raise ValueError(f"kl_final must be >= 0, got {kl_final!r}")
    milestones = [epochs // 2, (3 * epochs) // 4]
    net = build_network(kind, x.shape[1], device=x.device, dtype=x.dtype)
    bnn = SamplingFreeBNN(net, "normal", num_data=x.shape[0], prior_scale=math.sqrt(PRIOR_VARIANCE), name=kind)
    optim = PyroLRScheduler(torch.optim.lr_scheduler.MultiStepLR, {
        "optimizer": torch.optim.SGD, "optim_args": {"lr": 0.05, "momentum": 0.9}, "milestones": milestones,
        "gamma": 0.1})  # = pyro.optim.MultiStepLR
    bnn.fit(x, y, num_epochs=epochs, batch_size=BATCH_SIZE, optim=optim, clip_inf_norm=1.0,
            kl_schedule=PiecewiseKLSchedule(milestones, [0.01, 0.1, kl_final]))
    return bnn


def _fit_baseline(kind: str, split, epochs: int, quick: bool, device, dtype) -> object:
    d = split.x_train.shape[1]
    method: MCDropout | DeepEnsemble
    if kind == "mc-dropout":
        method = MCDropout(make_mlp([d, 50, 2], dropout=0.05, device=device, dtype=dtype), "normal", num_samples=50)
    else:
        method = DeepEnsemble(lambda: make_mlp([d, 50, 2], device=device, dtype=dtype), "normal",
                              num_members=2 if quick else 5)
    return method.fit(split.x_train, split.y_train, num_epochs=epochs, lr=1e-2, batch_size=32, weight_decay=1e-4)


def _evaluate(method, split) -> tuple[float, float]:
    """(test log-likelihood, RMSE) of a fitted method on ``split``'s test part, in original units."""
    scores = common.regression_metrics(method.predict(split.x_test), split.y_test, float(split.y_scale))
    return scores["test_ll"], scores["rmse"]


def run(args: argparse.Namespace) -> dict:
    """Train every method on every split and write the tables and the figure."""
    with common.cpu_threads(1, args.device):
        return _run(args)


def _units(args: argparse.Namespace) -> tuple[str, list[tuple[int, int]]]:
    """The protocol and its ``(run, fold or split)`` units, validated."""

    protocol = getattr(args, "protocol", "paper")
    if protocol not in PROTOCOLS:
        raise ValueError(f"--protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if protocol == "splits":
        splits = args.splits if getattr(args, "splits", None) is not None else (2 if args.quick else NUM_UCI_SPLITS)
        if not 1 <= splits <= NUM_UCI_SPLITS:
            raise ValueError(f"--splits must be in [1, {NUM_UCI_SPLITS}], got {splits}")
        return protocol, [(0, k) for k in range(splits)]
    runs = args.runs if getattr(args, "runs", None) is not None else (1 if args.quick else 20)
    folds = args.folds if getattr(args, "folds", None) is not None else (2 if args.quick else NUM_FOLDS)
    if runs < 1:
        raise ValueError(f"--runs must be positive, got {runs}")
    if not 1 <= folds <= NUM_FOLDS:
        raise ValueError(f"--folds must be in [1, {NUM_FOLDS}], got {folds}")
    return protocol, [(r, f) for r in range(runs) for f in range(folds)]


def _summarise(rows: list[dict], key: str, protocol: str) -> tuple[float, float, float]:
    """(mean, standard error, standard deviation) of ``key``: over splits, or over runs of fold means."""
    if protocol == "splits":
        values = [r[key] for r in rows]
    else:
        runs = sorted({r["run"] for r in rows})
        values = [sum(r[key] for r in rows if r["run"] == i) / sum(r["run"] == i for r in rows) for i in runs]
        if len(values) == 1:  # one run: the spread over its folds
            values = [r[key] for r in rows]
    mean, se = common.mean_se(values)
    return mean, se, se * math.sqrt(len(values))


def _run(args: argparse.Namespace) -> dict:

    protocol, units = _units(args)
    epochs = args.epochs if getattr(args, "epochs", None) is not None else (20 if args.quick else 200)
    methods = list(getattr(args, "methods", METHODS))
    kl_final = float(getattr(args, "kl_final", 1.0))
    if not kl_final >= 0:
        raise ValueError(f"--kl-final must be >= 0, got {kl_final}")
    if epochs < 1:
        raise ValueError(f"--epochs must be positive, got {epochs}")
    device, dtype = torch.device(args.device), torch.float32
    output = Path(args.output)
    rows: list[dict] = []
    progress = tqdm(total=len(units) * len(methods), desc="mnvi-uci")
    data: DataSplit | None = None
    loaded = None
    try:
        for run, k in units:
            if data is None or loaded != k:
                split = paper_fold(k, dtype=dtype) if protocol == "paper" else uci_boston(split=k, dtype=dtype)
                data = split._replace(x_train=split.x_train.to(device), y_train=split.y_train.to(device),
                                      x_test=split.x_test.to(device), y_test=split.y_test.to(device))
                loaded = k
            for kind in methods:
                common.fresh_start(args.seed + run * NUM_FOLDS + k)
                with common.Timer() as timer:
                    if kind in ("mnvi", "mfvi"):
                        method = fit_sampling_free(kind, data.x_train, data.y_train, epochs=epochs, kl_final=kl_final)
                    else:
                        method = _fit_baseline(kind, data, epochs, args.quick, device, dtype)
                ll, err = _evaluate(method, data)
                rows.append({"protocol": protocol, "run": run, "fold": k, "method": kind, "test_loglik": ll,
                             "rmse": err, "fit_seconds": timer.seconds})
                _write(args, output, rows, protocol, methods, epochs, kl_final)  # the tables so far
                progress.update()
    except KeyboardInterrupt:
        progress.close()
        summary = _write(args, output, rows, protocol, methods, epochs, kl_final, interrupted=True) if rows else {}
        raise common.Interrupted(summary, f"{len(rows)} of {len(units) * len(methods)} (fold, method) fits "
                                          "finished") from None
    progress.close()
    return _write(args, output, rows, protocol, methods, epochs, kl_final, figure=True)


def _write(args: argparse.Namespace, output: Path, rows: list[dict], protocol: str, methods: list[str], epochs: int,
           kl_final: float, interrupted: bool = False, figure: bool | None = None) -> dict:
    """``mnvi_uci_splits.csv`` (every fit so far), ``mnvi_uci_table.md`` / ``.csv`` and, at the end or on an
    interrupt, ``mnvi_uci_loglik.png``; returns the summary."""
    common.write_csv(output / "mnvi_uci_splits.csv", rows)
    methods = [kind for kind in methods if any(r["method"] == kind for r in rows)]
    runs = len({r["run"] for r in rows})
    folds = len({r["fold"] for r in rows})
    if protocol == "paper":
        setting = (f"the authors' 10-fold partition (KFold(10, shuffle=True, random_state=1)), {folds} of "
                   f"{NUM_FOLDS} folds, {runs} run(s)")
        spread = "over runs (a run: the mean over its folds)" if runs > 1 else "over folds (1 run)"
    else:
        setting, spread = f"{folds} random 90/10 splits", "over splits"
    summary, table_rows, cells = {}, [], []
    for kind in methods:
        mine = [r for r in rows if r["method"] == kind]
        ll, ll_se, ll_sd = _summarise(mine, "test_loglik", protocol)
        err, err_se, _ = _summarise(mine, "rmse", protocol)
        secs = sum(r["fit_seconds"] for r in mine) / len(mine)
        summary[kind] = {"test_loglik": ll, "test_loglik_se": ll_se, "test_loglik_sd": ll_sd, "rmse": err,
                         "rmse_se": err_se, "fit_seconds": secs}
        cells.append([kind, f"{ll:.3f} ± {ll_se:.3f}", f"{ll_sd:.3f}", f"{err:.3f} ± {err_se:.3f}", f"{secs:.1f}"])
        table_rows.append({"method": kind, **summary[kind], "protocol": protocol, "runs": runs, "folds": folds,
                           "epochs": epochs, "kl_final": kl_final})
    status = (" -- INTERRUPTED: the fits finished so far" if interrupted else
              "" if figure else " -- in progress: the fits finished so far")
    (output / "mnvi_uci_table.md").write_text("\n\n".join([
        f"UCI Boston, {setting}, {epochs} epochs, 13-50-2 ReLU network, seed {args.seed}, "
        f"final KL weight {kl_final:g}" + (" -- QUICK smoke run, not a result" if args.quick else "") + status,
        common.markdown_table(["method", "test log-likelihood", "sd", "RMSE", "fit time / fit [s]"], cells).rstrip(),
        f"mean ± standard error {spread}; sd: the standard deviation {spread}. Reference (J. Schmitt, "
        "S. Roth (2021), \"Sampling-free Variational Inference for Neural Networks with Multiplicative "
        "Activation Noise\", GCPR 2021, Table 1, 10-fold CV, 20 runs): MNVI -2.43 ± 0.02, "
        "MC-dropout -2.46 ± 0.25, ensemble -2.41 ± 0.25.",
    ]) + "\n")
    common.write_csv(output / "mnvi_uci_table.csv", table_rows)
    if not (figure or interrupted):
        return summary
    fig = common.figure(figsize=(5, 3.2))
    ax = fig.add_subplot()
    for i, kind in enumerate(methods):
        lls = [r["test_loglik"] for r in rows if r["method"] == kind]
        ax.scatter([i] * len(lls), lls, alpha=0.5, s=14)
        ax.errorbar([i + 0.2], [summary[kind]["test_loglik"]], yerr=[summary[kind]["test_loglik_se"]], fmt="ks",
                    capsize=3)
    ax.set_xticks(range(len(methods)), methods)
    ax.set_ylabel("test log-likelihood")
    ax.set_title(f"UCI Boston ({setting.split(' (')[0]})", fontsize=8)
    common.save_figure(fig, output / "mnvi_uci_loglik.png", dpi=120)
    return summary
