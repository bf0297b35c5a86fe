# SPDX-License-Identifier: Apache-2.0
"""Solvers of the augmented SDE-BNN state: our Euler loop vs torchsde, adjoint vs backprop, adjoint memory."""

import pytest
import torch

from pyro_sdebnn.nn.sde_drift import DriftMLP
from pyro_sdebnn.nn.sde_drift import TimeMLPField
from pyro_sdebnn.testing import OUEndpointProblem
from pyro_sdebnn.ops import AugmentedPathSDE, euler_maruyama_kl, sdeint_augmented
from pyro_sdebnn.ops.sde_solve import time_grid
from pyro_sdebnn.ops.sde_solve import brownian_interval, increments_from_brownian

N, STATE, HIDDEN, SIGMA = 3, 3, 4, 0.5


def _problem(dt, seed=0, n=N):
    torch.manual_seed(seed)
    times = time_grid((0.0, 1.0), dt, dtype=torch.float64)
    field = TimeMLPField(STATE, HIDDEN)
    dim = field.num_weights
    drift = DriftMLP(dim, hidden=8).double()
    with torch.no_grad():
        for p in drift.out.parameters():
            p.normal_(0, 0.1)
    h0 = torch.randn(n, STATE, dtype=torch.float64)
    w0 = field.init_weights().double().requires_grad_()

    def flat_field(t, h, w):
        return field(t, h.reshape(h.shape[0], n, STATE), w).reshape(h.shape[0], -1)

    sde = AugmentedPathSDE(dim, n * STATE, SIGMA, 1.0, drift, flat_field)
    return times, sde, drift, w0, h0, flat_field


def test_time_grid_has_no_extra_step():
    for dt in (0.1, 0.01, 0.05, 1 / 3):
        grid = time_grid((0.0, 1.0), dt)
        assert grid.shape[0] == round(1 / dt) + 1
        assert grid[-1].item() == 1.0 and grid.dtype == torch.float32


@pytest.mark.parametrize("bad", [dict(t_span=(1.0, 0.0), dt=0.1), dict(t_span=(0.0, 1.0), dt=0.0),
                                 dict(t_span=(0.0, 1.0), dt=-0.1)])
def test_time_grid_errors(bad):
    with pytest.raises(ValueError, match="t_span|dt"):
        time_grid(**bad)


@pytest.mark.parametrize("t_span", [(0.0, float("inf")), (float("-inf"), 0.0), 1.0, (0.0, 1.0, 2.0), ("a", 1.0)])
def test_time_grid_names_a_bad_t_span(t_span):
    """An infinite end point was a raw OverflowError from round(), a scalar a TypeError "not iterable", three
    numbers "too many values to unpack": each is now a ValueError naming t_span."""
    with pytest.raises(ValueError, match="t_span must be"):
        time_grid(t_span, 0.1)


def test_euler_loop_matches_torchsde_euler_on_the_same_brownian_path():
    # same BrownianInterval through both solvers; torchsde accumulates t += dt in floating point, so
    # its queries hit the interval at times ~1e-16 off the grid points, which perturbs the increments
    # by O(1e-8) (Brownian bridge over 1e-16-long pieces); hence 1e-6 rather than bitwise equality
    times, sde, drift, w0, h0, flat_field = _problem(0.05)
    batch = 2
    bm = brownian_interval(times, (batch, sde.weight_dim), entropy=11)
    dB = increments_from_brownian(bm, times).transpose(0, 1)
    ours = euler_maruyama_kl(w0.detach(), times, dB, SIGMA, 1.0, drift, estimator="analytic", field=flat_field,
                             hidden_init=h0.reshape(1, -1).expand(batch, -1))
    ref = sdeint_augmented(sde, w0.detach().expand(batch, -1), h0.reshape(1, -1).expand(batch, -1), times,
                           method="euler", bm=bm)
    assert torch.allclose(ours.path, ref.path, atol=1e-6, rtol=0)
    assert torch.allclose(ours.hidden, ref.hidden, atol=1e-6, rtol=0)
    assert torch.allclose(ours.kl, ref.kl, atol=1e-6, rtol=0)


def _torchsde_hidden(method, dt=0.05):
    times, sde, drift, w0, h0, _ = _problem(dt)
    bm = brownian_interval(times, (2, sde.weight_dim), entropy=3,
                           levy_area_approximation="space-time")
    return sdeint_augmented(sde, w0.detach().expand(2, -1), h0.reshape(1, -1).expand(2, -1), times, method=method,
                            bm=bm, return_path=False).hidden


