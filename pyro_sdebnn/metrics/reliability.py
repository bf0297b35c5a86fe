# SPDX-License-Identifier: Apache-2.0
"""The reliability diagram: accuracy against confidence per bin, with the ECE in the legend."""

from __future__ import annotations

from pathlib import Path

from ._validation import _check_probs
from .calibration import _ece_from_bins, calibration_bins

__all__ = ["reliability_diagram"]


def reliability_diagram(probs, labels, num_bins: int = 10, *, path=None, title: str | None = None, ax=None):
    """Plot a reliability diagram (and a confidence histogram) of a classification predictive.

    Bars show the accuracy :math:`\\mathrm{acc}(I_b)` of each equal-width confidence bin (see
    :func:`~pyro_sdebnn.metrics.calibration_bins`), the red segments the gap to the bin's mean
    confidence :math:`\\mathrm{conf}(I_b)`; a calibrated predictor follows the diagonal. The legend
    gives the :func:`~pyro_sdebnn.metrics.expected_calibration_error` with the same bins. A lower panel
    shows the fraction of points per bin.

    For binary ``(N,)`` positive-class probabilities the bars are the frequency of class 1 against the
    predicted probability of class 1 (the convention of
    :func:`~pyro_sdebnn.metrics.calibration_bins`), and the axes are labelled so.

    Uses :class:`matplotlib.figure.Figure` directly (no pyplot state), so it works with any backend,
    including Agg on machines without a display.

    :param probs: ``(N, C)`` class probabilities or ``(N,)`` positive-class probabilities.
    :param labels: ``(N,)`` integer labels.
    :param int num_bins: number of equal-width confidence bins.
    :param path: optional file name; the figure is saved there as PNG (folders are created).
    :param str title: optional title.
    :param ax: optional :class:`matplotlib.axes.Axes` to draw the diagram on (no histogram then);
        its figure is returned.
    :return: the :class:`matplotlib.figure.Figure`.

    >>> probs = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.8, 0.2]])
    >>> figure = reliability_diagram(probs, torch.tensor([0, 1, 1]), num_bins=5)
    >>> type(figure).__name__, len(figure.axes)
    ('Figure', 2)
    """
    from matplotlib.figure import Figure

    binary = _check_probs(probs)[1]
    bins = calibration_bins(probs, labels, num_bins)
    if binary:
        x_label, y_label = "predicted probability of class 1", "frequency of class 1"
    else:
        x_label, y_label = "confidence", "accuracy"
    count = bins.count.detach().cpu().double()
    nonempty = count > 0
    edges = bins.edges.detach().cpu().double().numpy()
    left, width = edges[:-1], edges[1:] - edges[:-1]
    accuracy = bins.accuracy.detach().cpu().double().nan_to_num(0.0).numpy()
    confidence = bins.confidence.detach().cpu().double().nan_to_num(0.0).numpy()
    weight = (count / count.sum()).numpy()
    ece = float(_ece_from_bins(bins))

    if ax is None:
        figure = Figure(figsize=(4.5, 5.5), layout="constrained")
        ax, ax_hist = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": (3, 1)})
    else:
        figure, ax_hist = ax.figure, None
    mask = nonempty.numpy()
    ax.bar(
        left[mask],
        accuracy[mask],
        width=width[mask],
        align="edge",
        edgecolor="black",
        color="tab:blue",
        label=f"{y_label} (ECE = {ece:.3f})",
    )
    ax.bar(
        left[mask],
        (confidence - accuracy)[mask],
        bottom=accuracy[mask],
        width=width[mask],
        align="edge",
        edgecolor="tab:red",
        color="tab:red",
        alpha=0.3,
        label="gap to confidence",
    )
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", label="perfect calibration")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel(y_label)
    ax.legend(loc="upper left", fontsize="small")
    if title:
        ax.set_title(title)
    if ax_hist is not None:
        ax_hist.bar(left, weight, width=width, align="edge", edgecolor="black", color="gray")
        ax_hist.set_xlabel(x_label)
        ax_hist.set_ylabel("fraction")
    else:
        ax.set_xlabel(x_label)
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="png", dpi=120)
    return figure
