# SPDX-License-Identifier: Apache-2.0
"""The evaluation and report code shared by the experiments (``pyro_sdebnn.experiments._common``)."""

import csv
import math

import pytest
import torch

from pyro_sdebnn.experiments import _common as common
from pyro_sdebnn.experiments import discover
from pyro_sdebnn.infer.predictive import RegressionPrediction
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
    with common.Timer() as timer:
        pass
    assert timer.seconds >= 0
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
