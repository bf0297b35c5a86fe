# SPDX-License-Identifier: Apache-2.0
"""ECE and Murphy's Brier decomposition: hand cases, a reference loop, sampling-error bounds, identities."""

import math

import numpy as np
import pytest
import torch

from pyro_sdebnn.metrics import brier_decomposition, brier_score, calibration_bins, expected_calibration_error


def _reference_ece(probs, labels, num_bins):
    """Plain loop over right-closed bins (lo, hi], 0 in the first bin."""
    probs, labels = np.asarray(probs, dtype=np.float64), np.asarray(labels)
    conf, pred = probs.max(1), probs.argmax(1)
    ece = 0.0
    for b in range(num_bins):
        lo, hi = b / num_bins, (b + 1) / num_bins
        in_bin = (conf > lo) & (conf <= hi) if b > 0 else (conf <= hi)
        if in_bin.any():
            ece += in_bin.mean() * abs((pred[in_bin] == labels[in_bin]).mean() - conf[in_bin].mean())
    return ece


def test_ece_hand_computed():
    # Confidences 0.95 (correct), 0.95 (wrong), 0.55 (correct), 0.45 -> binary confidence 0.55 (wrong).
    probs = torch.tensor([[0.95, 0.05], [0.95, 0.05], [0.55, 0.45], [0.45, 0.55]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 0])
    # bin (0.9, 1]: 2 points, |0.5 - 0.95| = 0.45; bin (0.5, 0.6]: 2 points, |0.5 - 0.55| = 0.05
    expected = 0.5 * 0.45 + 0.5 * 0.05
    assert expected_calibration_error(probs, labels, num_bins=10).item() == pytest.approx(expected, rel=1e-12)
    # With one bin the ECE is |accuracy - mean confidence| = |0.5 - 0.75|.
    assert expected_calibration_error(probs, labels, num_bins=1).item() == pytest.approx(0.25, rel=1e-12)


@pytest.mark.parametrize("num_bins", [1, 5, 10, 15, 20])
@pytest.mark.parametrize("num_classes", [2, 4])
def test_ece_matches_a_reference_loop(num_bins, num_classes):
    probs = torch.distributions.Dirichlet(torch.ones(num_classes, dtype=torch.float64)).sample((300,))
    labels = torch.randint(0, num_classes, (300,))
    value = expected_calibration_error(probs, labels, num_bins).item()
    assert value == pytest.approx(_reference_ece(probs, labels, num_bins), abs=1e-12)


def test_ece_bin_edges_are_right_closed():
    # Confidence exactly 1 goes to the last bin, 0.5 (binary minimum) to bin (0.4, 0.5].
    bins = calibration_bins(torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64), torch.tensor([0, 0]), 10)
    assert bins.count[-1] == 1 and bins.count[4] == 1 and bins.count.sum() == 2
    assert torch.isnan(bins.confidence[0]) and bins.edges[0] == 0 and bins.edges[-1] == 1


def _calibrated_predictor(n, num_classes, generator):
    """Probabilities from a Dirichlet and labels drawn from exactly those probabilities."""
    alpha = torch.full((num_classes,), 0.5, dtype=torch.float64)
    probs = torch.distributions.Dirichlet(alpha).sample((n,))
    labels = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return probs, labels


@pytest.mark.parametrize("num_classes", [2, 10])
@pytest.mark.parametrize("num_bins", [10, 20])
def test_perfectly_calibrated_predictor_has_ece_within_sampling_error(num_classes, num_bins):
    n = 20000
    probs, labels = _calibrated_predictor(n, num_classes, torch.Generator().manual_seed(1))
    # Labels are drawn from the probabilities, so in every bin b the correctness indicators are
    # independent with means equal to the confidences: acc_b - conf_b has mean 0 and standard
    # deviation sd_b <= 0.5 / sqrt(n_b). Hence E[ECE] <= sum_b (n_b / n) * sd_b <= sum_b sqrt(n_b) / (2 n)
    # <= sqrt(B n) / (2 n) = 0.5 * sqrt(B / n) (Cauchy-Schwarz). ECE is a sum of B independent
    # half-normal-like terms, so its spread is smaller than this mean bound; 3x the bound is safe.
    tolerance = 3 * 0.5 * math.sqrt(num_bins / n)
    assert expected_calibration_error(probs, labels, num_bins).item() < tolerance
    # The same predictor made over-confident (probabilities sharpened) is detected beyond it.
    sharpened = probs.pow(3) / probs.pow(3).sum(-1, keepdim=True)
    assert expected_calibration_error(sharpened, labels, num_bins).item() > 2 * tolerance


