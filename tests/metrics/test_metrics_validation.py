# SPDX-License-Identifier: Apache-2.0
"""Every metric rejects bad input with an error naming the argument."""

import numpy as np
import pytest
import torch

from pyro_sdebnn import metrics

GOOD_PROBS = torch.tensor([[0.7, 0.3], [0.2, 0.8]])
GOOD_LABELS = torch.tensor([0, 1])

# Metrics taking (probs, labels)
PROBS_LABELS = [
    metrics.accuracy,
    metrics.negative_log_likelihood,
    metrics.brier_score,
    metrics.expected_calibration_error,
    metrics.brier_decomposition,
    metrics.calibration_bins,
    metrics.aumrc,
    metrics.misclassification_at_rejection,
]

OUTSIDE = r"probs must be probabilities in \[0, 1\]"
BAD_PROBS_LABELS = [
    ("probs shape", torch.ones(2, 1), GOOD_LABELS, ValueError, "probs must have shape"),
    ("probs 3-d", torch.full((1, 2, 2), 0.5), GOOD_LABELS, ValueError, "probs must have shape"),
    ("probs empty", torch.zeros(0, 2), torch.zeros(0, dtype=torch.long), ValueError, "probs is empty"),
    ("probs negative", torch.tensor([[1.2, -0.2], [0.5, 0.5]]), GOOD_LABELS, ValueError, OUTSIDE),
    ("probs above one", torch.tensor([1.5, 0.5]), GOOD_LABELS, ValueError, OUTSIDE),
    ("probs nan", torch.tensor([[float("nan"), 0.5], [0.5, 0.5]]), GOOD_LABELS, ValueError, "probs must be finite"),
    ("probs not summing", torch.tensor([[0.6, 0.6], [0.5, 0.5]]), GOOD_LABELS, ValueError, "probs rows must sum to 1"),
    ("probs type", "not an array", GOOD_LABELS, TypeError, "probs must be"),
    ("labels length", GOOD_PROBS, torch.tensor([0, 1, 1]), ValueError, r"labels must have shape \(2,\)"),
    ("labels 2-d", GOOD_PROBS, torch.tensor([[0], [1]]), ValueError, r"labels must have shape \(2,\)"),
    ("labels too large", GOOD_PROBS, torch.tensor([0, 2]), ValueError, r"labels must be class indices in \[0, 1\]"),
    ("labels negative", GOOD_PROBS, torch.tensor([-1, 0]), ValueError, "labels must be class indices"),
    ("labels fractional", GOOD_PROBS, torch.tensor([0.5, 1.0]), ValueError, "labels must be integer class indices"),
]


@pytest.mark.parametrize("case", BAD_PROBS_LABELS, ids=[c[0] for c in BAD_PROBS_LABELS])
@pytest.mark.parametrize("metric", PROBS_LABELS, ids=lambda f: f.__name__)
def test_probs_and_labels_validation(metric, case):
    _, probs, labels, error, message = case
    with pytest.raises(error, match=message):
        metric(probs, labels)


def test_rounding_error_in_row_sums_is_tolerated():
    # float32 softmax rows sum to 1 only up to round-off; integral float labels are accepted.
    probs = torch.randn(1000, 100).softmax(-1)
    expected = (probs.argmax(-1) == 0).double().mean().item()  # the fraction of rows whose top class is 0
    assert metrics.accuracy(probs, torch.zeros(1000)).item() == pytest.approx(expected, rel=1e-6)  # float32
    as_numpy = metrics.accuracy(np.asarray(probs), np.zeros(1000, dtype=np.int32))
    assert as_numpy.item() == pytest.approx(expected, rel=1e-6)  # float32


@pytest.mark.parametrize(
    "metric", [metrics.expected_calibration_error, metrics.brier_decomposition, metrics.calibration_bins]
)
@pytest.mark.parametrize("num_bins", [0, -3, 2.5, True])
def test_num_bins_validation(metric, num_bins):
    with pytest.raises(ValueError, match="num_bins"):
        metric(GOOD_PROBS, GOOD_LABELS, num_bins=num_bins)


