# SPDX-License-Identifier: Apache-2.0
"""SDE-BNN vs ODE-Net, mean-field ODE-Net and ResNet (± mean-field VI) on image classification.

Table 1 of Xu et al. [1] at a laptop budget. All methods share one continuous-depth conv net
(:class:`~pyro_sdebnn.nn.SDEBNN`'s conv field: strided conv down, tanh, transposed conv up, time as a
channel; linear head), the same number of optimisation steps, batch size and learning rate:

- ``sdebnn`` / ``sdebnn-stl``: OU prior path over the field's weights, neural-SDE guide,
  :class:`~pyro_sdebnn.infer.TracePathKL_ELBO` with the ``analytic`` / ``stl`` estimator;
- ``odenet``: :class:`~pyro_sdebnn.nn.ODENet`, constant deterministic weights (σ → 0), cross-entropy
  (:meth:`~pyro_sdebnn.nn.ODENet.nll`), Adam;
- ``mf-odenet``: the same net's :meth:`~pyro_sdebnn.nn.ODENet.model` (N(0, 1) prior on the constant
  weights) with Pyro ``AutoNormal`` + ``TraceMeanField_ELBO``;
- ``resnet`` / ``mf-resnet``: :class:`~pyro_sdebnn.nn.ResNet`, K = round(1 / dt) independent weight
  vectors, one per Euler step (a discrete ResNet with K residual blocks), deterministic or mean-field VI.

Reported: test accuracy, ECE (10 bins, Guo et al. [2]), NLL, training time. The claim checked is
that of [1]: SDE-BNN at least as accurate as ODE-Net with lower ECE. A second part times the trained
SDE-BNN's prediction with fixed-step and adaptive solvers ([1], Fig. 6: tolerance vs accuracy/time).
Data: ``mnist_subset`` (default), ``digits`` (``--quick``), or, with ``--data-dir DIR``, the full
``mnist``, ``fashion_mnist`` or ``cifar10`` from the torchvision files in ``DIR``. The full data sets are
read through a :class:`~torch.utils.data.DataLoader` (one batch on the device at a time;
:func:`~pyro_sdebnn.infer.svi_training.train_svi` for the Bayesian methods), for ``--epochs`` epochs
(default: enough epochs to make ``--steps`` steps), CIFAR-10 with random crops and flips
(:func:`~pyro_sdebnn.data.images.augmentation`); nothing is downloaded unless ``--download`` is given.

**References**

1. W. Xu, R. T. Q. Chen, X. Li, D. Duvenaud (2022). Infinitely Deep Bayesian Neural Networks with
   Stochastic Differential Equations. AISTATS 2022, PMLR 151. arXiv:2102.06559.
2. C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger (2017). On Calibration of Modern Neural Networks.
   ICML 2017.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pyro
import torch
from pyro.infer import SVI, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal, init_to_value
from pyro.optim import Adam
from tqdm import tqdm

from pyro_sdebnn.infer import NeuralSDEGuide, TracePathKL_ELBO
from pyro_sdebnn.metrics import accuracy, expected_calibration_error, negative_log_likelihood
from pyro_sdebnn.nn import SDEBNN, ODENet, ResNet

NAME = "sdebnn-mnist"
DESCRIPTION = "SDE-BNN (+STL) vs ODE-Net, mean-field ODE-Net and ResNet±MFVI: accuracy, ECE, solver tolerance"

METHOD_NAMES = ("sdebnn", "sdebnn-stl", "odenet", "mf-odenet", "resnet", "mf-resnet")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pyro_sdebnn.cli import add_data_dir_arguments
    from pyro_sdebnn.data.images import IMAGE_DATASETS

    parser.add_argument("--dataset", default=None, choices=("mnist_subset", "digits") + IMAGE_DATASETS,
                        help="default: mnist with --data-dir, else the bundled mnist_subset")
    add_data_dir_arguments(parser)
    parser.add_argument("--root", type=Path, default=None, help="the same as --data-dir")
    parser.add_argument("--steps", type=int, default=1500, help="optimisation steps per method")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs over the full data set with --data-dir (default: as many as --steps steps need)")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes with --data-dir")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--hidden", type=int, default=16, help="hidden channels of the conv field")
    parser.add_argument("--augment", type=int, default=1)
    parser.add_argument("--sigma", type=float, default=0.1)
    parser.add_argument("--dt", type=float, default=0.2)
    parser.add_argument("--methods", default=",".join(METHOD_NAMES))
    parser.add_argument("--samples", type=int, default=16, help="posterior samples at test time")
    parser.add_argument("--threads", type=int, default=1)


def data_dir(args) -> Path | None:
    """The folder of ``--data-dir`` (or this benchmark's ``--root``), checked to exist unless ``--download``.

    :raises ValueError: (``--data-dir: ...``) when the folder does not exist and downloading is not allowed.
    """
    root = getattr(args, "data_dir", None) or getattr(args, "root", None)
    if root is None:
        return None
    root = Path(root).expanduser()
    if not getattr(args, "download", False) and not root.is_dir():
        raise ValueError(f"--data-dir: the folder {str(root)!r} does not exist (put the torchvision files there, "
                         "or add --download to fetch them)")
    return root


class ImageLoaders:
    """Training and test :class:`~torch.utils.data.DataLoader` of a torchvision data set under ``--data-dir``.

    ``--quick`` keeps the first 1,000 training and 500 test images. The training loader shuffles with its own
    generator seeded by ``--seed`` (rebuilt by :meth:`train` for every method, so all see the same batches) and
    pins memory for a CUDA device.
    """

    def __init__(self, args, name: str, root: Path, batch_size: int, test_batch_size: int = 250) -> None:
        from torch.utils.data import Subset

        from pyro_sdebnn.data.images import augmentation, image_datasets

        self.train_set, self.test_set = image_datasets(name, root, download=bool(getattr(args, "download", False)))
        if args.quick:
            self.train_set = Subset(self.train_set, range(min(1000, len(self.train_set))))
            self.test_set = Subset(self.test_set, range(min(500, len(self.test_set))))
        self.name, self.args, self.batch_size, self.test_batch_size = name, args, batch_size, test_batch_size
        self.augmented = augmentation(name) is not None
        workers = int(getattr(args, "workers", 0))
        if workers < 0:
            raise ValueError(f"--workers must be >= 0, got {workers}")
        self.common = {"num_workers": workers, "pin_memory": torch.device(args.device).type == "cuda"}

    def train(self):
        from torch.utils.data import DataLoader

        generator = torch.Generator().manual_seed(self.args.seed)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, generator=generator, **self.common)

    def test(self):
        from torch.utils.data import DataLoader

        return DataLoader(self.test_set, batch_size=self.test_batch_size, **self.common)

    def test_labels(self) -> torch.Tensor:
        return torch.cat([torch.as_tensor(y) for _, y in self.test()])

    def first_test_images(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys, seen = [], [], 0
        for x, y in self.test():
            xs.append(x)
            ys.append(torch.as_tensor(y))
            seen += x.shape[0]
            if seen >= count:
                break
        return torch.cat(xs)[:count], torch.cat(ys)[:count]

    def shape(self) -> tuple[int, ...]:
        return tuple(self.test_set[0][0].shape)

    def epochs(self, steps: int, epochs: int | None) -> int:
        if epochs is not None:
            if epochs < 1:
                raise ValueError(f"--epochs must be positive, got {epochs}")
            return epochs
        return max(1, math.ceil(steps / math.ceil(len(self.train_set) / self.batch_size)))


def _load(args):
    from pyro_sdebnn import data

    if args.quick or args.dataset == "digits":
        return data.digits(seed=args.seed)
    return data.mnist_subset(seed=args.seed)


def _batches(n, batch_size, steps, seed):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield torch.randint(0, n, (batch_size,), generator=generator)


def _net(args, shape):
    return SDEBNN(shape, 10, hidden=args.hidden, augment=args.augment, sigma=args.sigma, dt=args.dt,
                  likelihood="categorical").to(args.device)


def _eval_probs(fn, x, chunk=250):
    with torch.no_grad():
        return torch.cat([fn(x[i:i + chunk]) for i in range(0, x.shape[0], chunk)], 1)


def _svi_fit(args, svi, data, desc):
    """SVI steps: random minibatches of the bundled tensors, or epochs over the full data set's loader."""
    from pyro_sdebnn.infer import train_svi

    if isinstance(data, ImageLoaders):
        train_svi(svi, data.train(), num_epochs=args.epochs, device=args.device, progress=True)
        return
    x, y, n = data.x_train.to(args.device), data.y_train.to(args.device), data.x_train.shape[0]
    for idx in tqdm(_batches(n, args.batch_size, args.steps, args.seed), total=args.steps, desc=desc, leave=False):
        svi.step(x[idx], y[idx], num_data=n)


def _shape(data):
    return data.shape() if isinstance(data, ImageLoaders) else tuple(data.x_train.shape[1:])


def _train_sdebnn(args, data, estimator):
    net = _net(args, _shape(data))
    guide = NeuralSDEGuide(net, drift_hidden=128, bottleneck=2)
    svi = SVI(net.model, guide, Adam({"lr": args.lr}), TracePathKL_ELBO(estimator=estimator))
    _svi_fit(args, svi, data, f"sdebnn-{estimator}")
    predict = lambda xb: net.predict(xb, guide, num_samples=args.samples).probs  # noqa: E731
    return predict, (net, guide)


def _baseline(args, shape, method: str):
    # built right after pyro.set_rng_seed(args.seed), like _net: same initial field weights and head as the SDE-BNN
    common = dict(hidden=args.hidden, augment=args.augment, likelihood="categorical", prior_scale=1.0)
    if method.endswith("odenet"):
        net = ODENet(shape, 10, dt=args.dt, **common)
    else:
        blocks = max(1, round(1.0 / args.dt))  # as many residual blocks as the continuous nets' Euler steps on (0, 1)
        net = ResNet(shape, 10, blocks=blocks, **common)
    return net.to(args.device)


def _deterministic(args, data, method: str):
    from pyro_sdebnn.data.loaders import iter_batches

    net = _baseline(args, _shape(data), method)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)

    def step(xb, yb):
        opt.zero_grad()
        net.nll(xb, yb).backward()
        opt.step()

    if isinstance(data, ImageLoaders):
        for _ in tqdm(range(args.epochs), leave=False, desc=method):
            for xb, yb in iter_batches(data.train(), args.device, net.weights.dtype):
                step(xb, yb)
    else:
        x, y, n = data.x_train.to(args.device), data.y_train.to(args.device), data.x_train.shape[0]
        for idx in tqdm(_batches(n, args.batch_size, args.steps, args.seed), total=args.steps, leave=False,
                        desc=method):
            step(x[idx], y[idx])
    return lambda xb: net.predict(xb).probs, None


