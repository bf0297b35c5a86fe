# SPDX-License-Identifier: Apache-2.0
"""SDE-BNN vs ODE-Net, mean-field ODE-Net and ResNet (± mean-field VI) on image classification.

Table 1 of Xu et al. [1] at a laptop budget, over ``--seeds`` seeds (mean ± standard error), with training
curves. All methods share one continuous-depth conv net (:class:`~pyro_sdebnn.nn.SDEBNN`'s conv field: strided
conv down, tanh, transposed conv up, time as a channel; linear head), the same optimisation steps, batches and
learning rate:

- ``sdebnn`` / ``sdebnn-stl``: OU prior path over the field's weights, neural-SDE guide,
  :class:`~pyro_sdebnn.infer.TracePathKL_ELBO` with the ``analytic`` / ``stl`` estimator and KL coefficient
  :math:`\\kappa` (``--kl-scale``):

  .. math::

      -\\mathrm{ELBO}_\\kappa = -\\frac{N}{b}\\sum_{i \\in \\text{batch}} \\log p(y_i \\mid x_i, w_\\cdot)
      + \\kappa\\,\\widehat{\\mathrm{KL}}(q\\|p);

  with ``--adjoint`` they are trained by :meth:`~pyro_sdebnn.nn.SDEBNN.fused_loss` with ``adjoint=True``
  (torchsde's stochastic adjoint [3]; memory flat in the number of steps) and ``torch.optim.Adam``;
- ``odenet``: :class:`~pyro_sdebnn.nn.ODENet`, constant deterministic weights (σ → 0), cross-entropy
  (:meth:`~pyro_sdebnn.nn.ODENet.nll`), Adam;
- ``mf-odenet``: the same net's :meth:`~pyro_sdebnn.nn.ODENet.model` (N(0, 1) prior on the constant
  weights) with Pyro ``AutoNormal`` + ``TraceMeanField_ELBO``;
- ``resnet`` / ``mf-resnet``: :class:`~pyro_sdebnn.nn.ResNet`, K = round(1 / dt) independent weight
  vectors, one per Euler step (a discrete ResNet with K residual blocks), deterministic or mean-field VI.

Defaults follow the paper [1] and the authors' released code [4] where the paper is silent: posterior drift
MLP of widths 2, 128, 2 (``--drift-width``: a D → 2 bottleneck, one hidden layer of 128, 2 → D; [1], Sec. 5),
Euler–Maruyama on a fixed grid of dt = 0.05 (20 steps; the code's ``nsteps=20``), Adam at lr 1e-3 (the paper's
range [1e-4, 1e-3]), σ = 0.1 (from the paper's {0.1, 0.2, 0.5}), KL coefficient κ = 1e-3 (the code's
``kl_coef / train_size`` on the mean cross-entropy), no state augmentation, no data augmentation on MNIST and
random crops and flips on CIFAR-10 (:func:`~pyro_sdebnn.data.images.augmentation`).

Reported: test accuracy, ECE (10 bins, Guo et al. [2]), NLL, training time, per seed and as mean ± s.e., and the
training curves (per-example training loss and test accuracy / NLL every ``--eval-every`` steps, or every epoch
with ``--data-dir``) in ``sdebnn_mnist_curves.csv`` / ``.png``; the table's last column is the test-accuracy gain
over the last third of training (≈ 0 once a method has converged). The claim checked is that of [1]: SDE-BNN at
least as accurate as ODE-Net with lower ECE. A second part times the first seed's trained SDE-BNN's prediction
with fixed-step and adaptive solvers ([1], Fig. 6: tolerance vs accuracy/time).

Data: ``mnist_subset`` (default), ``digits`` (``--quick``), or, with ``--data-dir DIR``, the full
``mnist``, ``fashion_mnist`` or ``cifar10`` from the torchvision files in ``DIR``. ``--downsample F`` average-pools
the bundled images by F (a cheaper CPU run). The full data sets are read through a
:class:`~torch.utils.data.DataLoader` (one batch on the device at a time;
:func:`~pyro_sdebnn.infer.svi_training.train_svi` for the Bayesian methods), for ``--epochs`` epochs
(default: enough epochs to make ``--steps`` steps); nothing is downloaded unless ``--download`` is given.

**References**

1. W. Xu, R. T. Q. Chen, X. Li, D. Duvenaud (2022). Infinitely Deep Bayesian Neural Networks with
   Stochastic Differential Equations. AISTATS 2022, PMLR 151. arXiv:2102.06559.
2. C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger (2017). On Calibration of Modern Neural Networks.
   ICML 2017.
3. X. Li, T.-K. L. Wong, R. T. Q. Chen, D. Duvenaud (2020). Scalable Gradients for Stochastic Differential
   Equations. AISTATS 2020. arXiv:2001.01328.
4. W. Xu, R. T. Q. Chen, X. Li, D. Duvenaud (2022). Code of [1], ``examples/jax/sdebnn_classification.py``,
   https://github.com/xwinxu/bayeSDE.
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

from pyro_sdebnn.experiments._common import cpu_threads
from pyro_sdebnn.experiments._curves import late_gain, report
from pyro_sdebnn.infer import NeuralSDEGuide, TracePathKL_ELBO
from pyro_sdebnn.metrics import accuracy, expected_calibration_error, negative_log_likelihood
from pyro_sdebnn.nn import SDEBNN, ODENet, ResNet

NAME = "sdebnn-mnist"
DESCRIPTION = "SDE-BNN (+STL) vs ODE-Net, mean-field ODE-Net and ResNet±MFVI: accuracy, ECE, curves, solver tolerance"

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
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, default=16, help="hidden channels of the conv field")
    parser.add_argument("--augment", type=int, default=0, help="zero channels appended to the input state")
    parser.add_argument("--sigma", type=float, default=0.1)
    parser.add_argument("--dt", type=float, default=0.05)
    parser.add_argument("--drift-width", default="2,128,2",
                        help="widths of the posterior drift MLP: B,H,...,H,B (bottleneck B) or H,...,H")
    parser.add_argument("--kl-scale", type=float, default=1e-3, help="KL coefficient kappa of the SDE-BNN's ELBO")
    parser.add_argument("--adjoint", action="store_true",
                        help="train the SDE-BNN by fused_loss(adjoint=True) (torchsde's stochastic adjoint)")
    parser.add_argument("--methods", default=",".join(METHOD_NAMES))
    parser.add_argument("--seeds", type=int, default=1, help="independent runs --seed, --seed + 1, ...")
    parser.add_argument("--downsample", type=int, default=1, help="average-pool the bundled images by this factor")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="steps between curve points (default: --steps / 10; every epoch with --data-dir)")
    parser.add_argument("--samples", type=int, default=16, help="posterior samples at test time")
    parser.add_argument("--threads", type=int, default=1)


def drift_widths(text: str) -> tuple[int | None, int, int]:
    """``(bottleneck, hidden, layers)`` of ``--drift-width``: ``"2,128,2"`` -> ``(2, 128, 1)``, ``"64,64"`` ->
    ``(None, 64, 2)``.

    :raises ValueError: (``--drift-width: ...``) unless the widths are positive integers of the form
        ``B,H,...,H,B`` with ``B < H`` or ``H,...,H``.
    """
    try:
        widths = [int(v) for v in str(text).split(",")]
    except ValueError:
        widths = []
    bottleneck, hidden = None, widths
    if len(widths) >= 3 and widths[0] == widths[-1] and widths[0] < min(widths[1:-1]):
        bottleneck, hidden = widths[0], widths[1:-1]
    if not widths or min(widths) < 1 or len(set(hidden)) != 1:
        raise ValueError(f"--drift-width: expected comma-separated positive widths B,H,...,H,B (bottleneck B < H) or "
                         f"H,...,H, got {text!r}")
    return bottleneck, hidden[0], len(hidden)


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


def _load(args, seed: int):
    from pyro_sdebnn import data

    split = data.digits(seed=seed) if args.quick or args.dataset == "digits" else data.mnist_subset(seed=seed)
    if args.downsample > 1:
        pool = lambda x: torch.nn.functional.avg_pool2d(x, args.downsample)  # noqa: E731
        split = split._replace(x_train=pool(split.x_train), x_test=pool(split.x_test))
    return split


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


def _test_probs(data, predict, samples: int, device) -> torch.Tensor:
    """Mean predictive probabilities ``(N, 10)`` on the test set (streamed, or in chunks of tensors)."""
    fn = lambda xb: predict(xb, samples)  # noqa: E731
    if isinstance(data, ImageLoaders):
        return fn(data.test()).mean(0)
    return _eval_probs(fn, data.x_test.to(device)).mean(0)


class Curve:
    """Training curve of one run: mean per-example training loss since the last point, test accuracy and NLL."""

    def __init__(self, data, y_test: torch.Tensor, num_data: int, samples: int) -> None:
        self.data, self.y_test, self.num_data, self.samples = data, y_test, num_data, samples
        self.device = y_test.device
        self.predict = None
        self.rows: list[dict] = []
        self._losses: list[float] = []

    def add_loss(self, loss: float, per_example: bool = False) -> None:
        self._losses.append(float(loss) if per_example else float(loss) / self.num_data)

    def point(self, step: int) -> None:
        probs = _test_probs(self.data, self.predict, self.samples, self.device)
        self.rows.append({"step": step, "train_loss": sum(self._losses) / max(len(self._losses), 1),
                          "test_accuracy": accuracy(probs, self.y_test).item(),
                          "test_nll": negative_log_likelihood(probs, self.y_test).item()})
        self._losses = []


def _tensor_fit(args, data, step, curve: Curve, desc: str, per_example: bool = False) -> None:
    """``--steps`` random minibatches of the bundled tensors; a curve point every ``--eval-every`` steps."""
    x, y, n = data.x_train.to(args.device), data.y_train.to(args.device), data.x_train.shape[0]
    every = args.eval_every or max(1, args.steps // 10)
    for i, idx in enumerate(tqdm(_batches(n, args.batch_size, args.steps, args.seed), total=args.steps, desc=desc,
                                 leave=False), 1):
        curve.add_loss(step(x[idx], y[idx], n), per_example)
        if i % every == 0 or i == args.steps:
            curve.point(i)


def _loader_fit(args, data, step, curve: Curve, desc: str, per_example: bool = False) -> None:
    """``--epochs`` epochs over the full data set's loader; a curve point after every epoch."""
    from pyro_sdebnn.data.loaders import iter_batches

    steps, n = 0, len(data.train_set)
    for _ in tqdm(range(args.epochs), leave=False, desc=desc):
        for xb, yb in iter_batches(data.train(), args.device):
            curve.add_loss(step(xb, yb, n), per_example)
            steps += 1
        curve.point(steps)


