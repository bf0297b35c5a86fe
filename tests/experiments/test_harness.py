# SPDX-License-Identifier: Apache-2.0
"""The evaluation and report code shared by the experiments (``pyro_sdebnn.experiments._harness``)."""

import csv
import math
import time

import pytest
import torch

from pyro_sdebnn.experiments import _harness as common
from pyro_sdebnn.experiments import discover
from pyro_sdebnn.predictive import RegressionPrediction
from pyro_sdebnn.metrics import expected_calibration_error, gaussian_mixture_log_likelihood, negative_log_likelihood


def test_not_a_benchmark():
    assert all(module.__name__ != common.__name__ for module in discover().values())


def test_tables_round_trip(tmp_path):
    rows = [{"method": "a", "nll": 0.1 + 0.2}, {"method": "b"}]
    common.write_csv(tmp_path / "t.csv", rows, ["method", "nll"])
    with open(tmp_path / "t.csv") as f:
        read = list(csv.DictReader(f))
    assert read == [{"method": "a", "nll": repr(0.1 + 0.2)}, {"method": "b", "nll": ""}]  # full precision, gaps
    assert common.markdown_table(["m", "x"], [["a", 1]]) == "| m | x |\n|---|---|\n| a | 1 |\n"
    assert common.fmt(float("nan")) == "" and common.fmt(None) == "" and common.fmt(0.12345, 2) == "0.12"
    with pytest.raises(ValueError, match="no rows"):
        common.write_csv(tmp_path / "empty.csv", [])


def test_mean_se_closed_form():
    mean, se = common.mean_se([1.0, 2.0, 3.0, 6.0])
    assert mean == 3.0
    assert se == pytest.approx(math.sqrt((4 + 1 + 0 + 9) / 3) / 2, rel=1e-15)
    assert math.isnan(common.mean_se([5.0])[1])


def test_timer_and_threads():
    outer_start = time.perf_counter()
    with common.Timer() as timer:
        time.sleep(0.01)
    outer = time.perf_counter() - outer_start
    assert 0.01 <= timer.seconds <= outer  # the block's wall time: at least the sleep, at most the time around it
    with pytest.raises(RuntimeError), common.Timer() as failed:
        raise RuntimeError
    assert math.isnan(failed.seconds)  # a failed block is not timed
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError), common.cpu_threads(1, "cpu"):
        assert torch.get_num_threads() == 1
        raise RuntimeError
    assert torch.get_num_threads() == before


def test_fresh_start_gives_the_same_draws():
    common.fresh_start(3)
    first = torch.rand(3)
    torch.rand(5)
    common.fresh_start(3)
    assert torch.equal(torch.rand(3), first)


def test_classification_metrics_match_the_metrics_and_temperature_scaling_lowers_the_validation_nll():
    torch.manual_seed(0)
    labels = torch.randint(0, 3, (400,))
    logits = 3.0 * torch.nn.functional.one_hot(labels, 3) + torch.randn(400, 3) * 2.0
    probs = logits.softmax(-1)
    metrics = common.classification_metrics(probs, labels)
    assert set(metrics) == {"accuracy", "ece", "ece15", "ece20", "brier", "nll"}
    assert metrics["ece15"] == float(expected_calibration_error(probs, labels, num_bins=15))
    assert metrics["nll"] == float(negative_log_likelihood(probs, labels))
    # An over-confident predictive (logits x 3): the temperature fitted on the same data lowers its NLL.
    sharp = (3 * logits).softmax(-1)
    scaled = common.calibrated_metrics(sharp, labels, sharp, labels)
    assert scaled["temperature"] > 1 and scaled["nll_ts"] < scaled["nll"]


def test_regression_metrics_with_a_mask_score_the_subset():
    torch.manual_seed(0)
    pred = RegressionPrediction(torch.randn(4, 10), torch.rand(4, 10) + 0.5)
    y = torch.randn(10)
    mask = torch.arange(10) < 4
    scores = common.regression_metrics(pred, y, 2.0, mask=mask)
    subset = common.regression_metrics(RegressionPrediction(pred.loc[:, :4], pred.scale[:, :4]), y[:4], 2.0)
    assert scores["test_ll"] == pytest.approx(subset["test_ll"], rel=1e-6)
    assert scores["rmse"] == pytest.approx(subset["rmse"], rel=1e-6)
    assert scores["test_ll"] == float(gaussian_mixture_log_likelihood(pred.loc[:, mask], pred.scale[:, mask],
                                                                      y[mask], y_scale=2.0))


def test_heatmaps_grid_shares_one_std_scale_and_titles_every_panel(tmp_path):
    from pyro_sdebnn.experiments._harness import plot_grid_heatmaps

    gx, gy = torch.linspace(-1, 1, 6), torch.linspace(-1, 1, 5)
    maps = {f"method number {i} with a long descriptive name": (torch.rand(30), 0.1 * i * torch.rand(30))
            for i in range(1, 5)}
    fig = plot_grid_heatmaps(maps, (gx, gy), torch.randn(8, 2), torch.randint(0, 2, (8,)), tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 0
    mean_block, std_block = fig.subfigs
    for block, vmax in ((mean_block, 1.0), (std_block, max(float(s.max()) for _, s in maps.values()))):
        panels = [ax for ax in block.axes if ax.get_visible() and ax.collections and ax.get_label() != "<colorbar>"]
        assert len(panels) == len(maps)
        limits = {ax.collections[0].get_clim() for ax in panels}
        assert len(limits) == 1 and limits.pop() == pytest.approx((0.0, vmax))  # one colour scale for every method
        titles = [ax.get_title() for ax in panels]
        assert all(title.replace("\n", " ").startswith(f"method number {i} with a long")
                   for i, title in enumerate(titles, start=1))
    # a grid, not one column: the panels of a block side by side
    assert len({round(ax.get_position().x0, 3) for ax in std_block.axes if ax.get_visible()}) > 2


def test_reliability_small_multiples_by_group(tmp_path):
    from pyro_sdebnn.experiments._harness import plot_reliability_curves

    labels = torch.randint(0, 2, (200,), generator=torch.Generator().manual_seed(0))
    curves = {name: torch.softmax(torch.randn(200, 2, generator=torch.Generator().manual_seed(i)), -1)
              for i, name in enumerate("abcde")}
    groups = {"one": ["a", "b"], "two": ["c", "d", "e"]}
    fig = plot_reliability_curves(curves, labels, tmp_path / "r.png", groups=groups)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["one", "two"]
    assert [len(ax.get_lines()) for ax in visible] == [3, 4]  # the diagonal and one line per method
    with pytest.raises(ValueError, match="missing"):
        plot_reliability_curves(curves, labels, tmp_path / "r.png", groups={"one": ["a"]})


def test_autocorrelation_panels_are_titled_by_sampler():
    from pyro_sdebnn.experiments._harness import chain_autocorr_figure

    g = torch.Generator().manual_seed(0)
    chains = {"SGLD": (torch.rand(30, 4, generator=g), 1.0), "SGHMC": (torch.rand(30, 4, generator=g), 1.0)}
    fig = chain_autocorr_figure(chains)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == ["SGLD: autocorrelation of p(y=1|x)", "SGHMC: autocorrelation of p(y=1|x)"]
    for ax in fig.axes:
        lines = [line for line in ax.get_lines() if line.get_label().startswith("test point")]
        assert len(lines) == 4 and all(line.get_ydata()[0] == pytest.approx(1.0) for line in lines)