def test_milstein_equals_euler_for_additive_noise():
    # the diffusion [sigma I; 0; 0] does not depend on the state: the Milstein correction vanishes
    assert torch.allclose(_torchsde_hidden("milstein"), _torchsde_hidden("euler"), atol=1e-12, rtol=0)


def test_srk_close_to_euler():
    # at dt = 0.05 both strong errors against a fine-step reference are of order 1e-2 (max over hidden units,
    # Euler's the larger); 0.05 bounds their difference with margin
    assert torch.allclose(_torchsde_hidden("srk"), _torchsde_hidden("euler"), atol=5e-2, rtol=0)


def _adjoint_gradient_gap(dt):
    times, sde, drift, w0, h0, _ = _problem(dt)
    bm = brownian_interval(times, (2, sde.weight_dim), entropy=5)
    grads = []
    for adjoint in (False, True):
        w0.grad = None
        drift.zero_grad()
        sol = sdeint_augmented(sde, w0.expand(2, -1), h0.reshape(1, -1).expand(2, -1), times, method="euler", bm=bm,
                               adjoint=adjoint, return_path=False)
        (sol.hidden.pow(2).sum() + sol.kl.sum()).backward()
        grads.append(torch.cat([w0.grad.reshape(-1)] + [p.grad.reshape(-1) for p in drift.parameters()]))
    return ((grads[1] - grads[0]).norm() / grads[0].norm()).item()


@pytest.mark.slow
def test_adjoint_gradients_agree_with_backprop():
    # float64, same Brownian path. The stochastic adjoint solves a discretised backward SDE, so its
    # gradient differs from the exact gradient of the discretised forward solve by O(dt), a few percent at
    # dt = 0.01. Tolerance: 5 % at dt = 0.01, and the gap must shrink with dt.
    coarse, fine = _adjoint_gradient_gap(0.05), _adjoint_gradient_gap(0.01)
    assert fine < 0.05
    assert fine < coarse


def _saved_bytes(steps, adjoint, estimator="analytic", n=N):
    """Bytes of distinct tensor storages that autograd saves for backward during one forward solve.

    This is the memory held between forward and backward, the part that grows with the number of
    steps under backprop (CPU has no ``torch.cuda.max_memory_allocated``; counted with
    :func:`torch.autograd.graph.saved_tensors_hooks`, deduplicated by storage pointer).
    """
    times, sde, drift, w0, h0, _ = _problem(1.0 / steps, n=n)
    bm = brownian_interval(times, (2, sde.weight_dim), entropy=5)
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sol = sdeint_augmented(sde, w0.expand(2, -1), h0.reshape(1, -1).expand(2, -1), times, method="euler",
                               bm=bm, adjoint=adjoint, return_path=False, estimator=estimator)

    assert sol.hidden.requires_grad
    return sum(storages.values())


@pytest.mark.slow
def test_adjoint_memory_constant_in_steps():
    adjoint_10, adjoint_1000 = _saved_bytes(10, True), _saved_bytes(1000, True)
    backprop_1000 = _saved_bytes(1000, False)
    assert adjoint_1000 <= 2 * adjoint_10
    assert adjoint_1000 <= 0.15 * backprop_1000


def _ou_gradients(estimator, method, adjoint, samples=256, dt=0.02):
    """Per-sample gradients of the negative ELBO w.r.t. the drift scale alpha at the true posterior (alpha = 1) of
    the OU end-point problem, through torchsde: alpha has one entry per sample, so one backward pass gives them all."""
    problem = OUEndpointProblem(torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64), 0.3, 0.8)
    times = time_grid((0.0, 1.0), dt, dtype=torch.float64)
    drift = problem.drift(alpha=1.0)
    drift.alpha = torch.nn.Parameter(torch.ones(samples, 1, dtype=torch.float64))
    sde = AugmentedPathSDE(1, 0, problem.sigma, problem.theta, drift)
    bm = brownian_interval(times, (samples, 1), entropy=7, levy_area_approximation="space-time")
    sol = sdeint_augmented(sde, problem.init.expand(samples, 1), None, times, method=method, adjoint=adjoint, bm=bm,
                           estimator=estimator)
    loss = sol.kl - problem.log_likelihood(sol.path[:, -1])
    return torch.autograd.grad(loss.sum(), drift.alpha)[0].squeeze(-1)