@pytest.mark.parametrize(
    "sample_probs, message",
    [
        (torch.full((2,), 0.5), "sample_probs must have shape"),
        (torch.full((0, 3, 2), 0.5), "sample_probs is empty"),
        (torch.full((2, 3, 2), 0.7), "sample_probs rows must sum to 1"),
        (torch.full((2, 3), 1.5), r"sample_probs must be probabilities in \[0, 1\]"),
    ],
)
def test_uncertainty_decomposition_validation(sample_probs, message):
    with pytest.raises(ValueError, match=message):
        metrics.uncertainty_decomposition(sample_probs)


def test_predictive_entropy_validation():
    with pytest.raises(ValueError, match="probs rows must sum to 1"):
        metrics.predictive_entropy(torch.full((3, 4), 0.5))


LOC = torch.zeros(2, 3)
SCALE = torch.ones(2, 3)
Y = torch.zeros(3)
MIXTURE_METRICS = [metrics.gaussian_mixture_log_likelihood, metrics.interval_coverage]
BAD_MIXTURES = [
    ("loc shape", torch.zeros(2, 3, 1), SCALE, Y, "loc must have shape"),
    ("loc empty", torch.zeros(0, 3), torch.ones(0, 3), Y, "loc is empty"),
    ("loc nan", torch.full((2, 3), float("nan")), SCALE, Y, "loc must be finite"),
    ("shape mismatch", LOC, torch.ones(3, 3), Y, "loc and scale must have the same shape"),
    ("scale zero", LOC, torch.zeros(2, 3), Y, "scale must be positive"),
    ("y length", LOC, SCALE, torch.zeros(4), r"y must have shape \(3,\)"),
    ("y 2-d", LOC, SCALE, torch.zeros(3, 1), r"y must have shape \(N,\)"),
]


@pytest.mark.parametrize("case", BAD_MIXTURES, ids=[c[0] for c in BAD_MIXTURES])
@pytest.mark.parametrize("metric", MIXTURE_METRICS, ids=lambda f: f.__name__)
def test_mixture_validation(metric, case):
    _, loc, scale, y, message = case
    with pytest.raises(ValueError, match=message):
        metric(loc, scale, y)


def test_regression_keyword_validation():
    with pytest.raises(ValueError, match="y_scale"):
        metrics.rmse(Y, Y, y_scale=0.0)
    with pytest.raises(ValueError, match="y_scale"):
        metrics.gaussian_mixture_log_likelihood(LOC, SCALE, Y, y_scale=-1.0)
    with pytest.raises(ValueError, match="level"):
        metrics.interval_coverage(LOC, SCALE, Y, level=1.0)
    with pytest.raises(ValueError, match="mean is empty"):
        metrics.rmse(torch.zeros(0), torch.zeros(0))
    with pytest.raises(ValueError, match=r"y must have shape \(3,\)"):
        metrics.rmse(Y, torch.zeros(2))
    with pytest.raises(ValueError, match="scale must be non-negative"):
        metrics.regression_variance_decomposition(LOC, -SCALE)


def test_numpy_scalars_are_numbers():
    # np.float32 is neither a Python float nor an ndarray: it used to be refused as "must be a torch.Tensor"
    logits = torch.tensor([[2.0, -1.0], [0.3, 1.5]])
    want = metrics.temperature_scale(logits, 2.0)
    torch.testing.assert_close(metrics.temperature_scale(logits, np.float32(2.0)), want, rtol=0, atol=0)
    torch.testing.assert_close(metrics.temperature_scale(logits, np.int64(2)), want, rtol=0, atol=0)
    with pytest.raises(TypeError, match="temperature must be"):
        metrics.temperature_scale(logits, np.bool_(True))
