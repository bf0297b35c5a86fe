# SPDX-License-Identifier: Apache-2.0
"""Training curves of the image benchmarks: recording while fitting, and the CSV / PNG files.

- :class:`Curve`: the curve of one run -- mean per-example training loss since the last point, test accuracy and
  NLL at each point.
- :func:`fit_with_curve`: the optimisation loop that feeds a :class:`Curve`: random minibatches of the bundled
  tensors (a point every ``--eval-every`` steps) or epochs over the full data set's loader (a point per epoch).
- :func:`late_gain`: the test-accuracy gain over the last third of training (about 0 once a method converged).
- :func:`write_curves`: every point as CSV, and one panel per quantity with one line per method (the mean over
  runs) as PNG.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch
from tqdm import tqdm

from pyro_sdebnn.data.loaders import iter_batches
from pyro_sdebnn.experiments import _harness as common
from pyro_sdebnn.experiments._images import ImageLoaders, predict_test_set
from pyro_sdebnn.infer import train_svi
from pyro_sdebnn.metrics import accuracy, negative_log_likelihood


class Curve:
    """Training curve of one run: mean per-example training loss since the last point, test accuracy and NLL.

    Set :attr:`predict` (``(inputs, num_samples) -> (S, n, C)`` class probabilities) before the first point; the
    test predictive uses ``samples`` draws, evaluated in chunks of 250 test images.
    """

    def __init__(self, data, y_test: torch.Tensor, num_data: int, samples: int) -> None:
        self.data, self.y_test, self.num_data, self.samples = data, y_test, num_data, samples
        self.predict: Callable | None = None
        self.rows: list[dict] = []
        self._losses: list[float] = []

    def add_loss(self, loss: float, per_example: bool = False) -> None:
        self._losses.append(float(loss) if per_example else float(loss) / self.num_data)

    def point(self, step: int) -> None:

        predict = self.predict
        if predict is None:
            raise RuntimeError("Curve.predict must be set before the first point")
        probs = predict_test_set(self.data, lambda xb: predict(xb, self.samples), chunk=250).mean(0)
        self.rows.append({"step": step, "train_loss": sum(self._losses) / max(len(self._losses), 1),
                          "test_accuracy": accuracy(probs, self.y_test).item(),
                          "test_nll": negative_log_likelihood(probs, self.y_test).item()})
        self._losses = []


def _batches(n, batch_size, steps, seed):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield torch.randint(0, n, (batch_size,), generator=generator)


def fit_with_curve(args, data, step, curve: Curve, desc: str, per_example: bool = False) -> None:
    """Call ``step(x_batch, y_batch, num_data) -> loss`` over the training data and record ``curve``.

    Bundled tensors: ``--steps`` random minibatches of ``--batch-size`` (indices drawn by a generator seeded by
    ``--seed``), a curve point every ``--eval-every`` steps (default ``--steps / 10``) and after the last.
    :class:`~pyro_sdebnn.experiments._images.ImageLoaders`: ``--epochs`` epochs over the training loader, a point
    after every epoch.

    :param bool per_example: ``step`` returns the mean loss per example (else the loss of all ``num_data``).
    """
    if isinstance(data, ImageLoaders):

        steps, n = 0, data.num_train
        for _ in tqdm(range(args.epochs), leave=False, desc=desc):
            for xb, yb in iter_batches(data.train(), args.device):
                curve.add_loss(step(xb, yb, n), per_example)
                steps += 1
            curve.point(steps)
        return
    x, y = (t.to(args.device) for t in data.train())
    n = x.shape[0]
    every = args.eval_every or max(1, args.steps // 10)
    batches = _batches(n, args.batch_size, args.steps, args.seed)
    for i, idx in enumerate(tqdm(batches, total=args.steps, desc=desc, leave=False), 1):
        curve.add_loss(step(x[idx], y[idx], n), per_example)
        if i % every == 0 or i == args.steps:
            curve.point(i)


def svi_fit_with_curve(args, svi, data, curve: Curve, desc: str) -> None:
    """:func:`fit_with_curve` for Pyro's ``SVI``: ``svi.step`` on random minibatches of the bundled tensors, or
    :func:`~pyro_sdebnn.infer.train_svi` for ``--epochs`` epochs over the full data set's loader (a point per
    epoch)."""
    if isinstance(data, ImageLoaders):
        per_epoch = math.ceil(data.num_train / data.batch_size)

        def callback(epoch, loss):
            curve.add_loss(loss)
            curve.point((epoch + 1) * per_epoch)

        train_svi(svi, data.train(), num_epochs=args.epochs, device=args.device, progress=True, callback=callback)
        return
    fit_with_curve(args, data, lambda xb, yb, n: svi.step(xb, yb, num_data=n), curve, desc)


def late_gain(rows: list[dict]) -> float:
    """Test-accuracy gain over the last third of training: final point minus the point at 2/3 of the steps."""
    last = rows[-1]["step"]
    earlier = [r for r in rows if r["step"] <= 2 * last / 3] or rows[:1]
    return rows[-1]["test_accuracy"] - earlier[-1]["test_accuracy"]


def write_curves(output: Path, stem: str, rows: Sequence[Mapping], x: str, panels: Mapping[str, str], *,
                 xlabel: str, over: str = "runs", log_scale: Sequence[str] = ()) -> None:
    """``{stem}.csv`` (every row) and ``{stem}.png``: one panel per key of ``panels`` (its title the value), one line
    per ``"method"`` of the rows, the mean over the rows (runs / seeds) at each value of ``x``.

    :param over: what the mean is over, for the titles (``"runs"``, ``"seeds"``).
    :param log_scale: the panels drawn with a logarithmic y axis.
    """
    common.write_csv(output / f"{stem}.csv", rows)
    fig = common.figure(figsize=(4.4 * len(panels), 3.6))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for j, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
        mine = [r for r in rows if r["method"] == method]
        xs = sorted({r[x] for r in mine})
        for ax, key in zip(axes, panels):
            ax.plot(xs, [sum(vs) / len(vs) for vs in ([r[key] for r in mine if r[x] == v] for v in xs)], marker=".",
                    color=f"C{j}", label=method)
    for ax, (key, title) in zip(axes, panels.items()):
        ax.set_xlabel(xlabel)
        ax.set_title(f"{title} (mean over {over})", fontsize=10)
        if key in log_scale:
            ax.set_yscale("log")
    axes[min(1, len(axes) - 1)].legend(fontsize=8)
    common.save_figure(fig, output / f"{stem}.png", dpi=110)
