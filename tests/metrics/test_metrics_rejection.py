# SPDX-License-Identifier: Apache-2.0
"""AUMRC and misclassification at fixed rejection rates against a brute-force reference."""

import math

import pytest
import torch

from pyro_sdebnn.metrics import (
    aumrc,
    misclassification_at_rejection,
    misclassification_rejection_curve,
    predictive_entropy,
)


def _reference_aumrc(probs, labels):
    """Reject one point at a time (highest entropy first) and integrate the step curve."""
    entropy = predictive_entropy(probs).tolist()
    errors = (probs.argmax(-1) != labels).tolist()
    remaining = list(range(len(labels)))
    area = 0.0
    for _ in range(len(labels)):
        area += sum(errors[i] for i in remaining) / len(remaining) / len(labels)
        remaining.remove(max(remaining, key=lambda i: entropy[i]))
    return area


def test_hand_computed_curve_and_area():
    probs = torch.tensor([[0.9, 0.1], [0.55, 0.45], [0.7, 0.3], [0.8, 0.2]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 1, 0])  # errors at points 1 and 2, the two most uncertain
    fraction, rate = misclassification_rejection_curve(probs, labels)
    assert fraction.tolist() == [0.0, 0.25, 0.5, 0.75]
    assert rate.tolist() == pytest.approx([0.5, 1 / 3, 0.0, 0.0])
    assert aumrc(probs, labels).item() == pytest.approx((0.5 + 1 / 3) / 4)
    at = misclassification_at_rejection(probs, labels, rates=(0.0, 0.25, 0.5))
    assert list(at) == [0.0, 0.25, 0.5]
    assert [v.item() for v in at.values()] == pytest.approx([0.5, 1 / 3, 0.0])


def test_matches_the_reference_on_random_predictions():
    probs = torch.distributions.Dirichlet(torch.ones(3, dtype=torch.float64)).sample((60,))
    labels = torch.randint(0, 3, (60,))
    assert aumrc(probs, labels).item() == pytest.approx(_reference_aumrc(probs, labels), abs=1e-12)


def test_ranking_matters():
    probs = torch.tensor([[0.9, 0.1]] * 10, dtype=torch.float64)
    labels = torch.tensor([1, 1] + [0] * 8)
    good = torch.tensor([1.0, 1.0] + [0.0] * 8)  # the two errors are rejected first
    bad = 1 - good
    # Errors first: rates 2/10, 1/9, 0, ...; errors last: 2/10, 2/9, ..., 2/2, then 1/1 for the last point.
    assert aumrc(probs, labels, uncertainty=good).item() == pytest.approx((0.2 + 1 / 9) / 10)
    assert aumrc(probs, labels, uncertainty=bad).item() == pytest.approx((sum(2 / k for k in range(2, 11)) + 1) / 10)


def test_rejection_rate_rounds_down():
    probs = torch.tensor([[0.9, 0.1]] * 7, dtype=torch.float64)
    labels = torch.tensor([1] + [0] * 6)
    uncertainty = torch.arange(7.0, 0, -1)  # point 0 is rejected first
    at = misclassification_at_rejection(probs, labels, rates=(0.1, 0.15), uncertainty=uncertainty)
    # floor(0.1 * 7) = 0 rejected -> 1/7; floor(0.15 * 7) = 1 rejected -> 0.
    assert at[0.1].item() == pytest.approx(1 / 7) and at[0.15].item() == 0


@pytest.mark.parametrize("rates", [(1.0,), (-0.1,), ()])
def test_bad_rates(rates):
    with pytest.raises(ValueError, match="rates"):
        misclassification_at_rejection(torch.tensor([0.2, 0.7]), torch.tensor([0, 1]), rates=rates)


def test_uncertainty_must_match():
    with pytest.raises(ValueError, match="uncertainty"):
        aumrc(torch.tensor([0.2, 0.7]), torch.tensor([0, 1]), uncertainty=torch.zeros(3))
    assert math.isfinite(aumrc(torch.tensor([0.2, 0.7]), torch.tensor([0, 1])).item())


def test_rates_given_as_a_tensor_or_numpy_scalars():
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.7, 0.3]])
    labels = torch.tensor([0, 1, 0, 0])
    want = misclassification_at_rejection(probs, labels, rates=(0.0, 0.25))
    got = misclassification_at_rejection(probs, labels, rates=torch.tensor([0.0, 0.25]))
    assert list(got) == [0.0, 0.25] and all(got[r].item() == want[r].item() for r in want)
    import numpy as np

    got = misclassification_at_rejection(probs, labels, rates=(np.float32(0.25),))
    assert got[np.float32(0.25)].item() == want[0.25].item()
    with pytest.raises(ValueError, match="rates must lie in"):
        misclassification_at_rejection(probs, labels, rates=torch.tensor([0.5, 1.0]))
