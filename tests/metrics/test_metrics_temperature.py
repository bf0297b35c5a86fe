# SPDX-License-Identifier: Apache-2.0
"""Temperature scaling recovers the over-confidence factor, lowers the NLL and keeps the argmax."""

import math

import pytest
import torch

from pyro_sdebnn.metrics import accuracy, fit_temperature, negative_log_likelihood, temperature_scale

FACTOR = 3.0  # the model's logits are FACTOR times the true logits: over-confident, true T = FACTOR


def _problem(num_classes, n=4000, factor=FACTOR, seed=0):
    generator = torch.Generator().manual_seed(seed)
    if num_classes == 2:  # binary logits (N,)
        true_logits = 2 * torch.randn(n, generator=generator, dtype=torch.float64)
        labels = torch.bernoulli(torch.sigmoid(true_logits), generator=generator).long()
    else:
        true_logits = 2 * torch.randn(n, num_classes, generator=generator, dtype=torch.float64)
        labels = torch.multinomial(true_logits.softmax(-1), 1, generator=generator).squeeze(-1)
    return factor * true_logits, labels, true_logits


def _temperature_standard_error(model_logits, true_logits):
    """Delta-method standard error of T-hat from the Fisher information of beta = 1/T at the truth.

    The score of beta for one point is z'_y - E_p[z'] (z' the model logits, p the true probabilities),
    so the Fisher information is sum_i Var_{p_i}(z'_i); sd(T) = sd(beta) / beta^2.
    """
    if model_logits.dim() == 1:
        p = torch.sigmoid(true_logits)
        information = (p * (1 - p) * model_logits**2).sum()
    else:
        p = true_logits.softmax(-1)
        mean = (p * model_logits).sum(-1, keepdim=True)
        information = (p * (model_logits - mean) ** 2).sum()
    beta = 1 / FACTOR
    return 1 / math.sqrt(information.item()) / beta**2


@pytest.mark.parametrize("num_classes", [2, 5])
def test_recovers_the_over_confidence_factor(num_classes):
    logits, labels, true_logits = _problem(num_classes)
    temperature = fit_temperature(logits, labels)
    assert temperature.shape == () and temperature.dtype == logits.dtype
    tolerance = 4 * _temperature_standard_error(logits, true_logits)
    assert abs(temperature.item() - FACTOR) < tolerance


@pytest.mark.parametrize("num_classes", [2, 5])
def test_lowers_validation_nll_and_keeps_the_argmax(num_classes):
    logits, labels, _ = _problem(num_classes, seed=1)
    before = torch.sigmoid(logits) if num_classes == 2 else logits.softmax(-1)
    temperature = fit_temperature(logits, labels)
    after = temperature_scale(logits, temperature)
    assert negative_log_likelihood(after, labels) < negative_log_likelihood(before, labels) - 0.05
    if num_classes == 2:
        assert torch.equal(after > 0.5, before > 0.5)
    else:
        assert torch.equal(after.argmax(-1), before.argmax(-1))
    assert accuracy(after, labels) == accuracy(before, labels)


def test_under_confident_model_gets_temperature_below_one():
    logits, labels, _ = _problem(5, factor=0.5, seed=2)
    assert fit_temperature(logits, labels).item() == pytest.approx(0.5, rel=0.1)


def test_minimum_is_a_stationary_point_of_the_nll():
    logits, labels, _ = _problem(5, n=500, seed=3)
    temperature = fit_temperature(logits, labels, tol=1e-9).item()
    nearby = (temperature * 0.99, temperature, temperature * 1.01)
    nll = [torch.nn.functional.cross_entropy(logits / t, labels).item() for t in nearby]
    assert nll[1] <= nll[0] and nll[1] <= nll[2]


def test_separable_data_hits_the_lower_bound():
    logits = torch.tensor([[2.0, -2.0], [-1.0, 1.0]], dtype=torch.float64)
    labels = torch.tensor([0, 1])
    temperature = fit_temperature(logits, labels, bounds=(0.05, 10.0))
    # The NLL decreases towards 0 as T -> 0 and is numerically flat (< 1e-12) before the bound is reached.
    assert 0.05 <= temperature.item() < 0.1
    assert torch.nn.functional.cross_entropy(logits / temperature, labels).item() < 1e-12


