# SPDX-License-Identifier: Apache-2.0
"""Limiting cases of the pure SG-MCMC update rules (BlackJAX-style tests)."""

import math

import pytest
import torch

from pyro_sdebnn.infer.mcmc import CyclicalStepSize, PolynomialDecay
from pyro_sdebnn.infer.mcmc.schedules import ConstantStepSize, as_schedule
from pyro_sdebnn.ops.sgmcmc import (
    LMSGLDState,
    PreconditionedSGLDState,
    SGHMCState,
    SGLDState,
    lm_sgld_step,
    preconditioned_sgld_step,
    sghmc_step,
    sgld_step,
)

SHAPES = [(3,), (2, 5)]


@pytest.mark.parametrize("shape", SHAPES)
def test_sgld_zero_gradient_zero_temperature_does_not_move(shape):
    position = torch.randn(shape)
    new = sgld_step(torch.randn(shape), SGLDState(position), torch.zeros(shape), step_size=0.1, temperature=0.0)
    assert torch.equal(new.position, position)


@pytest.mark.parametrize("shape", SHAPES)
def test_psgld_zero_gradient_zero_temperature_does_not_move(shape):
    state = PreconditionedSGLDState(torch.randn(shape), torch.rand(shape))
    new = preconditioned_sgld_step(torch.randn(shape), state, torch.zeros(shape), 0.1, temperature=0.0)
    assert torch.equal(new.position, state.position)


@pytest.mark.parametrize("shape", SHAPES)
def test_sghmc_zero_gradient_zero_temperature_friction_decays_momentum(shape):
    step_size, friction, num_steps = 0.1, 2.0, 7
    state = SGHMCState(torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64))
    v0, w0 = state.momentum, state.position
    for _ in range(num_steps):
        state = sghmc_step(torch.randn(shape, dtype=torch.float64), state, torch.zeros_like(v0), step_size, friction,
                           temperature=0.0)
    decay = 1 - step_size * friction
    torch.testing.assert_close(state.momentum, decay**num_steps * v0)
    # w moves by eta * sum_k decay^k v0 (geometric series)
    torch.testing.assert_close(state.position, w0 + step_size * v0 * decay * (1 - decay**num_steps) / (1 - decay))


def test_sgld_is_gradient_descent_at_zero_temperature():
    position, grad = torch.tensor([1.0, -2.0]), torch.tensor([4.0, 2.0])
    new = sgld_step(torch.randn(2), SGLDState(position), grad, step_size=0.5, temperature=0.0)
    torch.testing.assert_close(new.position, position - 0.25 * grad)


@pytest.mark.parametrize("temperature", [1.0, 0.25])
def test_sgld_noise_variance_is_step_size_times_temperature(temperature):
    # zero gradient: w_1 - w_0 = sqrt(eta T) xi, so Var = eta T; 4 standard errors of a variance from n draws
    n, eta = 20000, 0.3
    new = sgld_step(torch.randn(n, dtype=torch.float64), SGLDState(torch.zeros(n, dtype=torch.float64)),
                    torch.zeros(n, dtype=torch.float64), eta, temperature)
    expected = eta * temperature
    assert abs(new.position.var().item() - expected) < 4 * expected * math.sqrt(2 / n)


