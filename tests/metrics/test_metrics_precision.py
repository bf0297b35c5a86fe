# SPDX-License-Identifier: Apache-2.0
"""Half-precision inputs, binary ``(N,)`` conventions and the row-sum tolerance of the metrics.

Half-precision inputs: every metric widens float16/bfloat16 values (exactly) to float32 and accumulates there, so
its result must equal the float64 result *on the same input values* up to float32 accumulation error. The bound
used is the recursive-summation bound :math:`\\gamma_n \\approx n u` of a sum of ``n`` terms (Higham, Accuracy and
Stability of Numerical Algorithms, 2nd ed., 2002, eq. 4.4) times the largest term, with ``u = 2^-24`` the float32
unit round-off and a few extra ``u`` per evaluated term. Before the fix a bfloat16 sum stopped counting at 256.
"""

import math

import pytest
import torch

from pyro_sdebnn import metrics
from pyro_sdebnn.metrics import calibration_bins, expected_calibration_error

U32 = 2.0**-24
HALVES = [torch.float16, torch.bfloat16]
N, C, S = 5000, 10, 8


def _bound(num_terms: int, magnitude: float) -> float:
    """Float32 accumulation error of a sum/mean of ``num_terms`` terms of size at most ``magnitude``."""
    return (num_terms + 10) * U32 * magnitude


@pytest.fixture(scope="module")
def classification():
    generator = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(N, C, generator=generator, dtype=torch.float64)
    probs = logits.softmax(-1)
    labels = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    samples = (logits + torch.randn(S, N, C, generator=generator, dtype=torch.float64)).softmax(-1)
    return logits, probs, labels, samples


