# SPDX-License-Identifier: Apache-2.0
"""Accuracy, NLL, Brier score, entropy and the entropy decomposition against hand-computed values."""

import math

import pytest
import torch

from pyro_sdebnn.predictive import ClassificationPrediction
from pyro_sdebnn.metrics import (
    accuracy,
    brier_score,
    negative_log_likelihood,
    predictive_entropy,
    uncertainty_decomposition,
)

PROBS = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.4, 0.3], [0.5, 0.25, 0.25]], dtype=torch.float64)
LABELS = torch.tensor([0, 2, 0, 1])


def test_accuracy_hand_computed():
    # argmax: 0, 2, 1, 0 -> correct, correct, wrong, wrong
    assert accuracy(PROBS, LABELS).item() == 0.5


def test_nll_hand_computed():
    expected = -(math.log(0.7) + math.log(0.8) + math.log(0.3) + math.log(0.25)) / 4
    assert negative_log_likelihood(PROBS, LABELS).item() == pytest.approx(expected, rel=1e-12)


def test_nll_matches_cross_entropy_of_logits():
    logits = torch.randn(50, 4, dtype=torch.float64)
    labels = torch.randint(0, 4, (50,))
    expected = torch.nn.functional.cross_entropy(logits, labels)
    assert torch.allclose(negative_log_likelihood(logits.softmax(-1), labels), expected, atol=1e-12)


def test_nll_of_a_zero_probability_is_finite_and_large():
    value = negative_log_likelihood(torch.tensor([[1.0, 0.0]]), torch.tensor([1]))
    assert torch.isfinite(value) and value.item() == pytest.approx(-math.log(torch.finfo(torch.float32).tiny))


def test_brier_hand_computed():
    # sum_c (p_c - onehot_c)^2 per row
    rows = [0.3**2 + 0.2**2 + 0.1**2, 0.1**2 + 0.1**2 + 0.2**2, 0.7**2 + 0.4**2 + 0.3**2, 0.5**2 + 0.75**2 + 0.25**2]
    assert brier_score(PROBS, LABELS).item() == pytest.approx(sum(rows) / 4, rel=1e-12)


def test_binary_input_conventions():
    p = torch.tensor([0.9, 0.2, 0.6, 0.5], dtype=torch.float64)
    y = torch.tensor([1, 0, 0, 1])
    two_class = torch.stack([1 - p, p], -1)
    assert brier_score(p, y).item() == pytest.approx(((p - y) ** 2).mean().item(), rel=1e-12)
    # The binary form is half of the two-class sum.
    assert brier_score(two_class, y).item() == pytest.approx(2 * brier_score(p, y).item(), rel=1e-12)
    assert negative_log_likelihood(p, y).item() == pytest.approx(negative_log_likelihood(two_class, y).item())
    # p = 0.5 predicts class 0 (first maximum): 0.9->1 right, 0.2->0 right, 0.6->1 wrong, 0.5->0 wrong: 2 of 4
    assert accuracy(p, y).item() == 0.5
    assert torch.allclose(predictive_entropy(p), predictive_entropy(two_class))


def test_metrics_accept_numpy_and_classification_prediction():
    assert accuracy(PROBS.numpy(), LABELS.numpy()).item() == 0.5
    prediction = ClassificationPrediction(torch.stack([PROBS, PROBS]))
    assert brier_score(prediction, LABELS).item() == pytest.approx(brier_score(PROBS, LABELS).item())


def test_results_follow_dtype():
    assert accuracy(PROBS.float(), LABELS).dtype == torch.float32
    assert brier_score(PROBS, LABELS).dtype == torch.float64


@pytest.mark.parametrize("num_classes", [2, 3, 10])
def test_entropy_extremes(num_classes):
    uniform = torch.full((1, num_classes), 1.0 / num_classes, dtype=torch.float64)
    certain = torch.eye(num_classes, dtype=torch.float64)[:1]
    assert predictive_entropy(uniform).item() == pytest.approx(math.log(num_classes), rel=1e-12)
    assert predictive_entropy(certain).item() == 0.0


def test_entropy_hand_computed():
    expected = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    assert predictive_entropy(PROBS)[0].item() == pytest.approx(expected, rel=1e-12)


def test_decomposition_hand_computed():
    # Two confident samples that disagree: all uncertainty is epistemic (MI = log 2) ...
    disagree = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)
    total, aleatoric, epistemic = uncertainty_decomposition(disagree)
    assert total.item() == pytest.approx(math.log(2)) and aleatoric.item() == 0
    assert epistemic.item() == pytest.approx(math.log(2))
    # ... two identical uncertain samples: all of it is aleatoric.
    agree = torch.full((2, 1, 2), 0.5, dtype=torch.float64)
    total, aleatoric, epistemic = uncertainty_decomposition(agree)
    assert aleatoric.item() == pytest.approx(math.log(2)) and epistemic.item() == 0


def test_decomposition_identity_and_non_negative_mutual_information():
    samples = torch.distributions.Dirichlet(torch.ones(5, dtype=torch.float64)).sample((30, 40))
    result = uncertainty_decomposition(samples)
    assert result.total.shape == result.aleatoric.shape == result.epistemic.shape == (40,)
    assert torch.allclose(result.total, result.aleatoric + result.epistemic, atol=1e-12)
    assert (result.epistemic > 0).all()
    assert torch.allclose(result.total, predictive_entropy(samples.mean(0)))


def test_decomposition_binary_and_prediction_inputs():
    p = torch.rand(4, 6, dtype=torch.float64)
    binary = uncertainty_decomposition(p)
    two_class = uncertainty_decomposition(ClassificationPrediction(torch.stack([1 - p, p], -1)))
    for a, b in zip(binary, two_class):
        assert torch.allclose(a, b)
    for a, b in zip(uncertainty_decomposition(p.numpy()), binary):  # a NumPy array gives the same tensors
        assert torch.equal(a, b)