def _mean_field(args, data, method: str):
    net = _baseline(args, _shape(data), method)
    # start at the deterministic nets' initial weights (zero weights are a saddle of the field), tiny scale
    guide = AutoNormal(net.model, init_loc_fn=init_to_value(values={"w": net.weights.detach()}), init_scale=1e-3)
    svi = SVI(net.model, guide, Adam({"lr": args.lr}), TraceMeanField_ELBO())
    _svi_fit(args, svi, data, method)
    return lambda xb: net.predict(xb, guide, num_samples=args.samples).probs, None


def _solver_tolerance(args, net, guide, x, y):
    rows = []
    for label, kwargs in ((f"euler dt={net.dt:g} (training grid)", dict(method="euler")),
                          (f"srk fixed dt={net.dt:g}", dict(method="srk")),
                          ("srk adaptive tol=1e-1", dict(method="srk", adaptive=True, rtol=1e-1, atol=1e-1)),
                          ("srk adaptive tol=1e-2", dict(method="srk", adaptive=True, rtol=1e-2, atol=1e-2)),
                          ("srk adaptive tol=1e-3", dict(method="srk", adaptive=True, rtol=1e-3, atol=1e-3))):
        pyro.set_rng_seed(args.seed)
        start = time.perf_counter()
        probs = net.predict(x, guide, num_samples=4, entropy=args.seed, **kwargs).probs
        rows.append({"solver": label, "seconds": time.perf_counter() - start,
                     "accuracy": accuracy(probs.mean(0), y).item(),
                     "ece": expected_calibration_error(probs.mean(0), y).item()})
    return rows