def _same_values(tensor, dtype):
    """``tensor`` rounded to ``dtype``, and the same values in float64 (the reference input)."""
    rounded = tensor.to(dtype)
    return rounded, rounded.double()


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_ece_and_bins_in_half_precision_match_float64(classification, dtype):
    _, probs, labels, _ = classification
    half, ref = _same_values(probs, dtype)
    ece = expected_calibration_error(half, labels, 15)
    assert ece.dtype == torch.float32
    assert abs(ece.item() - expected_calibration_error(ref, labels, 15).item()) <= _bound(N, 1.0)
    bins, ref_bins = calibration_bins(half, labels, 15), calibration_bins(ref, labels, 15)
    # counts are exact integers (a bfloat16 count used to stop at 256, a float16 one at 2048)
    assert torch.equal(bins.count.double(), ref_bins.count) and bins.count.sum().item() == N
    nonempty = ref_bins.count > 0
    for got, want in ((bins.confidence, ref_bins.confidence), (bins.accuracy, ref_bins.accuracy)):
        assert (got.double() - want)[nonempty].abs().max().item() <= _bound(N, 1.0)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_proper_scores_in_half_precision_match_float64(classification, dtype):
    _, probs, labels, samples = classification
    half, ref = _same_values(probs, dtype)
    # accuracy, Brier (terms <= 2) and NLL (terms <= max -log p): means over N
    nll_max = -ref.gather(-1, labels[:, None]).log().min().item()
    for metric, magnitude in (
        (metrics.accuracy, 1.0),
        (metrics.brier_score, 2.0 * C),
        (metrics.negative_log_likelihood, nll_max),
    ):
        got = metric(half, labels)
        assert got.dtype == torch.float32, metric.__name__
        assert abs(got.item() - metric(ref, labels).item()) <= _bound(N, magnitude), metric.__name__
    for got, want in zip(metrics.brier_decomposition(half, labels), metrics.brier_decomposition(ref, labels)):
        assert got.dtype == torch.float32 and abs(got.item() - want.item()) <= _bound(N, 4.0 * C)
    # per-point entropies: C terms of size <= 1/e each, then the mutual information over S samples
    entropy = metrics.predictive_entropy(half)
    assert entropy.dtype == torch.float32
    assert (entropy.double() - metrics.predictive_entropy(ref)).abs().max().item() <= _bound(C, math.log(C))
    half_samples, ref_samples = _same_values(samples, dtype)
    for got, want in zip(
        metrics.uncertainty_decomposition(half_samples), metrics.uncertainty_decomposition(ref_samples)
    ):
        assert got.dtype == torch.float32
        assert (got.double() - want).abs().max().item() <= 2 * _bound(S + C, math.log(C))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_rejection_and_ood_in_half_precision_match_float64(classification, dtype):
    _, probs, labels, samples = classification
    half, ref = _same_values(probs, dtype)
    # the same uncertainty values give the same order, so only the averaging differs
    uncertainty_half, uncertainty_ref = _same_values(metrics.predictive_entropy(probs), dtype)
    got = metrics.aumrc(half, labels, uncertainty_half)
    assert got.dtype == torch.float32
    assert abs(got.item() - metrics.aumrc(ref, labels, uncertainty_ref).item()) <= _bound(N, 1.0)
    at = metrics.misclassification_at_rejection(half, labels, uncertainty=uncertainty_half)
    want = metrics.misclassification_at_rejection(ref, labels, uncertainty=uncertainty_ref)
    assert all(abs(at[r].item() - want[r].item()) <= _bound(N, 1.0) for r in want)
    scores_out, scores_out_ref = _same_values(metrics.predictive_entropy(samples[0]), dtype)
    auroc = metrics.ood_auroc(uncertainty_half, scores_out)
    assert auroc.dtype == torch.float32
    assert abs(auroc.item() - metrics.ood_auroc(uncertainty_ref, scores_out_ref).item()) <= U32


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_regression_metrics_in_half_precision_match_float64(dtype):
    generator = torch.Generator().manual_seed(1)
    loc = torch.randn(S, N, generator=generator, dtype=torch.float64)
    scale = 0.5 + torch.rand(S, N, generator=generator, dtype=torch.float64)
    y = loc[0] + scale[0] * torch.randn(N, generator=generator, dtype=torch.float64)
    (loc_h, loc_r), (scale_h, scale_r), (y_h, y_r) = (_same_values(t, dtype) for t in (loc, scale, y))
    got = metrics.rmse(loc_h[0], y_h)
    assert got.dtype == torch.float32
    squared_max = (loc_r[0] - y_r).square().max().item()
    # sqrt halves the relative error of the mean square
    assert abs(got.item() - metrics.rmse(loc_r[0], y_r).item()) <= _bound(N, squared_max) / got.item()
    log_density = torch.distributions.Normal(loc_r, scale_r).log_prob(y_r).abs().max().item()
    got = metrics.gaussian_mixture_log_likelihood(loc_h, scale_h, y_h)
    want = metrics.gaussian_mixture_log_likelihood(loc_r, scale_r, y_r)
    assert got.dtype == torch.float32 and abs(got.item() - want.item()) <= _bound(N + S, log_density)
    # coverage counts points; a point may flip only if its float64 |2F - 1| lies within round-off of the level
    cdf = torch.special.ndtr((y_r - loc_r) / scale_r).mean(0)
    near = (((2 * cdf - 1).abs() - 0.9).abs() < _bound(S, 10.0)).sum().item()
    got = metrics.interval_coverage(loc_h, scale_h, y_h, 0.9)
    want = metrics.interval_coverage(loc_r, scale_r, y_r, 0.9)
    assert got.dtype == torch.float32 and abs(got.item() - want.item()) <= near / N + _bound(N, 1.0)
    magnitude = (loc_r.square() + scale_r.square()).max().item()
    for got, want in zip(
        metrics.regression_variance_decomposition(loc_h, scale_h),
        metrics.regression_variance_decomposition(loc_r, scale_r),
    ):
        assert got.dtype == torch.float32
        assert (got.double() - want).abs().max().item() <= 4 * _bound(S, magnitude)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_temperature_in_half_precision_matches_float64(classification, dtype):
    logits, _, labels, _ = classification
    half, ref = _same_values(logits[:500], dtype)
    temperature = metrics.fit_temperature(half, labels[:500])
    want = metrics.fit_temperature(ref, labels[:500])
    # the fit runs in float64 on the same values either way; only the float32 result is rounded
    assert temperature.dtype == torch.float32 and abs(temperature.item() - want.item()) <= 2 * U32 * want.item()
    probs = metrics.temperature_scale(half, 2.0)
    assert probs.dtype == torch.float32
    magnitude = ref.abs().max().item() / 2.0
    assert (probs.double() - metrics.temperature_scale(ref, 2.0)).abs().max().item() <= _bound(C, 2 * magnitude)