def _stationary_variance(step, curvature, eta, temperature, inv_mass, n=20000, num_steps=300):
    """Variance of n independent chains of ``step`` on U(w) = curvature w^2 / 2 after num_steps steps from 0."""
    generator = torch.Generator().manual_seed(0)
    dtype = torch.float64
    position = torch.zeros(n, dtype=dtype)
    state = SGLDState(position) if step is sgld_step else LMSGLDState(position, torch.zeros_like(position))
    for _ in range(num_steps):  # the distance to stationarity shrinks by |1 - eta M^-1 curvature / 2| per step
        noise = torch.randn(n, dtype=dtype, generator=generator)
        state = step(noise, state, curvature * state.position, eta, temperature, inv_mass)
    return state.position.var().item()


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_lm_sgld_is_exact_on_a_gaussian_near_the_stability_limit_where_euler_is_not(temperature):
    # preconditioned curvature h = M^-1 * curvature = 100, eta h = 3: three quarters of the stability limit eta h < 4.
    # Target variance T / curvature; Euler-Maruyama's stationary variance is T / (curvature (1 - eta h / 4)), 4x here.
    curvature, inv_mass = 400.0, torch.tensor(0.25, dtype=torch.float64)
    eta = 3.0 / (curvature * inv_mass.item())
    target = temperature / curvature
    se = target * math.sqrt(2 / 20000)  # standard error of a variance from 20,000 independent chains
    lm = _stationary_variance(lm_sgld_step, curvature, eta, temperature, inv_mass)
    assert abs(lm - target) < 4 * se, (lm, target)
    euler = _stationary_variance(sgld_step, curvature, eta, temperature, inv_mass)
    assert abs(euler - 4 * target) < 4 * 4 * se, (euler, 4 * target)


def test_lm_sgld_averages_this_and_the_previous_noise_and_keeps_this_one():
    state = LMSGLDState(torch.tensor([1.0, -1.0]), torch.tensor([2.0, 0.0]))
    noise, grad = torch.tensor([0.0, 4.0]), torch.tensor([1.0, 2.0])
    new = lm_sgld_step(noise, state, grad, step_size=0.25, temperature=4.0, inv_mass=torch.tensor([1.0, 0.5]))
    # w - eta/2 M^-1 g + sqrt(eta T M^-1) (xi_n + xi_n+1) / 2
    expected = torch.tensor([1.0 - 0.125 + 1.0 * 1.0, -1.0 - 0.125 + 0.5**0.5 * 2.0])
    torch.testing.assert_close(new.position, expected)
    assert torch.equal(new.noise, noise)
    assert torch.equal(state.noise, torch.tensor([2.0, 0.0]))  # out of place


def test_sghmc_step_size_tensor_matches_float():
    state = SGHMCState(torch.randn(4), torch.randn(4))
    noise, grad = torch.randn(4), torch.randn(4)
    a = sghmc_step(noise, state, grad, 0.01, 0.5, 0.1, 0.7)
    b = sghmc_step(noise, state, grad, torch.tensor(0.01), 0.5, 0.1, 0.7)
    torch.testing.assert_close(a.position, b.position)
    torch.testing.assert_close(a.momentum, b.momentum)


def test_schedules():
    assert as_schedule(0.1)(100) == 0.1
    decay = PolynomialDecay(a=0.5, b=2.0, gamma=0.75)
    assert decay(6) == pytest.approx(0.5 * 8**-0.75)
    cyc = CyclicalStepSize(1.0, cycle_length=10)
    assert cyc(0) == 1.0 and cyc(10) == 1.0 and cyc(5) == pytest.approx(0.5)
    assert ConstantStepSize(0.2).is_constant and not decay.is_constant


@pytest.mark.parametrize("bad", [0.0, -1e-3, float("nan"), float("inf")])
def test_schedule_rejects_non_positive_step_size(bad):
    with pytest.raises(ValueError, match="step_size"):
        as_schedule(bad)


def test_schedule_rejects_callable():
    with pytest.raises(TypeError, match="StepSizeSchedule"):
        as_schedule(lambda t: 0.1)


@pytest.mark.parametrize("bad, error", [(float("inf"), ValueError), (float("nan"), ValueError), (-1e-3, ValueError),
                                        ("1e-4", TypeError)])
def test_cyclical_schedule_rejects_a_bad_floor(bad, error):
    # an infinite floor made every step infinite (reported later as a divergence); a NaN or a string got through
    with pytest.raises(error, match="min_step_size"):
        CyclicalStepSize(1e-2, cycle_length=10, min_step_size=bad)