def run(args: argparse.Namespace) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> dict:
    pyro.set_rng_seed(args.seed)
    root = data_dir(args)
    dataset = args.dataset or ("mnist" if root is not None else "mnist_subset")
    if dataset in ("mnist_subset", "digits") and root is not None and args.dataset is not None:
        raise ValueError(f"--dataset {dataset} is bundled; --data-dir is for mnist, fashion_mnist or cifar10")
    if dataset not in ("mnist_subset", "digits") and root is None:
        raise ValueError(f"--dataset {dataset} needs --data-dir DIR, the folder with its torchvision files")
    args.dataset = dataset
    if args.quick:
        args.steps = min(args.steps, 60)
        args.samples = min(args.samples, 4)
    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(METHOD_NAMES)
    if unknown:
        raise ValueError(f"--methods: unknown {sorted(unknown)}; choose from {METHOD_NAMES}")
    if root is not None:
        data = ImageLoaders(args, dataset, root, args.batch_size)
        args.epochs = data.epochs(args.steps, getattr(args, "epochs", None))
        y_test = data.test_labels().to(args.device)
        described = (f"dataset {dataset} (full: {len(data.train_set)} train / {len(data.test_set)} test images, "
                     f"DataLoader{', random crop + flip' if data.augmented else ''}), {args.epochs} epochs "
                     f"x batch {args.batch_size}")
    else:
        data = _load(args)
        x_test, y_test = data.x_test.to(args.device), data.y_test.to(args.device)
        described = (f"dataset {args.dataset if not args.quick else 'digits'}, {args.steps} steps x batch "
                     f"{args.batch_size}")
    results, trained = {}, {}
    for method in methods:
        pyro.clear_param_store()
        pyro.set_rng_seed(args.seed)
        start = time.perf_counter()
        if method.startswith("sdebnn"):
            predict, extra = _train_sdebnn(args, data, "stl" if method == "sdebnn-stl" else "analytic")
            trained[method] = extra
        elif method in ("odenet", "resnet"):
            predict, _ = _deterministic(args, data, method)
        else:
            predict, _ = _mean_field(args, data, method)
        seconds = time.perf_counter() - start
        # the test set streamed batch by batch (the same posterior draws for every batch) or in chunks of tensors
        probs = (predict(data.test()) if root is not None else _eval_probs(predict, x_test)).mean(0)
        results[method] = {"accuracy": accuracy(probs, y_test).item(),
                           "ece": expected_calibration_error(probs, y_test).item(),
                           "nll": negative_log_likelihood(probs, y_test).item(), "train_seconds": seconds}
    lines = [described, "", "| method | accuracy | ECE (10 bins) | NLL | train s |", "|---|---|---|---|---|"]
    for method, r in results.items():
        lines.append(f"| {method} | {r['accuracy']:.4f} | {r['ece']:.4f} | {r['nll']:.4f} | {r['train_seconds']:.0f} |")
    summary = {"methods": results}
    if trained:
        name = "sdebnn-stl" if "sdebnn-stl" in trained else next(iter(trained))
        net, guide = trained[name]
        count = 50 if args.quick else 200
        if root is not None:
            x_tol, y_tol = data.first_test_images(count)
            x_tol, y_tol = x_tol.to(args.device), y_tol.to(args.device)
        else:
            x_tol, y_tol = x_test[:count], y_test[:count]
        tol_rows = _solver_tolerance(args, net, guide, x_tol, y_tol)
        lines += ["", f"Solver at test time ({name}, {count} test images, 4 samples):", "",
                  "| solver | seconds | accuracy | ECE |", "|---|---|---|---|"]
        lines += [f"| {r['solver']} | {r['seconds']:.2f} | {r['accuracy']:.4f} | {r['ece']:.4f} |" for r in tol_rows]
        summary["solver_tolerance"] = tol_rows
    (args.output / "sdebnn_mnist.md").write_text("\n".join(lines) + "\n")
    return summary
