# SPDX-License-Identifier: Apache-2.0
"""Evaluation and report code shared by the experiments, so that each experiment file is a script of its protocol.

An experiment (see :mod:`pyro_sdebnn.experiments`) builds its data, trains its methods and calls these for the
rest. The module's name starts with an underscore, so :func:`~pyro_sdebnn.experiments.discover` does not take it
for a benchmark.

**Running**

- :func:`cpu_threads`: ``with cpu_threads(1, device):`` -- torch's intra-op CPU threads for the block, restored
  afterwards (small networks on a shared CPU only lose time to synchronisation between threads).
- :func:`check_methods`: the ``--methods`` asked for, checked against those the experiment knows.
- :func:`fresh_start`: seed torch, NumPy and Python (``pyro.set_rng_seed``) and clear Pyro's parameter store
  before each method, so that methods neither see each other's parameters nor depend on the order they run in.
- :class:`Timer`: ``with Timer() as timer: ...``; then ``timer.seconds`` is the block's wall time.
- :class:`Interrupted`: what an experiment raises on Ctrl-C after writing the results finished so far.

**Evaluation**

- :func:`classification_metrics`: accuracy, ECE (several bin counts), Brier score and NLL of class probabilities.
- :func:`calibrated_metrics`: the same, plus the scores after temperature scaling fitted on a validation set.
- :func:`regression_metrics`: test log-likelihood and RMSE of a Gaussian-mixture predictive, in original units.
- :func:`mean_se`, :func:`summarise`: mean and standard error over splits or runs, of one value or of each column
  of result rows.

**Reports**

- :func:`write_csv`, :func:`markdown_table`, :func:`fmt`, :func:`fmt_mean_se`: result tables as CSV and Markdown.
- :func:`write_readme`: a result folder's ``README.md`` (title, paragraphs, tables).
- :func:`figure`, :func:`save_figure`: a pyplot-free :class:`matplotlib.figure.Figure` (any backend, no global
  state) and saving it.
- :func:`plot_reliability_curves`: one reliability curve per method on one set of axes.
- :func:`plot_grid_heatmaps`, :func:`plot_uncertainty_decomposition`: predictive maps over a 2-D input grid.
- :func:`write_chain_diagnostics`: ESS per second, trace and autocorrelation plots of MCMC draws of a few
  scalar predictions (function-space diagnostics); :func:`chain_autocorr_figure` draws the latter.
"""

from __future__ import annotations

import contextlib
import csv
import math
import statistics
import textwrap
import time
import warnings
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import pyro
import torch
from torch import Tensor

from pyro_sdebnn.infer.mcmc.arviz import function_space_diagnostics
from pyro_sdebnn.metrics import (
    accuracy,
    brier_score,
    calibration_bins,
    expected_calibration_error,
    fit_temperature,
    gaussian_mixture_log_likelihood,
    negative_log_likelihood,
    rmse,
    temperature_scale,
    uncertainty_decomposition,
)


# --------------------------------------------------------------------------- running
@contextlib.contextmanager
def cpu_threads(num_threads: int = 1, device=None) -> Iterator[None]:
    """Run the block with ``num_threads`` torch intra-op threads on the CPU; restore the previous number after.

    :param int num_threads: threads for the block (at least 1).
    :param device: the experiment's device; for a non-CPU device the thread count is left alone.
    """
    threads = torch.get_num_threads()
    if device is None or torch.device(device).type == "cpu":
        torch.set_num_threads(max(1, int(num_threads)))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def check_methods(requested: Sequence[str], known: Sequence[str]) -> list[str]:
    """The methods of ``--methods`` as a list, each checked to be one of ``known``, at least one and none twice
    (a method run twice would count as two runs in the tables).

    :raises ValueError: (``--methods: unknown [...]; choose from ...``) naming the unknown or repeated ones.
    """
    unknown = sorted(set(requested) - set(known))
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {known}")
    if not requested:
        raise ValueError(f"--methods: no method given; choose from {known}")
    repeated = sorted({m for m in requested if list(requested).count(m) > 1})
    if repeated:
        raise ValueError(f"--methods: {repeated} given more than once")
    return list(requested)