@pytest.mark.parametrize(
    "logits, labels, kwargs, name",
    [
        (torch.zeros(3, 1), torch.zeros(3, dtype=torch.long), {}, "logits"),
        (torch.zeros(0, 2), torch.zeros(0, dtype=torch.long), {}, "logits"),
        (torch.tensor([[float("nan"), 0.0]]), torch.zeros(1, dtype=torch.long), {}, "logits"),
        (torch.zeros(3, 2), torch.zeros(2, dtype=torch.long), {}, "labels"),
        (torch.zeros(3, 2), torch.tensor([0, 1, 2]), {}, "labels"),
        (torch.zeros(3), torch.tensor([0, 1, 2]), {}, "labels"),
        (torch.zeros(3, 2), torch.zeros(3, dtype=torch.long), {"bounds": (0.0, 1.0)}, "bounds"),
    ],
)
def test_bad_inputs(logits, labels, kwargs, name):
    with pytest.raises(ValueError, match=name):
        fit_temperature(logits, labels, **kwargs)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("inf"), torch.ones(2)])
def test_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        temperature_scale(torch.zeros(3, 2), temperature)


def test_probabilities_passed_as_logits_raise():
    """Probabilities in place of logits (``pred.mean_probs``) gave a meaningless temperature without a word; their log
    is accepted, as are equal logits (rows that happen to be uniform) and binary log-odds in [0, 1]."""
    torch.manual_seed(0)
    logits = torch.randn(50, 3) * 3
    labels = torch.randint(0, 3, (50,))
    probs = logits.softmax(-1)
    for fn in (lambda z: fit_temperature(z, labels), lambda z: temperature_scale(z, 2.0)):
        for z in (probs, probs.double(), probs.half()):
            with pytest.raises(ValueError, match="logits look like probabilities.*log"):
                fn(z)
        fn(probs.log())
        fn(torch.full((50, 3), 1 / 3))
    fit_temperature(probs[:, 0], (labels == 0).long())  # (N,) binary log-odds may lie in [0, 1]


def test_log_of_half_precision_probabilities_with_underflowed_zeros_is_accepted():
    """float16 probabilities underflow to exactly 0 below 6e-8: their log holds -inf, which raised "logits must be
    finite", and the suggested ``probs.clamp_min(1e-12).log()`` was -inf again (1e-12 is 0 in float16). A -inf entry
    is the log of a zero probability and softmax treats it as such: the fit equals the one with that class's logit
    at a value so low that softmax gives it exactly 0 too."""
    model_logits, labels, _ = _problem(5, n=400)
    probs = model_logits.softmax(-1).half()
    keep = probs[torch.arange(400), labels] > 0  # the points whose label has a nonzero probability (a finite NLL)
    probs, labels = probs[keep], labels[keep]
    assert (probs == 0).any() and len(labels) > 300
    log_probs = probs.log()
    floor = torch.where(torch.isinf(log_probs), torch.full_like(log_probs, -1e4), log_probs)  # exp(-1e4 / T) == 0
    temperature = fit_temperature(log_probs, labels)
    assert temperature.dtype == torch.float32
    torch.testing.assert_close(temperature, fit_temperature(floor, labels), rtol=1e-6, atol=0)
    torch.testing.assert_close(temperature_scale(log_probs, temperature), temperature_scale(floor, temperature))
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="logits must be finite or -inf"):
            fit_temperature(log_probs.index_put((torch.tensor([0]), torch.tensor([0])), torch.tensor(bad).half()),
                            labels)
    with pytest.raises(ValueError, match="a row without a finite entry"):
        temperature_scale(torch.full((2, 3), -math.inf), 1.0)
    with pytest.raises(ValueError, match="logits must be finite"):  # binary log-odds: +-inf is 0 * inf in the NLL
        fit_temperature(torch.tensor([-math.inf, 0.0, 1.0]), torch.tensor([0, 1, 1]))
