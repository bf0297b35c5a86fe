# SPDX-License-Identifier: Apache-2.0
"""RMSE, Gaussian-mixture log-likelihood (with units), interval coverage and the variance decomposition."""

import math

import pytest
import torch

from pyro_sdebnn.metrics import (
    gaussian_mixture_log_likelihood,
    interval_coverage,
    regression_variance_decomposition,
    rmse,
)


def test_rmse_hand_computed_and_units():
    mean, y = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), torch.tensor([1.0, 4.0, 0.0], dtype=torch.float64)
    assert rmse(mean, y).item() == pytest.approx(math.sqrt(13 / 3), rel=1e-12)
    assert rmse(mean, y, y_scale=2.5).item() == pytest.approx(2.5 * math.sqrt(13 / 3), rel=1e-12)


def test_single_gaussian_log_likelihood_is_the_normal_log_density():
    loc, scale, y = torch.randn(20, dtype=torch.float64), torch.rand(20, dtype=torch.float64) + 0.5, torch.randn(20)
    expected = torch.distributions.Normal(loc, scale).log_prob(y.double()).mean()
    assert torch.allclose(gaussian_mixture_log_likelihood(loc, scale, y), expected, atol=1e-12)


def test_mixture_log_likelihood_hand_computed():
    # 0.5 N(1; -1, 1) + 0.5 N(1; 1, 1) = (1 + e^{-2}) / (2 sqrt(2 pi))
    value = gaussian_mixture_log_likelihood(
        torch.tensor([[-1.0], [1.0]], dtype=torch.float64), torch.ones(2, 1, dtype=torch.float64), torch.tensor([1.0])
    )
    assert value.item() == pytest.approx(math.log((1 + math.exp(-2)) / 2) - 0.5 * math.log(2 * math.pi), rel=1e-12)


def test_log_likelihood_in_original_units_equals_direct_computation():
    # Standardised predictive + y_scale gives the log density of the original-unit mixture.
    loc, scale = torch.randn(5, 30, dtype=torch.float64), torch.rand(5, 30, dtype=torch.float64) + 0.2
    y = torch.randn(30, dtype=torch.float64)
    y_loc, y_scale = 22.5, 9.2
    standardised = gaussian_mixture_log_likelihood(loc, scale, y, y_scale=y_scale)
    direct = gaussian_mixture_log_likelihood(loc * y_scale + y_loc, scale * y_scale, y * y_scale + y_loc)
    assert standardised.item() == pytest.approx(direct.item(), rel=1e-12)


def test_log_likelihood_is_finite_far_in_the_tails():
    value = gaussian_mixture_log_likelihood(torch.zeros(3, 1), torch.full((3, 1), 0.01), torch.tensor([50.0]))
    assert torch.isfinite(value)


def test_coverage_of_a_single_gaussian_is_the_z_interval():
    loc, scale = torch.zeros(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64)
    y = torch.tensor([0.0, 1.0, -1.5, 1.95, -1.97, 3.0], dtype=torch.float64)
    # The 95 % central interval is +-1.959964: the first four are inside.
    assert interval_coverage(loc, scale, y, level=0.95).item() == pytest.approx(4 / 6)
    # The 50 % interval is +-0.6745: only 0 is inside; the 99 % interval (+-2.5758) holds all but 3.0.
    assert interval_coverage(loc, scale, y, level=0.5).item() == pytest.approx(1 / 6)
    assert interval_coverage(loc, scale, y, level=0.99).item() == pytest.approx(5 / 6)


@pytest.mark.parametrize("level", [0.5, 0.9, 0.95])
def test_coverage_of_a_calibrated_mixture_is_the_level(level):
    generator = torch.Generator().manual_seed(0)
    n, s = 20000, 4
    loc = torch.randn(s, n, generator=generator, dtype=torch.float64) * 2
    scale = torch.rand(s, n, generator=generator, dtype=torch.float64) + 0.3
    component = torch.randint(0, s, (n,), generator=generator)
    idx = torch.arange(n)
    y = loc[component, idx] + scale[component, idx] * torch.randn(n, generator=generator, dtype=torch.float64)
    # y is drawn from the predictive, so coverage ~ Binomial(n, level) / n: sd = sqrt(level (1 - level) / n).
    tolerance = 4 * math.sqrt(level * (1 - level) / n)
    assert abs(interval_coverage(loc, scale, y, level).item() - level) < tolerance


def test_variance_decomposition_delegates_to_regression_prediction():
    from pyro_sdebnn.predictive import RegressionPrediction

    loc, scale = torch.randn(7, 11, dtype=torch.float64), torch.rand(7, 11, dtype=torch.float64)
    total, aleatoric, epistemic = regression_variance_decomposition(loc, scale)
    assert torch.allclose(aleatoric, scale.pow(2).mean(0)) and torch.allclose(epistemic, loc.var(0, unbiased=False))
    assert torch.allclose(total, aleatoric + epistemic)
    from_prediction = regression_variance_decomposition(RegressionPrediction(loc, scale))
    assert all(torch.equal(a, b) for a, b in zip(from_prediction, (total, aleatoric, epistemic)))


def test_prediction_objects_are_accepted():
    from pyro_sdebnn.predictive import RegressionPrediction

    prediction = RegressionPrediction(torch.tensor([[0.0, 1.0], [2.0, 1.0]]), torch.ones(2, 2))
    y = torch.tensor([1.0, 1.0])
    assert rmse(prediction, y).item() == 0
    assert gaussian_mixture_log_likelihood(prediction, None, y).item() == pytest.approx(
        gaussian_mixture_log_likelihood(prediction.loc, prediction.scale, y).item()
    )


def test_y_scale_and_level_accept_numpy_scalars_and_one_element_tensors():
    # A standardisation written with torch or numpy gives y_scale as a tensor or a NumPy scalar (np.float32 is not a
    # Python float); both used to be refused as "not a positive finite number".
    import numpy as np

    loc, scale = torch.tensor([[0.0, 1.0, -1.0]]), torch.tensor([[1.0, 0.5, 2.0]])
    y = torch.tensor([0.3, 1.2, 0.4])
    for y_scale in (np.float32(2.5), torch.tensor(2.5), torch.tensor([2.5], dtype=torch.float64), np.array(2.5)):
        assert rmse(loc[0], y, y_scale=y_scale).item() == pytest.approx(rmse(loc[0], y, y_scale=2.5).item())
        assert gaussian_mixture_log_likelihood(loc, scale, y, y_scale=y_scale).item() == pytest.approx(
            gaussian_mixture_log_likelihood(loc, scale, y, y_scale=2.5).item()
        )
    for level in (np.float32(0.5), torch.tensor(0.5)):
        assert interval_coverage(loc, scale, y, level=level).item() == interval_coverage(loc, scale, y, 0.5).item()
    for bad in (torch.tensor([2.0, 3.0]), torch.tensor(-1.0), True, "2.5"):
        with pytest.raises(ValueError, match="y_scale must be a positive finite number"):
            rmse(loc[0], y, y_scale=bad)
    with pytest.raises(ValueError, match=r"level must be a number in \(0, 1\)"):
        interval_coverage(loc, scale, y, level=torch.tensor(1.5))