def fresh_start(seed: int) -> None:
    """Seed torch, NumPy and Python with ``seed`` (``pyro.set_rng_seed``) and clear Pyro's parameter store.

    Called before each method of an experiment, so that every method starts from the same random state whatever
    ran before it.
    """
    pyro.set_rng_seed(seed)
    pyro.clear_param_store()


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) during an experiment, raised after it wrote the tables of what was finished.

    An experiment catches the ``KeyboardInterrupt`` of its loop, writes its tables (and figures) of the
    finished methods, and raises this instead; the command line then writes ``summary.json`` from ``summary``, adds
    a line saying the run was interrupted to ``README.md`` and exits with status 130.

    :param dict summary: the experiment's summary of the finished part (as ``run`` would return it).
    :param str progress: what was finished, e.g. ``"7 of 13 methods finished"``.
    """

    def __init__(self, summary: dict, progress: str) -> None:
        super().__init__(progress)
        self.summary = summary
        self.progress = progress


class Timer:
    """Wall time of a ``with`` block (``time.perf_counter``): ``with Timer() as t: ...``, then ``t.seconds``.

    ``seconds`` is NaN until the block ends (also when it raises, so a failed fit is not timed).
    """

    def __init__(self) -> None:
        self.seconds = float("nan")
        self._start = 0.0

    def __enter__(self) -> "Timer":
        self._start = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.seconds = time.perf_counter() - self._start


# --------------------------------------------------------------------------- evaluation
def classification_metrics(probs: Tensor, labels: Tensor, *, ece_bins: Sequence[int] = (10, 15, 20)) -> dict:
    """Accuracy, ECE, Brier score and NLL (nats) of class probabilities ``probs`` ``(N, C)`` for ``labels``.

    The ECE (:func:`~pyro_sdebnn.metrics.expected_calibration_error`, equal-width bins) is computed for each bin
    count of ``ece_bins``: the first is ``"ece"``, the others ``"ece{bins}"`` (e.g. 10 bins as in Naeini et al.
    2015, 15 as in Guo et al. 2017, "On Calibration of Modern Neural Networks", ICML; 20 as in Schmitt & Roth
    2021, GCPR).

    :return: ``{"accuracy", "ece", "ece15", "ece20", "brier", "nll"}`` (with the default ``ece_bins``) as floats.
    """

    if not ece_bins:
        raise ValueError("ece_bins must name at least one bin count")
    metrics = {"accuracy": float(accuracy(probs, labels))}
    for i, bins in enumerate(ece_bins):
        metrics["ece" if i == 0 else f"ece{bins}"] = float(expected_calibration_error(probs, labels, num_bins=bins))
    metrics["brier"] = float(brier_score(probs, labels))
    metrics["nll"] = float(negative_log_likelihood(probs, labels))
    return metrics


def calibrated_metrics(test_probs: Tensor, y_test: Tensor, val_probs: Tensor, y_val: Tensor) -> dict:
    """:func:`classification_metrics` of the test predictive, before and after temperature scaling.

    Temperature scaling (Guo et al. 2017, "On Calibration of Modern Neural Networks", ICML) divides the
    predictive log-probabilities by :math:`T` fitted by NLL on the validation set
    (:func:`~pyro_sdebnn.metrics.fit_temperature`), :math:`p_T \\propto \\bar p^{1/T}`.

    :return: the metrics of :func:`classification_metrics`, plus ``"ece_ts"``, ``"brier_ts"``, ``"nll_ts"``
        after scaling and ``"temperature"``.
    """

    def log_probs(probs: Tensor) -> Tensor:
        return probs.double().clamp_min(1e-12).log()

    metrics = classification_metrics(test_probs, y_test)
    temperature = fit_temperature(log_probs(val_probs), y_val)
    scaled = temperature_scale(log_probs(test_probs), temperature).to(test_probs.dtype)
    scaled_metrics = classification_metrics(scaled, y_test)
    metrics.update({f"{k}_ts": scaled_metrics[k] for k in ("ece", "brier", "nll")})
    metrics["temperature"] = float(temperature)
    return metrics


def regression_metrics(pred, y: Tensor, y_scale: float = 1.0, mask: Tensor | None = None) -> dict:
    """Test log-likelihood (mean per point) and RMSE of a Gaussian-mixture predictive, in original units.

    :param pred: a :class:`~pyro_sdebnn.predictive.RegressionPrediction` (``loc``/``scale`` ``(S, N)``).
    :param Tensor y: standardised targets ``(N,)``.
    :param float y_scale: the standard deviation used to standardise the targets (1: already original units).
    :param mask: optional ``(N,)`` boolean mask: score only these points (e.g. a region of the inputs).
    :return: ``{"test_ll": ..., "rmse": ...}``, see :func:`~pyro_sdebnn.metrics.gaussian_mixture_log_likelihood`
        and :func:`~pyro_sdebnn.metrics.rmse`.
    """

    loc, scale, mean = pred.loc, pred.scale, pred.mean
    if mask is not None:
        loc, scale, mean, y = loc[:, mask], scale[:, mask], mean[mask], y[mask]
    return {
        "test_ll": float(gaussian_mixture_log_likelihood(loc, scale, y, y_scale=y_scale)),
        "rmse": float(rmse(mean, y, y_scale=y_scale)),
    }


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error :math:`s / \\sqrt n` (sample standard deviation :math:`s`) of ``values``.

    The standard error is NaN for a single value.
    """
    values = list(values)
    if not values:
        raise ValueError("mean_se needs at least one value")
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return mean, se