def test_calibrated_softmax_ece_does_not_drift_in_bfloat16():
    # 10,000 calibrated softmax outputs: summed in bfloat16 (whose integers stop at 256), the bin counts and so the
    # ECE would be far from the float32 value.
    generator = torch.Generator().manual_seed(2)
    probs = (3 * torch.randn(10_000, C, generator=generator)).softmax(-1)
    labels = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    for dtype in HALVES:
        half, ref = _same_values(probs, dtype)
        ece = expected_calibration_error(half, labels).item()
        assert abs(ece - expected_calibration_error(ref, labels).item()) <= _bound(10_000, 1.0)


# --------------------------------------------------------------------------------------- binary (N,) input
def test_binary_ece_is_the_positive_class_calibration_closed_form():
    """p ~ U(0, 1), y ~ Bernoulli(p^2): in every bin E[y | bin] = E[p^2 | bin] < E[p | bin], so the population
    ECE of the positive-class forecast is E[p] - E[p^2] = 1/2 - 1/3 = 1/6 for *any* equal-width binning.

    With all bin gaps far from zero the estimate is mean(p - y), whose standard error is sqrt(Var(p - y) / N)
    with Var(p - y) = E[(p - y)^2] - 1/36 = (1/3 - 2/4 + 1/3) - 1/36 = 5/36. The top-label convention gives
    about 0.006 here, 60 standard errors away.
    """
    n = 20_000
    generator = torch.Generator().manual_seed(3)
    p = torch.rand(n, generator=generator, dtype=torch.float64)
    y = torch.bernoulli(p.square(), generator=generator).long()
    tolerance = 5 * math.sqrt(5 / 36 / n)
    for num_bins in (10, 15):
        assert abs(expected_calibration_error(p, y, num_bins).item() - 1 / 6) < tolerance
    bins = calibration_bins(p, y, 10)
    # per bin [a, b): conf -> (a + b) / 2 and accuracy -> E[p^2 | bin] = (a^2 + ab + b^2) / 3
    a, b = bins.edges[:-1], bins.edges[1:]
    per_bin_se = 5 * (1 / math.sqrt(bins.count.min().item()))
    assert (bins.confidence - (a + b) / 2).abs().max().item() < per_bin_se / math.sqrt(12)
    assert (bins.accuracy - (a * a + a * b + b * b) / 3).abs().max().item() < per_bin_se / 2


def test_binary_metrics_agree_on_the_positive_class_convention():
    p = torch.tensor([0.05, 0.15, 0.15, 0.85, 0.95, 0.65], dtype=torch.float64)
    y = torch.tensor([0, 1, 0, 1, 1, 0])
    bins = calibration_bins(p, y, 10)
    # bin (0.1, 0.2]: forecast 0.15 twice, one positive -> gap 0.35; (0.6, 0.7]: 0.65, no positive -> 0.65
    expected = (1 * 0.05 + 2 * 0.35 + 1 * 0.15 + 1 * 0.05 + 1 * 0.65) / 6
    assert expected_calibration_error(p, y, 10).item() == pytest.approx(expected, rel=1e-12)
    assert bins.accuracy[1].item() == 0.5 and bins.confidence[1].item() == pytest.approx(0.15)
    # with a single bin the ECE is |mean forecast - base rate|, the reliability term of the one-bin Brier split
    ece1 = expected_calibration_error(p, y, 1).item()
    assert ece1 == pytest.approx(abs(p.mean().item() - y.double().mean().item()), rel=1e-12)
    rel, _, _ = metrics.brier_decomposition(p, y, num_bins=1)
    assert rel.item() == pytest.approx(ece1**2, rel=1e-12)
    # the reliability diagram bins and reports the same positive-class ECE, with axes saying what is binned
    figure = metrics.reliability_diagram(p, y, num_bins=10)
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert f"frequency of class 1 (ECE = {expected_calibration_error(p, y, 10).item():.3f})" in legend
    assert figure.axes[1].get_xlabel() == "predicted probability of class 1"


