# SPDX-License-Identifier: Apache-2.0
"""Limiting cases of the pure SG-MCMC update rules (BlackJAX-style tests)."""

import math

import pytest
import torch

from pyro_sdebnn.infer.mcmc import CyclicalStepSize, PolynomialDecay
from pyro_sdebnn.infer.mcmc.schedules import ConstantStepSize, as_schedule
from pyro_sdebnn.ops.sgmcmc import (
    PreconditionedSGLDState,
    SGHMCState,
    SGLDState,
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