def summarise(rows: Sequence[Mapping], columns: Sequence[str]) -> dict[str, tuple[float, float]]:
    """``{column: (mean, standard error)}`` over ``rows`` (one per run or seed) for each of ``columns``
    (:func:`mean_se`).

    >>> summarise([{"acc": 0.5}, {"acc": 0.7}], ["acc"])["acc"][0]
    0.6
    """
    return {column: mean_se([row[column] for row in rows]) for column in columns}


# --------------------------------------------------------------------------- tables
def fmt(value, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals; ``""`` for ``None`` and NaN (an empty table cell)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.{digits}f}"


def fmt_mean_se(value: tuple[float, float], spec: str = ".4f", *, keep_nan: bool = False) -> str:
    """``"mean ± se"`` of a :func:`mean_se` pair in the format ``spec``; a NaN standard error (a single run) is
    left out unless ``keep_nan``.

    >>> fmt_mean_se((0.5, 0.01), ".2f"), fmt_mean_se((0.5, float("nan")), ".2f")
    ('0.50 ± 0.01', '0.50')
    """
    mean, se = value
    return f"{mean:{spec}}" + ("" if math.isnan(se) and not keep_nan else f" ± {se:{spec}}")


def write_csv(path, rows: Sequence[Mapping], fieldnames: Sequence[str] | None = None) -> None:
    """Write ``rows`` (dicts) as a CSV file with a header; ``fieldnames`` defaults to the first row's keys.

    Keys missing from a row give empty cells; floats are written in full precision (``repr``).
    """
    rows = list(rows)
    if fieldnames is None:
        if not rows:
            raise ValueError("write_csv: no rows and no fieldnames")
        fieldnames = list(rows[0])
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fieldnames))
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A Markdown (GitHub) table of ``rows`` of cells, already formatted (``str`` is applied); ends with a newline.

    >>> print(markdown_table(["method", "ECE"], [["MAP", "0.043"]]), end="")
    | method | ECE |
    |---|---|
    | MAP | 0.043 |
    """
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_readme(path, title: str, blocks: Sequence[str]) -> None:
    """Write a result folder's ``README.md``: ``# title`` then each block (paragraph, table, list) in turn."""
    text = [f"# {title}", ""]
    for block in blocks:
        text += [block.rstrip("\n"), ""]
    Path(path).write_text("\n".join(text))


# --------------------------------------------------------------------------- figures
def figure(**kwargs):
    """A :class:`matplotlib.figure.Figure` (keyword arguments as there), without pyplot: no global state, no
    backend switch, nothing to close; draw with ``fig.subplots(...)`` and write with :func:`save_figure`."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def save_figure(fig, path, dpi: int = 120) -> None:
    """Lay ``fig`` out tightly and save it as ``path`` (PNG by the suffix)."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)