# --------------------------------------------------------------------------------------- row-sum tolerance
def test_float32_softmax_cast_to_float64_is_accepted():
    generator = torch.Generator().manual_seed(4)
    probs32 = (4 * torch.randn(2000, 100, generator=generator)).softmax(-1)
    probs64 = probs32.double()
    assert (probs64.sum(-1) - 1).abs().max().item() > math.sqrt(torch.finfo(torch.float64).eps)  # not normalised to float64 precision
    labels = torch.zeros(2000, dtype=torch.long)
    assert metrics.negative_log_likelihood(probs64, labels).item() == pytest.approx(
        metrics.negative_log_likelihood(probs32, labels).item(), rel=1e-5
    )
    # half-precision softmax outputs, in their own dtype or widened to float32
    for dtype in HALVES:
        metrics.brier_score(probs32.to(dtype), labels)
        metrics.brier_score(probs32.to(dtype).float(), labels)


def test_unnormalised_rows_are_still_rejected():
    generator = torch.Generator().manual_seed(5)
    probs = torch.randn(50, 4, generator=generator, dtype=torch.float64).softmax(-1)
    # float64 values computed in float64 keep float64's tolerance (1.5e-8)
    with pytest.raises(ValueError, match="rows must sum to 1.*float64"):
        metrics.brier_score(probs * (1 + 1e-6), torch.zeros(50, dtype=torch.long))
    # float32-exact values get float32's tolerance (3.5e-4) and nothing looser
    with pytest.raises(ValueError, match="rows must sum to 1.*float32"):
        metrics.brier_score((probs.float() * (1 + 1e-3)).double(), torch.zeros(50, dtype=torch.long))
    for dtype in HALVES + [torch.float32, torch.float64]:
        with pytest.raises(ValueError, match="rows must sum to 1"):
            metrics.accuracy(torch.full((3, 4), 0.3, dtype=dtype), torch.zeros(3, dtype=torch.long))


# unit round-off and half the smallest subnormal spacing (the absolute rounding error of tiny values)
ROUNDING = {torch.float16: (2.0**-11, 2.0**-25), torch.bfloat16: (2.0**-8, 2.0**-134)}


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_proper_scores_of_rounded_inputs_stay_within_the_rounding_bound(classification, dtype):
    """Against the float64 score of the *unrounded* probabilities: rounding p to p + d with
    |d| <= e = max(u p, t) moves the Brier score by at most sum_c |d_c| |2 p_c + d_c - 2 y_c| <= 2 sum_c e_c
    (+ e^2 terms) per point and -log p by at most log(p / (p - e)), averaged over the points."""
    _, probs, labels, _ = classification
    u, t = ROUNDING[dtype]
    error = torch.maximum(u * probs, torch.full_like(probs, t))
    brier_bound = (2 * error + error.square()).sum(-1).mean().item()
    picked, picked_error = probs.gather(-1, labels[:, None])[:, 0], error.gather(-1, labels[:, None])[:, 0]
    nll_bound = (picked / (picked - picked_error)).log().mean().item()
    half = probs.to(dtype)
    got = metrics.brier_score(half, labels).item()
    assert abs(got - metrics.brier_score(probs, labels).item()) <= brier_bound + _bound(N, 2.0 * C)
    got = metrics.negative_log_likelihood(half, labels).item()
    nll_max = -picked.log().max().item()
    assert abs(got - metrics.negative_log_likelihood(probs, labels).item()) <= nll_bound + _bound(N, nll_max)