def _within_bin_residual(forecasts, events, num_bins):
    """(1/N) sum_b sum_{i in b} [(f_i - fbar_b)^2 - 2 (f_i - fbar_b)(o_i - obar_b)], by a loop (one class)."""
    forecasts, events = np.asarray(forecasts), np.asarray(events, dtype=np.float64)
    index = np.clip(np.ceil(forecasts * num_bins).astype(int) - 1, 0, num_bins - 1)
    total = 0.0
    for b in range(num_bins):
        f, o = forecasts[index == b], events[index == b]
        if len(f):
            total += ((f - f.mean()) ** 2 - 2 * (f - f.mean()) * (o - o.mean())).sum()
    return total / len(forecasts)


def test_brier_decomposition_is_exact_for_one_forecast_value_per_bin_binary():
    generator = torch.Generator().manual_seed(2)
    values = torch.arange(0.05, 1.0, 0.1, dtype=torch.float64)  # one value in the middle of each bin
    p = values[torch.randint(0, 10, (5000,), generator=generator)]
    y = torch.bernoulli(p.clamp(0.2, 0.9), generator=generator).long()  # miscalibrated on purpose
    rel, res, unc = brier_decomposition(p, y, num_bins=10)
    assert (rel - res + unc).item() == pytest.approx(brier_score(p, y).item(), abs=1e-12)
    # Murphy's terms by hand, grouping the forecasts by their value (one per bin) instead of by bin index
    groups = [(p == v) for v in values if (p == v).any()]
    o_bar = y.double().mean()
    rel_ref = sum(g.double().mean() * (p[g][0] - y[g].double().mean()) ** 2 for g in groups)
    res_ref = sum(g.double().mean() * (y[g].double().mean() - o_bar) ** 2 for g in groups)
    assert rel.item() == pytest.approx(rel_ref.item(), rel=1e-12)
    assert res.item() == pytest.approx(res_ref.item(), rel=1e-12)
    assert unc.item() == pytest.approx(y.double().mean().item() * (1 - y.double().mean().item()), rel=1e-12)


def test_brier_decomposition_is_exact_for_finite_forecasts_multiclass():
    # Every class's probability takes values in {0.1, 0.25, 0.45, 0.65}, at most one value per bin.
    rows = torch.tensor(
        [[0.65, 0.25, 0.1], [0.25, 0.65, 0.1], [0.1, 0.25, 0.65], [0.45, 0.45, 0.1], [0.1, 0.45, 0.45]],
        dtype=torch.float64,
    )
    generator = torch.Generator().manual_seed(3)
    probs = rows[torch.randint(0, len(rows), (3000,), generator=generator)]
    labels = torch.randint(0, 3, (3000,), generator=generator)
    rel, res, unc = brier_decomposition(probs, labels, num_bins=10)
    assert (rel - res + unc).item() == pytest.approx(brier_score(probs, labels).item(), abs=1e-12)


@pytest.mark.parametrize("num_bins", [5, 10, 50])
def test_brier_decomposition_error_is_the_within_bin_term_and_bounded(num_bins):
    probs, labels = _calibrated_predictor(4000, 3, torch.Generator().manual_seed(4))
    rel, res, unc = brier_decomposition(probs, labels, num_bins)
    error = brier_score(probs, labels).item() - (rel - res + unc).item()
    one_hot = torch.nn.functional.one_hot(labels, 3)
    residual = sum(_within_bin_residual(probs[:, c], one_hot[:, c], num_bins) for c in range(3))
    assert error == pytest.approx(residual, abs=1e-12)
    # Deterministic bound: within a bin of width w the forecasts' variance is <= w^2 / 4 and
    # |cov(f, o)| <= (w / 2)(1 / 2), per class.
    width = 1 / num_bins
    assert abs(error) <= 3 * (width**2 / 4 + width / 2)


def test_brier_decomposition_of_perfect_and_constant_forecasts():
    labels = torch.tensor([0, 1, 1, 0, 1])
    perfect = torch.nn.functional.one_hot(labels, 2).double()
    rel, res, unc = brier_decomposition(perfect, labels)
    # Perfect forecasts: no reliability error, resolution equals uncertainty (0.4 * 0.6 per class).
    assert rel.item() == 0 and res.item() == pytest.approx(unc.item()) and unc.item() == pytest.approx(2 * 0.24)
    climatology = torch.full((5,), 0.6, dtype=torch.float64)
    rel, res, unc = brier_decomposition(climatology, labels)
    assert rel.item() == pytest.approx(0.0, abs=1e-15) and res.item() == 0