def _svi_fit(args, svi, data, curve: Curve, desc):
    """SVI steps: random minibatches of the bundled tensors, or epochs over the full data set's loader."""
    from pyro_sdebnn.infer import train_svi

    if isinstance(data, ImageLoaders):
        per_epoch = math.ceil(len(data.train_set) / data.batch_size)

        def callback(epoch, loss):
            curve.add_loss(loss)
            curve.point((epoch + 1) * per_epoch)

        train_svi(svi, data.train(), num_epochs=args.epochs, device=args.device, progress=True, callback=callback)
        return
    _tensor_fit(args, data, lambda xb, yb, n: svi.step(xb, yb, num_data=n), curve, desc)


def _shape(data):
    return data.shape() if isinstance(data, ImageLoaders) else tuple(data.x_train.shape[1:])


def _train_sdebnn(args, data, method: str, curve: Curve):
    estimator = "stl" if method == "sdebnn-stl" else "analytic"
    net = _net(args, _shape(data))
    bottleneck, hidden, layers = drift_widths(args.drift_width)
    guide = NeuralSDEGuide(net, drift_hidden=hidden, drift_layers=layers, bottleneck=bottleneck)
    curve.predict = lambda xb, s: net.predict(xb, guide, num_samples=s).probs  # noqa: E731
    if not args.adjoint:
        elbo = TracePathKL_ELBO(estimator=estimator, kl_scale=args.kl_scale)
        _svi_fit(args, SVI(net.model, guide, Adam({"lr": args.lr}), elbo), data, curve, method)
        return curve.predict, (net, guide)
    # the stochastic adjoint: one torchsde solve of weights, hidden state and KL per step, torch's Adam
    xb = data.first_test_images(2)[0] if isinstance(data, ImageLoaders) else data.x_test[:2]
    guide.get_posterior(xb.to(args.device))  # builds the drift net
    opt = torch.optim.Adam(list(net.parameters()) + list(guide.parameters()), lr=args.lr)

    def step(xb, yb, n):
        opt.zero_grad()
        try:
            loss = net.fused_loss(xb, yb, guide, estimator=estimator, adjoint=True, num_data=n,
                                  kl_scale=args.kl_scale)
        except ValueError as err:
            raise ValueError(f"--adjoint with method {method!r} (estimator {estimator!r}): {err}") from err
        loss.backward()
        opt.step()
        return loss.item()

    (_loader_fit if isinstance(data, ImageLoaders) else _tensor_fit)(args, data, step, curve, method)
    return curve.predict, (net, guide)