@pytest.mark.parametrize("method, adjoint", [("euler", False), ("euler", True), ("srk", False)])
def test_stl_gradient_variance_through_torchsde(method, adjoint):
    # at the true posterior the stl gradient variance is far below analytic's and full_mc's (Xu et al. 2022,
    # App. A.2, Fig. 4): zero on every path up to the discretisation error, against O(1) for the other two
    grads = {e: _ou_gradients(e, method, adjoint) for e in ("stl", "analytic", "full_mc")}
    n = grads["stl"].numel()
    var = {e: g.var() for e, g in grads.items()}
    se = {e: v * (2 / (n - 1)) ** 0.5 for e, v in var.items()}  # standard error of a sample variance
    for other in ("analytic", "full_mc"):
        assert var["stl"] + 4 * se["stl"] < var[other] - 4 * se[other]
        # same expectation: the mean paired difference is within 4 standard errors of zero
        diff = grads["stl"] - grads[other]
        assert diff.mean().abs() < 4 * diff.std() / n ** 0.5


@pytest.mark.parametrize("estimator", ["stl", "full_mc"])
def test_adjoint_memory_of_the_hidden_state_constant_in_steps(estimator):
    # the Itô KL term is backpropagated along the weights only: what the adjoint stores per step does not grow
    # with the hidden state (here 100x larger), while backprop's does
    def per_step(n, adjoint):
        return (_saved_bytes(200, adjoint, estimator, n) - _saved_bytes(20, adjoint, estimator, n)) / 180

    small, large = per_step(3, True), per_step(300, True)
    assert large <= 1.01 * small
    assert per_step(300, False) > 10 * large


def test_brownian_of_another_size_rejected():
    # only the D weights are noisy: a Brownian motion must have size (batch, D), and one that also spans the hidden
    # state and the KL channel, (batch, D + H + 1), is refused with the size expected
    times, sde, drift, w0, h0, _ = _problem(0.1)
    wide = brownian_interval(times, (2, sde.weight_dim + sde.hidden_dim + 1), entropy=2)
    with pytest.raises(ValueError, match="bm must have size"):
        sdeint_augmented(sde, w0.detach().expand(2, -1), h0.reshape(1, -1).expand(2, -1), times, bm=wide)
    with pytest.raises(ValueError, match="bm must have size"):
        sdeint_augmented(sde, w0.detach().expand(2, -1), None, times, bm=brownian_interval(times, (2, 5)))


def test_time_grid_takes_numpy_steps():
    import numpy as np

    # np.float32 is no Python float: it was refused as "dt must be a positive finite float, got np.float32(0.25)"
    torch.testing.assert_close(time_grid((0.0, 1.0), np.float32(0.25)), time_grid((0.0, 1.0), 0.25))
    with pytest.raises(ValueError, match="dt must be"):
        time_grid((0.0, 1.0), True)


def test_initial_states_of_the_wrong_shape_are_named():
    times = torch.linspace(0, 1, 5)
    dB = torch.zeros(4, 4, 3)
    # these failed inside torch / torchsde ("The expanded size of the tensor (3) must match ...", "State sizes not
    # consistent", "Tensors must have same number of dimensions")
    with pytest.raises(ValueError, match=r"init must broadcast to the state shape .* \(4, 3\), got \(2,\)"):
        euler_maruyama_kl(torch.zeros(2), times, dB, 0.5, 1.0)
    for init in (torch.zeros(3), torch.zeros(4, 1), torch.zeros(())):  # broadcastable initial states still work
        assert euler_maruyama_kl(init, times, dB, 0.5, 1.0).path.shape == (4, 4, 3)
    for init in (torch.zeros(2, 4, 3), torch.zeros(5, 3)):
        with pytest.raises(ValueError, match="init must broadcast"):
            euler_maruyama_kl(init, times, dB, 0.5, 1.0)
    sde = AugmentedPathSDE(3, 2, 0.5, 1.0)
    for init in (torch.zeros(3), torch.zeros(2, 4)):
        with pytest.raises(ValueError, match=r"init must have shape \(batch, D=3\)"):
            sdeint_augmented(sde, init, None, times, entropy=0)
    with pytest.raises(ValueError, match=r"hidden_init must have shape \(batch, H\) = \(2, 2\), got \(2, 3\)"):
        sdeint_augmented(sde, torch.zeros(2, 3), torch.zeros(2, 3), times, entropy=0)
