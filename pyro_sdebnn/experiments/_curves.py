# SPDX-License-Identifier: Apache-2.0
"""Tables and training curves of the image benchmark over several seeds (mean ± standard error).

The standard error of a mean over :math:`n` seeds is :math:`s / \\sqrt{n}` with :math:`s` the sample standard
deviation (Bessel-corrected).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

__all__ = ["late_gain", "mean_se", "report", "write_curves"]


def mean_se(values: list[float]) -> tuple[float, float]:
    """``(mean, standard error)`` of ``values``; the error is NaN for a single value.

    >>> mean_se([1.0, 2.0, 3.0])
    (2.0, 0.5773502691896257)
    """
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


def late_gain(rows: list[dict]) -> float:
    """Test-accuracy gain over the last third of training: final point minus the point at 2/3 of the steps."""
    last = rows[-1]["step"]
    earlier = [r for r in rows if r["step"] <= 2 * last / 3] or rows[:1]
    return rows[-1]["test_accuracy"] - earlier[-1]["test_accuracy"]


def report(args, first_seed: int, described: str, per_seed: dict, curves: list[dict]) -> tuple[list[str], dict]:
    """The table (mean ± s.e. over the seeds done so far, and per seed) and the curves, written to ``--output``."""
    per_seed = {m: runs for m, runs in per_seed.items() if runs}
    results = {}
    for method, runs in per_seed.items():
        results[method] = {key: mean_se([r[key] for r in runs])[0] for key in runs[0] if key != "seed"}
        results[method].update({f"{key}_se": mean_se([r[key] for r in runs])[1] for key in ("accuracy", "ece", "nll")})
        results[method]["runs"] = runs
    seeds = len(next(iter(per_seed.values())))
    settings = (f"dt {args.dt:g}, sigma {args.sigma:g}, kl-scale {args.kl_scale:g}, drift {args.drift_width}, "
                f"lr {args.lr:g}, hidden {args.hidden}, augment {args.augment}{', adjoint' if args.adjoint else ''}; "
                f"{seeds} seed(s) from {first_seed}; mean ± s.e.")
    lines = [described, "", settings, "",
             "| method | accuracy | ECE (10 bins) | NLL | train s | accuracy gain, last third |",
             "|---|---|---|---|---|---|"]
    for method, r in results.items():
        lines.append(f"| {method} | {r['accuracy']:.4f} ± {r['accuracy_se']:.4f} "
                     f"| {r['ece']:.4f} ± {r['ece_se']:.4f} "
                     f"| {r['nll']:.4f} ± {r['nll_se']:.4f} | {r['train_seconds']:.0f} | {r['late_gain']:+.4f} |")
    lines += ["", "Per seed:", "", "| method | seed | accuracy | ECE | NLL |", "|---|---|---|---|---|"]
    lines += [f"| {m} | {r['seed']} | {r['accuracy']:.4f} | {r['ece']:.4f} | {r['nll']:.4f} |"
              for m, runs in per_seed.items() for r in runs]
    write_curves(args.output, curves)
    (args.output / "sdebnn_mnist.md").write_text("\n".join(lines) + "\n")
    return lines, results


def write_curves(output: Path, curves: list[dict]) -> None:
    """``sdebnn_mnist_curves.csv`` (every point of every run) and ``.png`` (mean over seeds per method)."""
    with open(output / "sdebnn_mnist_curves.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["method", "seed", "step", "train_loss", "test_accuracy", "test_nll"])
        writer.writeheader()
        writer.writerows(curves)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for j, method in enumerate(dict.fromkeys(c["method"] for c in curves)):
        steps = sorted({c["step"] for c in curves if c["method"] == method})
        for ax, key in zip(axes, ("train_loss", "test_accuracy", "test_nll")):
            mean = [sum(v) / len(v) for v in ([c[key] for c in curves if c["method"] == method and c["step"] == s]
                                              for s in steps)]
            ax.plot(steps, mean, marker=".", color=f"C{j}", label=method)
    for ax, label in zip(axes, ("training loss per example", "test accuracy", "test NLL")):
        ax.set_xlabel("optimisation step")
        ax.set_title(label + " (mean over seeds)", fontsize=10)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(output / "sdebnn_mnist_curves.png", dpi=110)
    plt.close(fig)