def _baseline(args, shape, method: str):
    # built right after pyro.set_rng_seed(seed), like _net: same initial field weights and head as the SDE-BNN
    common = dict(hidden=args.hidden, augment=args.augment, likelihood="categorical", prior_scale=1.0)
    if method.endswith("odenet"):
        net = ODENet(shape, 10, dt=args.dt, **common)
    else:
        blocks = max(1, round(1.0 / args.dt))  # as many residual blocks as the continuous nets' Euler steps on (0, 1)
        net = ResNet(shape, 10, blocks=blocks, **common)
    return net.to(args.device)


def _deterministic(args, data, method: str, curve: Curve):
    net = _baseline(args, _shape(data), method)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    curve.predict = lambda xb, s: net.predict(xb).probs  # noqa: E731

    def step(xb, yb, n):
        opt.zero_grad()
        loss = net.nll(xb, yb)
        loss.backward()
        opt.step()
        return loss.item()

    (_loader_fit if isinstance(data, ImageLoaders) else _tensor_fit)(args, data, step, curve, method, per_example=True)
    return curve.predict, None


def _mean_field(args, data, method: str, curve: Curve):
    net = _baseline(args, _shape(data), method)
    # start at the deterministic nets' initial weights (zero weights are a saddle of the field), tiny scale
    guide = AutoNormal(net.model, init_loc_fn=init_to_value(values={"w": net.weights.detach()}), init_scale=1e-3)
    curve.predict = lambda xb, s: net.predict(xb, guide, num_samples=s).probs  # noqa: E731
    svi = SVI(net.model, guide, Adam({"lr": args.lr}), TraceMeanField_ELBO())
    _svi_fit(args, svi, data, curve, method)
    return curve.predict, None


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
    with cpu_threads(args.threads):
        return _run(args)