def _grid_shape(count: int, max_columns: int) -> tuple[int, int]:
    """``(rows, columns)`` of a grid of ``count`` panels, at most ``max_columns`` wide."""
    columns = max(1, min(count, max_columns))
    return -(-count // columns), columns


def _wrap(title: str, width: int = 30) -> str:
    return "\n".join(textwrap.wrap(title, width)) or title


def plot_reliability_curves(curves: Mapping[str, Tensor], labels: Tensor, path, *, num_bins: int = 10,
                            title: str = "reliability diagram", xlim=(0.0, 1.0),
                            groups: Mapping[str, Sequence[str]] | None = None):
    """Accuracy against mean confidence per equal-width confidence bin as small multiples (empty bins omitted).

    One panel per group of methods (``groups``: ``{panel title: [method names]}``, e.g. the method families), or one
    panel per method by default, each with the diagonal of perfect calibration, so that no panel carries more than
    a few lines. See :func:`~pyro_sdebnn.metrics.calibration_bins`; each legend gives the method's
    :func:`~pyro_sdebnn.metrics.expected_calibration_error` with the same bins. For one method with a confidence
    histogram, use :func:`~pyro_sdebnn.metrics.reliability_diagram`.

    :param curves: ``{method name: class probabilities (N, C)}``.
    :param Tensor labels: ``(N,)`` integer labels.
    :param groups: the panels; every method of ``curves`` must be in one of them.
    :return: the :class:`~matplotlib.figure.Figure` (also saved as ``path``).
    """

    groups = {name: [name] for name in curves} if groups is None else {k: list(v) for k, v in groups.items()}
    placed = [name for names in groups.values() for name in names]
    missing = sorted(set(curves) - set(placed))
    unknown = sorted(set(placed) - set(curves))
    if missing or unknown:
        raise ValueError(f"groups must place every method of curves once: missing {missing}, unknown {unknown}")
    rows, columns = _grid_shape(len(groups), 4 if len(groups) != 4 else 2)
    fig = figure(figsize=(4.2 * columns, 3.9 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False, sharex=True, sharey=True)
    lowest = min(xlim[0], 0.4)
    for ax, (group, names) in zip(axes.ravel(), groups.items()):
        ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
        for i, name in enumerate(names):
            probs = curves[name]
            bins = calibration_bins(probs, labels, num_bins=num_bins)
            keep = bins.count > 0
            ece = float(expected_calibration_error(probs, labels, num_bins=num_bins))
            accuracy = bins.accuracy[keep].cpu().numpy()
            lowest = min(lowest, float(accuracy.min()) - 0.03) if accuracy.size else lowest
            ax.plot(bins.confidence[keep].cpu().numpy(), accuracy, marker="o", ms=3.5, color=f"C{i}",
                    label=f"{name} (ECE {ece:.3f})")
        ax.set(xlim=xlim)
        ax.set_title(group, fontsize=11)
        ax.legend(fontsize=7.5, loc="best")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylim(max(lowest, 0.0), 1.02)  # shared by every panel
    for ax in axes.ravel()[len(groups):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("confidence (mean of the bin)")
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy")
    fig.suptitle(title, fontsize=12)
    fig.savefig(path, dpi=110)
    return fig


def plot_grid_heatmaps(maps: Mapping[str, tuple[Tensor, Tensor]], grid_axes: tuple[Tensor, Tensor],
                       x_train: Tensor, y_train: Tensor, path, *, max_columns: int = 5):
    """Predictive mean and standard deviation of :math:`p(y=1 \\mid x)` over a 2-D input grid, for every method.

    Two blocks of panels, a grid of ``max_columns`` methods per row in each: the means (one colour scale, 0 to 1)
    and the standard deviations over the posterior draws, all on **one** colour scale (0 to the largest standard
    deviation of any method), so that the panels can be compared by eye; each standard-deviation panel's title
    gives its own maximum.

    :param maps: ``{method name: (mean, std)}``, each flattened over the grid ``(len(gy) * len(gx),)`` in the
        ``meshgrid(gx, gy, indexing="xy")`` order.
    :param grid_axes: ``(gx, gy)``, the grid's coordinates along each input dimension.
    :param x_train: ``(N, 2)`` training inputs, drawn over the maps coloured by ``y_train``.
    :return: the :class:`~matplotlib.figure.Figure` (also saved as ``path``).
    """
    if not maps:
        raise ValueError("plot_grid_heatmaps: maps is empty")
    gx, gy = (g.cpu().numpy() for g in grid_axes)
    shape = (gy.shape[0], gx.shape[0])
    xt, yt = x_train.cpu().numpy(), y_train.cpu().numpy()
    rows, columns = _grid_shape(len(maps), max_columns)
    std_max = max(max(float(std.max()) for _, std in maps.values()), 0.05)
    fig = figure(figsize=(2.9 * columns + 1.2, 2 * (2.7 * rows + 0.5)), layout="constrained")
    blocks = fig.subfigures(2, 1)
    for block, (index, cmap, vmax, label, bar) in zip(blocks, (
            (0, "RdBu_r", 1.0, "predictive mean of p(y=1|x)", "mean p(y=1|x)"),
            (1, "viridis", std_max, "standard deviation of p(y=1|x) over posterior draws (one scale for all)",
             "sd of p(y=1|x)"))):
        axes = block.subplots(rows, columns, squeeze=False, sharex=True, sharey=True)
        for ax, (name, pair) in zip(axes.ravel(), maps.items()):
            values = pair[index].reshape(shape).cpu().numpy()
            mesh = ax.pcolormesh(gx, gy, values, cmap=cmap, vmin=0.0, vmax=vmax, shading="auto")
            ax.scatter(xt[:, 0], xt[:, 1], c=yt, cmap="coolwarm", s=3, edgecolors="k", linewidths=0.2)
            ax.set_title(_wrap(name) + (f"\nmax sd {values.max():.3f}" if index == 1 else ""), fontsize=9)
            ax.tick_params(labelsize=7)
        for ax in axes.ravel()[len(maps):]:
            ax.set_visible(False)
        for ax in axes[-1]:
            ax.set_xlabel("$x_1$", fontsize=8)
        for ax in axes[:, 0]:
            ax.set_ylabel("$x_2$", fontsize=8)
        block.colorbar(mesh, ax=axes, shrink=0.8, label=bar)
        block.suptitle(label, fontsize=11)
    fig.savefig(path, dpi=90)
    return fig


def plot_uncertainty_decomposition(name: str, grid_probs: Tensor, grid_axes: tuple[Tensor, Tensor], path) -> None:
    """Total, aleatoric and epistemic entropy (:func:`~pyro_sdebnn.metrics.uncertainty_decomposition`) over a
    2-D input grid.

    :param grid_probs: ``(S, len(gy) * len(gx), C)`` class probabilities per posterior draw over the grid.
    :param grid_axes: ``(gx, gy)`` as in :func:`plot_grid_heatmaps`.
    """

    decomposition = uncertainty_decomposition(grid_probs)
    gx, gy = (g.cpu().numpy() for g in grid_axes)
    fig = figure(figsize=(11, 3.2))
    titles = ("total (predictive entropy)", "aleatoric (expected entropy)", "epistemic (mutual information)")
    for ax, title, values in zip(fig.subplots(1, 3), titles, decomposition):
        mesh = ax.pcolormesh(gx, gy, values.reshape(gy.shape[0], gx.shape[0]).cpu().numpy(), cmap="magma",
                             shading="auto")
        fig.colorbar(mesh, ax=ax)
        ax.set_title(f"{name}: {title}", fontsize=8)
    save_figure(fig, path, dpi=100)


def write_chain_diagnostics(chains: Mapping[str, tuple[Tensor, float]], out: Path, *, quantity: str = "p(y=1|x)",
                            label: str = "SG-MCMC", prefix: str = "sgmcmc", ylim=(-0.02, 1.02)) -> list[str]:
    """Function-space chain diagnostics of one chain per sampler: ESS per second, trace and autocorrelation.

    Weight-space ESS says little for networks (symmetries), so the diagnostics follow a few scalar predictions
    per draw, e.g. the class-1 probability at a few test inputs. The ESS is Pyro's
    (:func:`~pyro_sdebnn.infer.mcmc.arviz.function_space_diagnostics`); the autocorrelation ArviZ's (``az.autocorr``,
    drawn by :func:`chain_autocorr_figure`: a panel per sampler titled with its name, a line per test point).

    :param chains: ``{sampler name: (draws (S, P) of P scalar predictions, sampling seconds)}``, not empty.
    :param out: the output folder.
    :param str quantity: what the draws are, for the figures (the prediction at each of the ``P`` test points).
    :param str label: the samplers' family, for the figures' titles.
    :param str prefix: file name prefix.
    :param ylim: the trace plot's value range (``None``: matplotlib's choice; the default suits probabilities).
    :return: the names of the files written: ``{prefix}_ess.md`` / ``.csv``, ``{prefix}_trace.png``,
        ``{prefix}_autocorr.png``.
    """
    if not chains:
        raise ValueError("write_chain_diagnostics: chains is empty")
    rows = []
    for name, (draws, seconds) in chains.items():
        ess = function_space_diagnostics(draws.double(), num_chains=1)["ess"]
        ess_min, ess_median = float(ess.min()), float(ess.median())
        rows.append({"sampler": name, "draws": draws.shape[0], "ess_min": ess_min, "ess_median": ess_median,
                     "sampling_seconds": seconds, "ess_median_per_second": ess_median / seconds})
    header = ("sampler", "draws", "ESS min", "ESS median", "sampling seconds", "ESS median / s")
    cells = [[r["sampler"], r["draws"], fmt(r["ess_min"], 1), fmt(r["ess_median"], 1), fmt(r["sampling_seconds"], 1),
              fmt(r["ess_median_per_second"], 2)] for r in rows]
    (out / f"{prefix}_ess.md").write_text(markdown_table(header, cells))
    write_csv(out / f"{prefix}_ess.csv", rows)
    num_points = next(iter(chains.values()))[0].shape[1]
    for kind, fig in (("trace", _chain_trace_figure(chains, quantity, ylim)),
                      ("autocorr", chain_autocorr_figure(chains, quantity))):
        what = "trace" if kind == "trace" else "autocorrelation"
        fig.suptitle(f"{label} {what}: {quantity} at {num_points} test points, one chain per sampler", fontsize=10)
        fig.savefig(out / f"{prefix}_{kind}.png", dpi=90)
    return [f"{prefix}_ess.md", f"{prefix}_ess.csv", f"{prefix}_trace.png", f"{prefix}_autocorr.png"]


def _chain_trace_figure(chains: Mapping[str, tuple[Tensor, float]], quantity: str, ylim):
    """One panel per sampler, one line per prediction (drawn directly rather than with ``az.plot_trace``, whose
    density panel fails on a prediction that saturates to a range of a few float32 ulps)."""
    fig = figure(figsize=(10, 2.4 * len(chains) + 0.6), layout="constrained")
    axes = fig.subplots(len(chains), 1, squeeze=False)[:, 0]
    for ax, (name, (draws, _)) in zip(axes, chains.items()):
        lines = ax.plot(draws.cpu().numpy(), lw=0.8)
        ax.set(title=f"{name}: {quantity} per draw", xlabel="draw", ylabel=quantity, ylim=ylim)
        ax.legend(lines, [f"test point {j + 1}" for j in range(len(lines))], fontsize=7, loc="center left",
                  bbox_to_anchor=(1.01, 0.5))
    return fig


def chain_autocorr_figure(chains: Mapping[str, tuple[Tensor, float]], quantity: str = "p(y=1|x)",
                          max_lag: int = 50):
    """Autocorrelation of each sampler's draws of each scalar prediction, one panel per sampler.

    The autocorrelation is ArviZ's (``az.autocorr``, FFT-based) of the draws of one prediction; a line per test
    point, lags up to ``max_lag`` (at most the number of draws minus one). A chain mixes well when its
    autocorrelation falls to about 0 within a few lags.

    :param chains: ``{sampler name: (draws (S, P), sampling seconds)}``.
    :return: a :class:`~matplotlib.figure.Figure`.
    """
    with warnings.catch_warnings():
        # ArviZ announces its refactor once per day with a FutureWarning whose message starts with a newline.
        warnings.filterwarnings("ignore", message=r"\s*ArviZ is undergoing a major refactor", category=FutureWarning)
        import arviz as az
    columns = min(len(chains), 2)
    rows = -(-len(chains) // columns)
    fig = figure(figsize=(5.2 * columns, 3.3 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False, sharey=True)
    for ax, (name, (draws, _)) in zip(axes.ravel(), chains.items()):
        values = draws.detach().double().cpu().numpy()
        lags = min(max_lag, values.shape[0] - 1)
        for j in range(values.shape[1]):
            ax.plot(range(lags + 1), az.autocorr(values[:, j])[:lags + 1], marker=".", ms=3, lw=1,
                    label=f"test point {j + 1}")
        ax.axhline(0.0, color="k", lw=0.6)
        ax.set(title=f"{name}: autocorrelation of {quantity}", xlabel="lag (draws)", ylabel="autocorrelation",
               ylim=(-1.05, 1.05))
        ax.legend(fontsize=7)
    for ax in axes.ravel()[len(chains):]:
        ax.set_visible(False)
    return fig
