# SPDX-License-Identifier: Apache-2.0
"""OUPath specifics: exact transitions, stationarity, Euler -> exact convergence, closed-form KL."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.distributions import kl_divergence

from pyro_sdebnn.distributions import OUPath, ou_stationary
from pyro_sdebnn.ops._ou import ou_transition

DTYPE = torch.float64


def _t(x):
    return torch.tensor(x, dtype=DTYPE)


@pytest.mark.parametrize("theta, sigma", [(1.0, 0.5), (0.3, 2.0), (4.0, 0.1)])
def test_exact_transition_moments(theta, sigma):
    times = _t([0.0, 0.05, 0.5, 2.0])
    coef, scale = ou_transition(times, _t(theta), _t(sigma), "exact")
    delta = np.diff(times.numpy())
    # exact OU transition: w_{k+1} | w_k ~ N(w_k e^{-theta delta}, sigma^2 (1 - e^{-2 theta delta}) / (2 theta))
    np.testing.assert_allclose(coef.numpy(), np.exp(-theta * delta), rtol=1e-12)
    expected_var = sigma**2 * (1 - np.exp(-2 * theta * delta)) / (2 * theta)
    np.testing.assert_allclose(scale.numpy() ** 2, expected_var, rtol=1e-12)


def test_euler_transition_moments():
    times = _t([0.0, 0.1, 0.3])
    coef, scale = ou_transition(times, _t(2.0), _t(0.5), "euler")
    np.testing.assert_allclose(coef.numpy(), [1 - 2.0 * 0.1, 1 - 2.0 * 0.2], rtol=1e-12)
    np.testing.assert_allclose(scale.numpy() ** 2, [0.25 * 0.1, 0.25 * 0.2], rtol=1e-12)


def test_exact_marginals_match_continuous_time():
    theta, sigma = 1.7, 0.6
    times = _t([0.2, 0.3, 0.9, 1.4, 3.0])
    init = _t([1.5, -0.4])
    d = OUPath(init, sigma, times, theta)
    t = (times[1:] - times[0]).numpy()
    mean = init.numpy()[None, :] * np.exp(-theta * t)[:, None]
    var = sigma**2 * (1 - np.exp(-2 * theta * t)) / (2 * theta)
    np.testing.assert_allclose(d.mean.numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(d.variance.numpy(), np.broadcast_to(var[:, None], (4, 2)), rtol=1e-12)


def test_stationarity():
    # w_0 ~ N(0, sigma^2 / (2 theta)) in its own site; then every marginal keeps that law
    theta, sigma, n = 2.0, 0.8, 40000
    times = _t([0.0, 0.1, 0.4, 1.0, 2.5])
    w0 = ou_stationary(_t(sigma), _t(theta)).sample((n, 1))
    paths = OUPath(w0, sigma, times, theta).sample()  # (n, K, 1)
    stationary_var = sigma**2 / (2 * theta)
    # SE of a sample mean: sqrt(v / n); of a Gaussian sample variance: v sqrt(2 / (n - 1)); 5 SE each
    assert paths.mean(0).abs().max() < 5 * math.sqrt(stationary_var / n)
    assert (paths.var(0) - stationary_var).abs().max() < 5 * stationary_var * math.sqrt(2 / (n - 1))


def test_ou_stationary_law():
    p = ou_stationary(_t([0.2, 1.0]), 0.5)
    torch.testing.assert_close(p.scale, _t([0.2, 1.0]))  # sigma / sqrt(2 * 0.5)
    torch.testing.assert_close(p.loc, _t([0.0, 0.0]))
    d = OUPath(_t([0.0]), _t(0.3), _t([0.0, 1.0]), theta=_t(2.0))
    torch.testing.assert_close(d.stationary_scale, _t(0.3 / 2.0))


def test_euler_converges_to_exact_at_first_order():
    # weak error of Euler-Maruyama on the marginal law at t = 1 is O(dt): halving dt halves the error
    theta, sigma, init = 1.5, 0.7, _t([1.0])
    errors = []
    steps = [8, 16, 32, 64, 128]
    exact = OUPath(init, sigma, torch.linspace(0, 1, 2, dtype=DTYPE), theta)
    for n in steps:
        euler = OUPath(init, sigma, torch.linspace(0, 1, n + 1, dtype=DTYPE), theta, method="euler")
        err = (euler.mean[-1] - exact.mean[-1]).abs() + (euler.variance[-1] - exact.variance[-1]).abs()
        errors.append(err.item())
    slope = np.polyfit(np.log(1.0 / np.array(steps)), np.log(errors), 1)[0]
    assert all(b < a for a, b in zip(errors, errors[1:]))
    assert 0.9 < slope < 1.1, (errors, slope)


def test_euler_kl_is_discretised_girsanov():
    # KL = |a_1 w0_q - a'_1 w0_p|^2 / (2 sigma^2 dt_1)
    #      + sum_{k>=2} dt_k / 2 E_q[((theta_p - theta_q) w_{k-1} / sigma)^2]
    times = _t([0.0, 0.1, 0.15, 0.4, 0.5])
    sigma, theta_q, theta_p = 0.5, 2.0, 0.7
    init_q, init_p = _t([0.3, -1.0]), _t([0.1, -0.9])
    q = OUPath(init_q, sigma, times, theta_q, method="euler")
    p = OUPath(init_p, sigma, times, theta_p, method="euler")
    dt = np.diff(times.numpy())
    mean_gap = (1 - theta_q * dt[0]) * init_q.numpy() - (1 - theta_p * dt[0]) * init_p.numpy()
    first = mean_gap**2 / (2 * sigma**2 * dt[0])
    second_moment = (q.mean.numpy() ** 2 + q.variance.numpy())[:-1]  # E_q[w_{k-1}^2], k = 2..K
    rest = (dt[1:, None] / 2 * (theta_p - theta_q) ** 2 * second_moment / sigma**2).sum()
    np.testing.assert_allclose(kl_divergence(q, p).item(), first.sum() + rest, rtol=1e-10)


def test_exact_kl_equal_theta_is_initial_mismatch_only():
    times = _t([0.0, 0.2, 0.7, 1.0])
    sigma, theta = 0.4, 1.3
    q = OUPath(_t([0.5, 1.0]), sigma, times, theta)
    p = OUPath(_t([0.0, 1.2]), sigma, times, theta)
    a = math.exp(-theta * 0.2)
    s2 = sigma**2 * (1 - math.exp(-2 * theta * 0.2)) / (2 * theta)
    expected = a**2 * ((0.5 - 0.0) ** 2 + (1.0 - 1.2) ** 2) / (2 * s2)
    np.testing.assert_allclose(kl_divergence(q, p).item(), expected, rtol=1e-10)
    torch.testing.assert_close(kl_divergence(q, q), _t(0.0))


def test_kl_requires_same_sigma_and_times():
    times = _t([0.0, 0.5, 1.0])
    q = OUPath(_t([0.0]), 0.5, times)
    with pytest.raises(ValueError, match="sigma"):
        kl_divergence(q, OUPath(_t([0.0]), 0.6, times))
    with pytest.raises(ValueError, match="times"):
        kl_divergence(q, OUPath(_t([0.0]), 0.5, _t([0.0, 0.4, 1.0])))


def test_log_prob_gradients_for_learnable_init():
    times = torch.linspace(0, 1, 6, dtype=DTYPE)
    init = torch.zeros(3, dtype=DTYPE, requires_grad=True)
    sigma = torch.tensor(0.5, dtype=DTYPE, requires_grad=True)
    path = OUPath(torch.ones(3, dtype=DTYPE), 0.5, times).sample()
    OUPath(init, sigma, times).log_prob(path).backward()
    assert torch.isfinite(init.grad).all() and init.grad.abs().sum() > 0
    assert torch.isfinite(sigma.grad)


def test_dtype_follows_init():
    init = torch.zeros(2, dtype=torch.float32)
    d = OUPath(init, torch.tensor(0.5, dtype=torch.float64), torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))
    x = d.rsample()
    assert x.dtype == d.mean.dtype == d.log_prob(x).dtype == d.times.dtype == d.sigma.dtype == torch.float32


def test_infer_shapes():
    batch_shape, event_shape = OUPath.infer_shapes(init=(4, 1, 3), sigma=(5,), times=(11,), theta=())
    assert batch_shape == (4, 5) and event_shape == (10, 3)
    d = OUPath(torch.zeros(4, 1, 3), torch.ones(5), torch.linspace(0, 1, 11))
    assert (d.batch_shape, d.event_shape) == (batch_shape, event_shape)


@pytest.mark.parametrize(
    "times",
    [[0.0, 0.5, 0.5], [1.0, 0.5], [0.0], [[0.0, 1.0]]],
    ids=["repeated", "decreasing", "single", "2d"],
)
def test_bad_times_raise(times):
    with pytest.raises(ValueError, match="times"):
        OUPath(torch.zeros(2), 1.0, torch.tensor(times))


def test_bad_options_raise():
    times = torch.tensor([0.0, 1.0])
    with pytest.raises(ValueError, match="method"):
        OUPath(torch.zeros(2), 1.0, times, method="milstein")
    with pytest.raises(ValueError, match="init"):
        OUPath(torch.tensor(0.0), 1.0, times)
    with pytest.raises(TypeError, match="init"):
        OUPath([0.0, 1.0], 1.0, times)


def test_times_are_checked_for_shape_always_and_for_order_under_validation():
    init = torch.zeros(3)
    with pytest.raises(ValueError, match="at least 2 entries"):
        OUPath(init, 1.0, torch.tensor([0.0]), validate_args=False)
    with pytest.raises(ValueError, match="strictly increasing"):
        OUPath(init, 1.0, torch.tensor([0.0, 0.5, 0.5]), validate_args=True)
    # without validation the order is not read back to the host (a GPU synchronisation per path otherwise)
    assert OUPath(init, 1.0, torch.tensor([0.0, 0.5, 0.5]), validate_args=False).event_shape == (2, 3)


def test_integer_init_and_non_numeric_scales_are_named():
    times = torch.tensor([0.0, 1.0])
    # an integer init gave sigma its dtype: sigma=0.5 became 0 and was reported as "sigma ... found invalid values: 0"
    with pytest.raises(TypeError, match="`init` must be a floating-point tensor, got dtype torch.int64"):
        OUPath(torch.zeros(2, dtype=torch.long), 0.5, times)
    with pytest.raises(TypeError, match="`sigma` must be a tensor or a real number, got str"):
        OUPath(torch.zeros(2), "0.5", times)
    with pytest.raises(TypeError, match="`theta` must be a tensor or a real number, got bool"):
        OUPath(torch.zeros(2), 0.5, times, theta=True)
    assert OUPath(torch.zeros(2), np.float32(0.5), times, theta=np.int64(2)).sigma.item() == 0.5


@pytest.mark.parametrize("sigma, theta, name", [(-1.0, 1.0, "sigma"), (0.5, -1.0, "theta"), (0.0, 1.0, "sigma")])
def test_ou_stationary_checks_its_parameters_under_validation(sigma, theta, name):
    # sigma enters squared: ou_stationary(-1.0) was a valid-looking N(0, 0.5); theta < 0 failed as "scale ... nan"
    with pytest.raises(ValueError, match=f"ou_stationary: `{name}` must be positive"):
        ou_stationary(sigma, theta)
    previous = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        ou_stationary(sigma, theta)  # no check (and no device synchronisation) without validation
    finally:
        torch.distributions.Distribution.set_default_validate_args(previous)