def _check_args(args, root) -> list[str]:
    dataset = args.dataset or ("mnist" if root is not None else "mnist_subset")
    if dataset in ("mnist_subset", "digits") and root is not None and args.dataset is not None:
        raise ValueError(f"--dataset {dataset} is bundled; --data-dir is for mnist, fashion_mnist or cifar10")
    if dataset not in ("mnist_subset", "digits") and root is None:
        raise ValueError(f"--dataset {dataset} needs --data-dir DIR, the folder with its torchvision files")
    args.dataset = dataset
    for name in ("seeds", "downsample", "steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.downsample > 1 and root is not None:
        raise ValueError("--downsample is for the bundled images; with --data-dir the images keep their size")
    if not (args.kl_scale >= 0 and math.isfinite(args.kl_scale)):
        raise ValueError(f"--kl-scale must be a finite float >= 0, got {args.kl_scale}")
    drift_widths(args.drift_width)
    if args.quick:  # a smoke run: few steps, a coarse grid, a narrow field, three curve points
        args.steps, args.samples = min(args.steps, 60), min(args.samples, 4)
        args.dt, args.hidden = max(args.dt, 0.25), min(args.hidden, 8)
        args.eval_every = args.eval_every or max(1, args.steps // 3)
    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(METHOD_NAMES)
    if unknown:
        raise ValueError(f"--methods: unknown {sorted(unknown)}; choose from {METHOD_NAMES}")
    return methods


def _run(args: argparse.Namespace) -> dict:
    root = data_dir(args)
    methods = _check_args(args, root)
    first_seed = args.seed
    per_seed: dict[str, list[dict]] = {m: [] for m in methods}
    curves: list[dict] = []
    trained = {}
    for seed in range(first_seed, first_seed + args.seeds):
        args.seed = seed
        pyro.set_rng_seed(seed)
        if root is not None:
            data = ImageLoaders(args, args.dataset, root, args.batch_size)
            args.epochs = data.epochs(args.steps, getattr(args, "epochs", None))
            y_test, num_data = data.test_labels().to(args.device), len(data.train_set)
            described = (f"dataset {args.dataset} (full: {len(data.train_set)} train / {len(data.test_set)} test "
                         f"images, DataLoader{', random crop + flip' if data.augmented else ''}), {args.epochs} "
                         f"epochs x batch {args.batch_size}")
        else:
            data = _load(args, seed)
            y_test, num_data = data.y_test.to(args.device), data.x_train.shape[0]
            size = "x".join(str(s) for s in data.x_train.shape[2:])
            described = (f"dataset {args.dataset if not args.quick else 'digits'}, {args.steps} steps x batch "
                         f"{args.batch_size}" + (f" ({size} images, average-pooled by {args.downsample})"
                                                 if args.downsample > 1 else ""))
        for method in methods:
            pyro.clear_param_store()
            pyro.set_rng_seed(seed)
            curve = Curve(data, y_test, num_data, min(args.samples, 4))
            start = time.perf_counter()
            if method.startswith("sdebnn"):
                predict, extra = _train_sdebnn(args, data, method, curve)
                trained.setdefault(method, extra)
            elif method in ("odenet", "resnet"):
                predict, _ = _deterministic(args, data, method, curve)
            else:
                predict, _ = _mean_field(args, data, method, curve)
            seconds = time.perf_counter() - start  # includes the curve's test evaluations
            probs = _test_probs(data, predict, args.samples, args.device)
            per_seed[method].append({"seed": seed, "accuracy": accuracy(probs, y_test).item(),
                                     "ece": expected_calibration_error(probs, y_test).item(),
                                     "nll": negative_log_likelihood(probs, y_test).item(), "train_seconds": seconds,
                                     "late_gain": late_gain(curve.rows)})
            curves += [{"method": method, "seed": seed, **row} for row in curve.rows]
        lines, results = report(args, first_seed, described, per_seed, curves)  # rewritten after every seed
    args.seed = first_seed
    summary = {"methods": results, "curves": curves}
    if trained:
        name = "sdebnn-stl" if "sdebnn-stl" in trained else next(iter(trained))
        net, guide = trained[name]
        count = 50 if args.quick else 200
        if root is not None:
            x_tol, y_tol = ImageLoaders(args, args.dataset, root, args.batch_size).first_test_images(count)
        else:
            first = _load(args, first_seed)
            x_tol, y_tol = first.x_test[:count], first.y_test[:count]
        tol_rows = _solver_tolerance(args, net, guide, x_tol.to(args.device), y_tol.to(args.device))
        lines += ["", f"Solver at test time ({name}, seed {first_seed}, {count} test images, 4 samples):", "",
                  "| solver | seconds | accuracy | ECE |", "|---|---|---|---|"]
        lines += [f"| {r['solver']} | {r['seconds']:.2f} | {r['accuracy']:.4f} | {r['ece']:.4f} |" for r in tol_rows]
        summary["solver_tolerance"] = tol_rows
    (args.output / "sdebnn_mnist.md").write_text("\n".join(lines) + "\n")
    return summary
