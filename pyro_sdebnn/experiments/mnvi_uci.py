# SPDX-License-Identifier: Apache-2.0
"""UCI Boston with a 13-50-2 network: MNVI vs sampling-free MFVI vs MC-dropout vs a deep ensemble ([1], Table 1).

Protocol: the 20 random 90/10 splits of :func:`pyro_sdebnn.data.uci_boston` (Boston housing [5]; the
split protocol of Hernández-Lobato & Adams [6]; standardised on the training split), one hidden layer
of 50 ReLU units, heteroscedastic Gaussian output (mean, log-variance). Reported per method: test
log-likelihood and RMSE in the original units (thousands of dollars), mean ± standard error over splits,
and fit time per split.

- **MNVI / MFVI** (:class:`~pyro_sdebnn.nn.mnvi.SamplingFreeBNN` + :class:`~pyro_sdebnn.infer.SamplingFree_ELBO`):
  Schmitt & Roth [1], App. B -- SGD (lr 0.05, momentum 0.9), 200 epochs, batch 64, prior variance 10, KL weight
  0.01 for the first half of training, 0.1 for the third quarter and 1 for the last quarter
  (epochs 100/150 of 200; ``--kl-final`` changes the last weight); gradient clipping at norm 1 per
  parameter tensor (Pyro's ``clip_norm``; [1], App. A, clips the infinity norm of the whole gradient).
  Prediction in one forward pass. With the final weight 1 MNVI underfits here (see the MNVI section
  of ``BENCHMARKS.md``); ``--kl-final 0.1`` is the cold-posterior variant (Wenzel et al. [4]).
- **MC-dropout** ([2]; :class:`~pyro_sdebnn.infer.MCDropout`, p = 0.05, 50 passes) and **deep ensemble**
  ([3]; :class:`~pyro_sdebnn.infer.DeepEnsemble`, 5 members): the baselines' own ``fit`` (Adam, lr 1e-2,
  weight decay 1e-4, batch 32) for the same number of epochs.

On the CPU the run is single-threaded (``torch.set_num_threads(1)`` for its duration, restored
afterwards): for a 13-50-2 network intra-op threads only add synchronisation, and on a shared
machine they slow every step down by an order of magnitude.

``--quick`` runs 2 splits for 20 epochs with a 2-member ensemble (a smoke test, not a result).
Outputs: ``mnvi_uci_table.md`` / ``.csv`` (summary), ``mnvi_uci_splits.csv`` (per split),
``mnvi_uci_loglik.png``.

Reference ([1], Table 1, 10-fold CV, 20 runs): boston test log-likelihood MNVI -2.43 ± 0.02,
MC-dropout -2.46 ± 0.25, ensemble -2.41 ± 0.25.

**References**

1. J. Schmitt, S. Roth (2021). Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise. DAGM German Conference on Pattern Recognition (GCPR) 2021.
2. Y. Gal, Z. Ghahramani (2016). Dropout as a Bayesian Approximation: Representing Model Uncertainty
   in Deep Learning. ICML 2016.
3. B. Lakshminarayanan, A. Pritzel, C. Blundell (2017). Simple and Scalable Predictive Uncertainty
   Estimation using Deep Ensembles. NeurIPS 2017.
4. F. Wenzel et al. (2020). How Good is the Bayes Posterior in Deep Neural Networks Really? ICML 2020.
5. D. Harrison, D. L. Rubinfeld (1978). Hedonic Housing Prices and the Demand for Clean Air.
   Journal of Environmental Economics and Management 5(1).
6. J. M. Hernández-Lobato, R. P. Adams (2015). Probabilistic Backpropagation for Scalable Learning of
   Bayesian Neural Networks. ICML 2015.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from pathlib import Path

import pyro
import torch
from tqdm.auto import tqdm

NAME = "mnvi-uci"
DESCRIPTION = "MNVI vs MFVI vs MC-dropout vs deep ensemble on UCI Boston (Schmitt & Roth 2021, Table 1)"

__all__ = ["DESCRIPTION", "METHODS", "NAME", "add_arguments", "run"]

METHODS = ("mnvi", "mfvi", "mc-dropout", "ensemble")
PRIOR_VARIANCE = 10.0  # Schmitt & Roth (2021), Table 3 (boston)
BATCH_SIZE = 64  # Schmitt & Roth (2021), Table 3 (boston)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--splits", type=int, default=None, help="number of splits (default 20; --quick: 2)")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default 200; --quick: 20)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, help="methods to run")
    parser.add_argument("--kl-final", type=float, default=1.0,
                        help="KL weight of the last quarter of training (Schmitt & Roth 2021, App. B: 1; "
                             "< 1 is a cold posterior)")


def _kl_schedule(epochs: int, final: float = 1.0):
    from pyro_sdebnn.infer import PiecewiseKLSchedule

    return PiecewiseKLSchedule([epochs // 2, (3 * epochs) // 4], [0.01, 0.1, final])


def _fit_sampling_free(kind: str, split, epochs: int, device, dtype, kl_final: float = 1.0) -> object:
    from pyro_sdebnn.nn import make_mlp
    from pyro_sdebnn.nn.mnvi import SamplingFreeBNN, to_mean_field, to_mnvi

    base = make_mlp([split.x_train.shape[1], 50, 2], device=device, dtype=dtype)
    net = to_mnvi(base) if kind == "mnvi" else to_mean_field(base)
    bnn = SamplingFreeBNN(net, "gaussian", num_data=split.x_train.shape[0], prior_scale=math.sqrt(PRIOR_VARIANCE),
                          name=kind)
    optim = pyro.optim.SGD({"lr": 0.05, "momentum": 0.9}, {"clip_norm": 1.0})
    bnn.fit(split.x_train, split.y_train, num_epochs=epochs, batch_size=BATCH_SIZE, optim=optim,
            kl_schedule=_kl_schedule(epochs, kl_final))
    return bnn


def _fit_baseline(kind: str, split, epochs: int, quick: bool, device, dtype) -> object:
    from pyro_sdebnn.infer import DeepEnsemble, MCDropout
    from pyro_sdebnn.nn import make_mlp

    d = split.x_train.shape[1]
    if kind == "mc-dropout":
        method = MCDropout(make_mlp([d, 50, 2], dropout=0.05, device=device, dtype=dtype), "gaussian", num_samples=50)
    else:
        method = DeepEnsemble(lambda: make_mlp([d, 50, 2], device=device, dtype=dtype), "gaussian",
                              num_members=2 if quick else 5)
    return method.fit(split.x_train, split.y_train, num_epochs=epochs, lr=1e-2, batch_size=32, weight_decay=1e-4)


def _evaluate(method, split) -> tuple[float, float]:
    from pyro_sdebnn.metrics import gaussian_mixture_log_likelihood, rmse

    pred = method.predict(split.x_test)
    ll = gaussian_mixture_log_likelihood(pred.loc, pred.scale, split.y_test, y_scale=float(split.y_scale))
    err = rmse(pred.mean, split.y_test, y_scale=float(split.y_scale))
    return float(ll), float(err)


def _mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, sd / math.sqrt(n)


def run(args: argparse.Namespace) -> dict:
    """Train every method on every split and write the tables and the figure."""
    threads = torch.get_num_threads()
    if torch.device(args.device).type == "cpu":
        torch.set_num_threads(1)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> dict:
    from pyro_sdebnn.data import NUM_UCI_SPLITS, uci_boston

    splits = args.splits if getattr(args, "splits", None) is not None else (2 if args.quick else NUM_UCI_SPLITS)
    epochs = args.epochs if getattr(args, "epochs", None) is not None else (20 if args.quick else 200)
    methods = list(getattr(args, "methods", METHODS))
    kl_final = float(getattr(args, "kl_final", 1.0))
    if not kl_final >= 0:
        raise ValueError(f"--kl-final must be >= 0, got {kl_final}")
    if not 1 <= splits <= NUM_UCI_SPLITS:
        raise ValueError(f"--splits must be in [1, {NUM_UCI_SPLITS}], got {splits}")
    if epochs < 1:
        raise ValueError(f"--epochs must be positive, got {epochs}")
    device, dtype = torch.device(args.device), torch.float32
    output = Path(args.output)
    rows = []
    progress = tqdm(total=splits * len(methods), desc="mnvi-uci")
    for k in range(splits):
        data = uci_boston(split=k, dtype=dtype)
        data = type(data)(*(t.to(device) if torch.is_tensor(t) else t for t in data))
        for kind in methods:
            pyro.set_rng_seed(args.seed + k)
            pyro.clear_param_store()
            start = time.perf_counter()
            if kind in ("mnvi", "mfvi"):
                method = _fit_sampling_free(kind, data, epochs, device, dtype, kl_final)
            else:
                method = _fit_baseline(kind, data, epochs, args.quick, device, dtype)
            seconds = time.perf_counter() - start
            ll, err = _evaluate(method, data)
            rows.append({"split": k, "method": kind, "test_loglik": ll, "rmse": err, "fit_seconds": seconds})
            progress.update()
    progress.close()

    with open(output / "mnvi_uci_splits.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = {}
    lines = [
        f"UCI Boston, {splits} splits (90/10), {epochs} epochs, 13-50-2 ReLU network, seed {args.seed}, "
        f"final KL weight {kl_final:g}"
        + (" -- QUICK smoke run, not a result" if args.quick else ""),
        "",
        "| method | test log-likelihood | RMSE | fit time / split [s] |",
        "|---|---|---|---|",
    ]
    table_rows = []
    for kind in methods:
        lls = [r["test_loglik"] for r in rows if r["method"] == kind]
        errs = [r["rmse"] for r in rows if r["method"] == kind]
        secs = [r["fit_seconds"] for r in rows if r["method"] == kind]
        (ll, ll_se), (err, err_se) = _mean_se(lls), _mean_se(errs)
        summary[kind] = {"test_loglik": ll, "test_loglik_se": ll_se, "rmse": err, "rmse_se": err_se,
                         "fit_seconds": sum(secs) / len(secs)}
        lines.append(f"| {kind} | {ll:.3f} ± {ll_se:.3f} | {err:.3f} ± {err_se:.3f} | {sum(secs) / len(secs):.1f} |")
        table_rows.append({"method": kind, **summary[kind], "splits": splits, "epochs": epochs, "kl_final": kl_final})
    lines += ["", "mean ± standard error over splits; reference (J. Schmitt, S. Roth (2021), \"Sampling-free "
              "Variational Inference for Neural Networks with Multiplicative Activation Noise\", GCPR 2021, "
              "Table 1): MNVI -2.43 ± 0.02, MC-dropout -2.46 ± 0.25, ensemble -2.41 ± 0.25."]
    (output / "mnvi_uci_table.md").write_text("\n".join(lines) + "\n")
    with open(output / "mnvi_uci_table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table_rows[0]))
        writer.writeheader()
        writer.writerows(table_rows)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for i, kind in enumerate(methods):
        lls = [r["test_loglik"] for r in rows if r["method"] == kind]
        ax.scatter([i] * len(lls), lls, alpha=0.5, s=14)
        ax.errorbar([i + 0.2], [summary[kind]["test_loglik"]], yerr=[summary[kind]["test_loglik_se"]], fmt="ks",
                    capsize=3)
    ax.set_xticks(range(len(methods)), methods)
    ax.set_ylabel("test log-likelihood")
    ax.set_title(f"UCI Boston ({splits} splits)")
    fig.tight_layout()
    fig.savefig(output / "mnvi_uci_loglik.png", dpi=120)
    plt.close(fig)
    return summary
