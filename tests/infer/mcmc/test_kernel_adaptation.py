# SPDX-License-Identifier: Apache-2.0
"""Warm-up adaptation of the diagonal mass matrix, the end-of-run warnings, and the bounded warm start."""

import os

import arviz as az
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from torch.utils.data import DataLoader, TensorDataset

from pyro_sdebnn.infer.mcmc import SGHMC, SGLD
from pyro_sdebnn.infer.mcmc.diagnostics import SamplerDivergenceError, SamplerWarning
from pyro_sdebnn.infer.mcmc import kernel as adaptation
from pyro_sdebnn.infer.mcmc.kernel import MIN_ADAPT_STEPS, adaptation_windows

# conjugate problem: w_j ~ N(0, 1), y_ij ~ N(w_j, s_j) for i = 1..n; the posterior of w_j is N(m_j, v_j) with
# v_j = 1 / (1 + n / s_j^2) and m_j = v_j * sum_i y_ij / s_j^2. With s = (100, 0.1) and n = 100 the posterior sds are
# 0.995 and 0.00999: scales 100x apart.
# the statistical tests' seed (``benchmarks/check_seed_robustness.py`` re-runs them under others, as for every test)
SEED = int(os.environ.get("PYRO_SDEBNN_TEST_SEED", "0"))
NOISE = torch.tensor([100.0, 0.1], dtype=torch.float64)
N = 100


def _conjugate_data():
    g = torch.Generator().manual_seed(0)
    truth = torch.tensor([0.3, -0.5], dtype=torch.float64)
    y = truth + NOISE * torch.randn(N, 2, generator=g, dtype=torch.float64)
    var = 1.0 / (1.0 + N / NOISE**2)
    return y, var * y.sum(0) / NOISE**2, var.sqrt()


def scales_model(y):
    w = pyro.sample("w", dist.Normal(y.new_zeros(2), 1.0).to_event(1))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("y", dist.Normal(w, NOISE).to_event(1), obs=y)


def test_windows_cover_the_middle_of_the_warm_up_in_doubling_windows():
    assert adaptation_windows(MIN_ADAPT_STEPS - 1) == []
    windows = adaptation_windows(4000)
    assert windows[0][0] == 600 and windows[-1][1] == 3600  # 15 % fast, 75 % slow, 10 % fast
    sizes = [end - start for start, end in windows]
    assert all(a == b for (_, a), (b, _) in zip(windows, windows[1:]))  # contiguous
    assert sizes == [200, 400, 800, 1600]


def _sghmc_stationary_var(kappa, h, c):
    """Stationary variance of the position of the SGHMC recursion on a Gaussian of curvature ``kappa`` (standardised
    units, exact gradients): v' = (1 - hc) v - h kappa z + sqrt(2hc) xi, z' = z + h v'. Its covariance solves
    S = A S A^T + b b^T, iterated to convergence."""
    A = torch.tensor([[1 - h * h * kappa, h * (1 - h * c)], [-h * kappa, 1 - h * c]], dtype=torch.float64)
    b = (2 * h * c) ** 0.5 * torch.tensor([[h], [1.0]], dtype=torch.float64)
    S = torch.zeros(2, 2, dtype=torch.float64)
    for _ in range(20000):
        S = A @ S @ A.T + b @ b.T
    return float(S[0, 0])


@pytest.fixture(scope="module")
def adapted_run():  # about 10 s: shared by the two tests below
    y, mean, sd = _conjugate_data()
    pyro.set_rng_seed(SEED)  # a module-scoped fixture runs before the suite's per-test seeding
    # every default but num_steps: the mass matrix adapts over the 3000 inner steps of the warm-up (windows of
    # 150-1200 steps, long enough for the loose coordinate to be explored)
    kernel = SGHMC(scales_model, vectorized_chains=2, num_steps=3)
    seen = []
    mcmc = MCMC(kernel, num_samples=500, warmup_steps=1000, disable_progbar=True,
                hook_fn=lambda k, params, stage, i: seen.append((stage, k._precond.clone(), k._eta(k._t))))
    mcmc.run(y)
    return kernel, mcmc, seen, mean, sd


def test_preconditioner_is_frozen_after_warm_up(adapted_run):
    kernel, _, seen, _, sd = adapted_run
    warm = [p for stage, p, _ in seen if stage.startswith("Warmup")]
    sampling = [(p, eta) for stage, p, eta in seen if stage.startswith("Sample")]
    assert not torch.equal(warm[0], warm[-1])  # it changed in warm-up (four windows)
    assert all(torch.equal(p, sampling[0][0]) and eta == sampling[0][1] for p, eta in sampling)
    torch.testing.assert_close(sampling[0][0], kernel.inverse_mass_matrix.sqrt())  # SGHMC takes M^{-1/2}
    assert kernel.diagnostics()["mass matrix adapted"] and kernel._adapter is None
    # M^{-1} estimates the posterior variances: 100x apart in sd, 10^4 in variance
    ratio = kernel.inverse_mass_matrix / sd**2
    assert bool(((ratio > 0.5) & (ratio < 2.0)).all()), ratio


def test_adapted_sghmc_recovers_posterior_scales_100x_apart(adapted_run):
    kernel, mcmc, _, mean, sd = adapted_run
    draws = mcmc.get_samples(group_by_chain=True)["w"].numpy()  # (2, 500, 2)
    h = kernel._eta(kernel._t)
    for j in range(2):
        x = draws[..., j]
        ess = float(az.ess(x))
        est_mean, est_sd = x.mean(), x.std()
        # the frozen chain's own stationary sd (the discretisation's bias, closed form for a Gaussian) is within
        # 5 % of the posterior's; the draws match it: the mean within 4 Monte Carlo standard errors, the sd within
        # 4 of its relative standard error 1/sqrt(2 ESS)
        kappa = float(kernel.inverse_mass_matrix[j] / sd[j] ** 2)
        chain_sd = float(sd[j]) * (_sghmc_stationary_var(kappa, h, kernel.friction) * kappa) ** 0.5
        assert abs(chain_sd / float(sd[j]) - 1) < 0.05, (j, chain_sd, float(sd[j]))
        assert abs(est_mean - float(mean[j])) < 4 * float(sd[j]) / ess**0.5, (j, est_mean, float(mean[j]))
        assert abs(est_sd / chain_sd - 1) < 4 / (2 * ess) ** 0.5, (j, est_sd, chain_sd, ess)


# the unadapted chains do not mix
@pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")
def test_one_global_step_fails_where_the_adapted_one_succeeds():
    y, _, sd = _conjugate_data()
    # stable for the tight coordinate (eta * curvature = 0.4 < 4), the loose one barely moves
    pyro.set_rng_seed(0)
    kernel = SGLD(scales_model, step_size=4e-5, adapt_mass_matrix=False, vectorized_chains=2)
    mcmc = MCMC(kernel, num_samples=500, warmup_steps=500, disable_progbar=True)
    mcmc.run(y)
    loose = mcmc.get_samples()["w"][:, 0]
    assert float(loose.std()) < 0.5 * float(sd[0])
    assert kernel.inverse_mass_matrix is None and not kernel.diagnostics()["mass matrix adapted"]
    # a step that moves the loose coordinate diverges on the tight one (eta * curvature = 10 > 4); without the
    # warm-up's halving (the default for a constant step) the run stops there
    pyro.set_rng_seed(0)
    with pytest.raises(SamplerDivergenceError):
        MCMC(SGLD(scales_model, step_size=1e-3, adapt_mass_matrix=False, adapt_step_size=False), num_samples=200,
             warmup_steps=200, disable_progbar=True).run(y)


@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC])
def test_every_backend_steps_with_the_adapted_preconditioner(monkeypatch, kernel_cls):
    monkeypatch.setattr(adaptation, "MIN_ADAPT_STEPS", 100)  # adapt in a short warm-up
    y, _, _ = _conjugate_data()
    pyro.set_rng_seed(1)
    kernel = kernel_cls(scales_model, step_size=1e-4, backend="fx", map_steps=0)
    MCMC(kernel, num_samples=5, warmup_steps=100, disable_progbar=True).run(y)
    assert kernel.inverse_mass_matrix is not None
    state = kernel._state
    eta = torch.tensor(kernel._eta(kernel._t), dtype=torch.float64)
    # one step by hand: the update rule with the preconditioner P (M^{-1} for SGLD, M^{-1/2} for SGHMC)
    position = state[0].detach().requires_grad_()
    (grad,) = torch.autograd.grad(kernel.potential(position, None), position)
    torch.manual_seed(5)
    noise = torch.randn_like(position)
    P = kernel._precond
    if kernel_cls is SGLD:  # the Leimkuhler-Matthews noise: the mean of this step's and the previous step's
        expected = position.detach() - 0.5 * eta * P * grad + (eta * P).sqrt() * (noise + state[1]) / 2
    else:
        c = kernel.friction
        momentum = (1 - eta * c) * state[1] - eta * P * grad + (2 * eta * c) ** 0.5 * noise
        expected = position.detach() + eta * P * momentum
    steps = {"fx": kernel.build_step_fn()}
    kernel.backend_used = "eager"
    steps["eager"] = kernel.build_step_fn()
    for name, step in steps.items():
        torch.manual_seed(5)
        new_state, _ = step(state, None, eta)
        torch.testing.assert_close(new_state[0], expected, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC])
def test_a_chain_resumed_in_warm_up_adapts_as_the_uninterrupted_one(monkeypatch, kernel_cls):
    monkeypatch.setattr(adaptation, "MIN_ADAPT_STEPS", 100)
    y, _, _ = _conjugate_data()

    def kernel():
        return kernel_cls(scales_model, step_size=1e-4, backend="fx", map_steps=0)

    pyro.set_rng_seed(0)
    full = kernel()
    full.setup(100, y)
    params = full.initial_params
    for i in range(120):
        params = full.sample(params)
        if i == 49:  # in the second adaptation window
            saved = full.state_dict()
    resumed = kernel()
    resumed.load_state_dict(saved)
    resumed.setup(50, y)
    params = resumed.initial_params
    for _ in range(70):
        params = resumed.sample(params)
    assert torch.equal(resumed.inverse_mass_matrix, full.inverse_mass_matrix)
    assert resumed._eta(resumed._t) == full._eta(full._t)
    assert torch.equal(resumed._state[0], full._state[0])


def test_short_warm_up_and_explicit_switches_keep_the_unit_mass():
    y, _, _ = _conjugate_data()
    pyro.set_rng_seed(0)
    kernel = SGLD(scales_model, step_size=1e-5)
    MCMC(kernel, num_samples=20, warmup_steps=MIN_ADAPT_STEPS - 1, disable_progbar=True).run(y)
    assert kernel.inverse_mass_matrix is None and torch.equal(kernel._precond, torch.ones(2, dtype=torch.float64))
    assert not SGLD(scales_model, preconditioned=True).adapt_mass_matrix  # pSGLD has its own preconditioner
    with pytest.raises(ValueError, match="adapt_mass_matrix"):
        SGLD(scales_model, preconditioned=True, adapt_mass_matrix=True)
    with pytest.raises(TypeError, match="adapt_mass_matrix"):
        SGLD(scales_model, adapt_mass_matrix="yes")
    with pytest.raises(ValueError, match="adapted_step_size"):
        SGHMC(scales_model, adapted_step_size=0.0)


# ----- end-of-run warnings -----------------------------------------------------------------------------------------
def bounded_model(x, y=None):
    w = pyro.sample("w", dist.Normal(x.new_zeros(()), 1.0))
    sigma = pyro.sample("sigma", dist.Uniform(x.new_zeros(()), 10.0))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Normal(w * x, sigma), obs=y)


def _bounded_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, generator=g)
    return x, 0.8 * x + 0.5 * torch.randn(50, generator=g)


def test_a_chain_stuck_at_the_support_boundary_warns():
    # chain 0 starts where Uniform(0, 10)'s transform has saturated (sigma = 10.0 in float32) and, with a tiny step
    # and no momentum to leave, stays there: its draws all sit at the bound, and the chains disagree
    x, y = _bounded_data()
    pyro.set_rng_seed(0)
    kernel = SGHMC(bounded_model, step_size=1e-4, friction=1.0, vectorized_chains=2, map_steps=0)
    kernel.initial_params = {"w": torch.zeros(2), "sigma": torch.tensor([30.0, -1.0])}
    mcmc = MCMC(kernel, num_samples=40, warmup_steps=10, disable_progbar=True)
    with pytest.warns(SamplerWarning) as record:
        mcmc.run(x, y)
    lines = [str(w.message) for w in record]
    assert any("chain 0 sat at a support boundary of site 'sigma' for 40 of its 40 draws" in m for m in lines), lines
    assert not any("chain 1 sat" in m for m in lines)
    assert any("site 'sigma' has split R-hat" in m and "mixes in fewer steps" not in m for m in lines)  # SGHMC
    assert bool((mcmc.get_samples(group_by_chain=True)["sigma"][0] > 10.0 - 1e-5).all())


def test_a_healthy_run_does_not_warn():
    x, y = _bounded_data()
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGHMC(bounded_model, num_steps=3, vectorized_chains=2, subsample_size=25), num_samples=300,
                warmup_steps=334, disable_progbar=True)
    mcmc.run(x, y)  # any SamplerWarning would be an error here (setup.cfg: filterwarnings = error)


# ----- the warm start ----------------------------------------------------------------------------------------------
def test_automatic_warm_start_is_bounded_by_an_epoch_and_the_run_and_reported():
    x, y = _bounded_data()
    x, y = torch.cat([x] * 40), torch.cat([y] * 40)  # 2000 points, batch 20: 100 steps per epoch
    loader = DataLoader(TensorDataset(x, y), batch_size=20, shuffle=True)
    pyro.set_rng_seed(0)
    kernel = SGLD(bounded_model, step_size=1e-5, map_lr=1e-3)  # a slow fit that would not level off early
    mcmc = MCMC(kernel, num_samples=150, warmup_steps=150, disable_progbar=True)
    mcmc.run(loader)
    assert kernel.map_steps_taken == kernel.map_steps_limit == 30  # 10 % of the run's 300 steps (< one epoch)
    assert kernel.diagnostics()["warm start steps"] == 30
    pyro.set_rng_seed(0)
    kernel = SGLD(bounded_model, step_size=1e-5, map_lr=1e-3, num_steps=10)
    MCMC(kernel, num_samples=60, warmup_steps=60, disable_progbar=True).run(loader)
    assert kernel.map_steps_limit == 100  # one epoch (< 10 % of the run's 1200 steps)


def test_warm_start_shows_in_the_progress_bar(monkeypatch):
    x, y = _bounded_data()
    shown = []
    from pyro.infer.mcmc import logger

    monkeypatch.setattr(logger.ProgressBar, "set_description",
                        lambda self, *args, **kwargs: shown.append(args[0]))
    pyro.set_rng_seed(0)
    MCMC(SGLD(bounded_model, subsample_size=5), num_samples=5, warmup_steps=5).run(x, y)
    assert any(str(s).startswith("Warm start 0/") for s in shown)


# ----- the adapted step: curvature of the mean minibatch Hessian, SGHMC's friction ----------------------------------
def slope_model(x, y=None):
    w = pyro.sample("w", dist.Normal(x.new_zeros(()), 1.0))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)


def test_curvature_is_that_of_the_hessian_averaged_over_minibatches():
    # U(w) = w^2 / 2 + (N / b) sum_{i in B} (y_i - w x_i)^2 / 2: a minibatch's Hessian is 1 + (N / b) sum_B x_i^2,
    # their mean over one pass (4 batches of 10) the full-data Hessian 1 + sum x_i^2, exactly (a quadratic: the
    # central differences are exact)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, generator=g, dtype=torch.float64) * torch.linspace(0.1, 3.0, 40, dtype=torch.float64)
    y = 0.5 * x + torch.randn(40, generator=g, dtype=torch.float64)
    pyro.set_rng_seed(0)
    kernel = SGLD(slope_model, subsample_size=10, map_steps=0)
    kernel.setup(10, x, y)
    inverse_mass = 1.0
    kernel._set_inverse_mass(torch.tensor([inverse_mass], dtype=torch.float64))
    eta = kernel._stable_step([kernel._state[0]])
    full = inverse_mass * (1.0 + float((x**2).sum()))
    assert kernel.max_curvature == pytest.approx(full, rel=1e-6)
    # SGLD (Leimkuhler-Matthews noise): three quarters of the stability limit 4 / lambda
    assert eta == pytest.approx(min(kernel.adapted_step_size, 3.0 / full), rel=1e-6)
    euler = SGLD(slope_model, subsample_size=10, map_steps=0, integrator="euler")
    euler.setup(10, x, y)
    euler._set_inverse_mass(torch.tensor([inverse_mass], dtype=torch.float64))
    # Euler-Maruyama's noise: a quarter of the limit, where the stationary variance is at most 4/3 of the target's
    assert euler._stable_step([euler._state[0]]) == pytest.approx(min(euler.adapted_step_size, 1.0 / full), rel=1e-6)
    # one minibatch alone would be off by more than 10 % (what averaging removes)
    batches = kernel.potential.index_batches(1)
    single = [inverse_mass * (1.0 + 4.0 * float((x[b] ** 2).sum())) for b in batches]
    assert max(abs(s / full - 1) for s in single) > 0.1


def test_last_window_keeps_positions_spread_through_it_for_the_step_check(monkeypatch):
    monkeypatch.setattr(adaptation, "MIN_ADAPT_STEPS", 100)
    adapter = adaptation.MassMatrixAdapter(100, (1,), torch.float64, "cpu", last_positions=8)
    ends = {}
    for t in range(100):
        out = adapter.observe(t, torch.tensor([float(t)], dtype=torch.float64))
        if out is not None:
            ends[t] = [float(p) for p in out[1]]
    # windows [15, 20), [20, 30), [30, 50), [50, 90): each window's end, and 8 positions evenly spread through the
    # last one (after inner steps 55, 60, ..., 90)
    assert ends == {19: [19.0], 29: [29.0], 49: [49.0], 89: [float(t) for t in range(54, 90, 5)]}
    # a restarted window (a chain restarted from an earlier state) forgets its positions with its draws
    adapter = adaptation.MassMatrixAdapter(100, (1,), torch.float64, "cpu", last_positions=8)
    for t in range(70):
        adapter.observe(t, torch.tensor([float(t)], dtype=torch.float64))
    adapter.restart_window()
    assert adapter.positions == []


# U(w) = w^2 / 2 + n w^4 / 2 (y_i = 0 ~ N(w^2, 1), i = 1..n): the Hessian 1 + 6 n w^2 varies many-fold with w
QUARTIC_N = 20


def quartic_model(y):
    w = pyro.sample("w", dist.Normal(y.new_zeros(()), 1.0))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("y", dist.Normal(w**2, 1.0), obs=y)


def test_step_is_capped_by_the_stiffest_of_the_positions():
    pyro.set_rng_seed(0)
    # a large adapted_step_size: the curvature (and eta c <= 1/2) caps the step
    kernel = SGHMC(quartic_model, adapted_step_size=10.0, map_steps=0)
    kernel.setup(10, torch.zeros(QUARTIC_N, dtype=torch.float64))
    kernel._set_inverse_mass(torch.tensor([1.0], dtype=torch.float64))
    positions = [torch.tensor([w], dtype=torch.float64) for w in (0.05, 0.5, 0.1)]

    # the largest eigenvalue in closed form, 1 + 6 n w^2 (unit mass), plus 2 n d^2 from the central differences of
    # the cubic gradient w + 2 n w^3, d = 1e-2
    def curvature(w):
        return 1 + 6 * QUARTIC_N * w**2 + 2 * QUARTIC_N * 1e-4

    eta = kernel._stable_step(positions)
    assert kernel.max_curvature == pytest.approx(curvature(0.5), rel=1e-6)
    assert eta == pytest.approx(0.5 / curvature(0.5) ** 0.5, rel=1e-6)  # SGHMC: a quarter of 2 / sqrt(lambda)
    # a check at the last position alone would allow a step 3x too large for the stiffest
    alone = kernel._stable_step(positions[-1:])
    assert alone == pytest.approx(0.5 / curvature(0.1) ** 0.5, rel=1e-6) and alone > 3 * eta


def test_adapted_sghmc_friction_damps_at_least_seven_percent_of_the_momentum_per_step(monkeypatch):
    monkeypatch.setattr(adaptation, "MIN_ADAPT_STEPS", 100)
    y, _, _ = _conjugate_data()
    pyro.set_rng_seed(1)
    # adapted step 0.01: the friction rises from the user's 1.0 to 0.07 / 0.01 = 7 (eta c = 0.07)
    kernel = SGHMC(scales_model, step_size=1e-4, adapted_step_size=0.01, backend="fx", map_steps=0)
    MCMC(kernel, num_samples=5, warmup_steps=100, disable_progbar=True).run(y)
    eta = kernel._eta(kernel._t)
    assert eta == pytest.approx(0.01) and kernel.friction == pytest.approx(7.0)
    # the traced step (traced again when the friction changed) uses it
    state = kernel._state
    position = state[0].detach().requires_grad_()
    (grad,) = torch.autograd.grad(kernel.potential(position, None), position)
    torch.manual_seed(5)
    noise = torch.randn_like(position)
    momentum = (1 - eta * 7.0) * state[1] - eta * kernel._precond * grad + (2 * eta * 7.0) ** 0.5 * noise
    torch.manual_seed(5)
    new_state, _ = kernel.build_step_fn()(state, None, torch.tensor(eta, dtype=torch.float64))
    torch.testing.assert_close(new_state[1], momentum, rtol=1e-9, atol=1e-12)
    # a checkpoint keeps it; a new run starts again from the user's friction
    restored = SGHMC(scales_model, step_size=1e-4, adapted_step_size=0.01, backend="fx", map_steps=0)
    restored.load_state_dict(kernel.state_dict())
    restored.setup(0, y)
    assert restored.friction == pytest.approx(7.0)
    MCMC(kernel, num_samples=5, warmup_steps=10, disable_progbar=True).run(y)  # too short to adapt
    assert kernel.friction == 1.0 and kernel.inverse_mass_matrix is None


@pytest.mark.parametrize("at_end", [0.01, 10.0])
def test_adapted_step_is_checked_again_at_the_end_of_warm_up_and_only_lowered(monkeypatch, at_end):
    monkeypatch.setattr(adaptation, "MIN_ADAPT_STEPS", 100)
    y, _, _ = _conjugate_data()
    calls, counts = [], []

    class Checked(SGHMC):
        def _stable_step(self, positions):
            eta = super()._stable_step(positions)
            calls.append((self._sample_count, eta))
            counts.append(len(positions))
            return at_end if self._sample_count == self._warmup_steps else eta

    pyro.set_rng_seed(0)
    kernel = Checked(scales_model, step_size=1e-4, backend="fx", map_steps=0)
    MCMC(kernel, num_samples=5, warmup_steps=100, disable_progbar=True).run(y)
    # at the ends of the four windows (inner steps 20, 30, 50, 90: within samples 19, 29, 49, 89), then once more
    # before the first returned sample
    assert [count for count, _ in calls] == [19, 29, 49, 89, 100]
    assert counts == [1, 1, 1, 8, 1]  # SGHMC: 8 positions spread through the last window
    window_step = calls[-2][1]
    assert kernel._eta(kernel._t) == pytest.approx(min(window_step, at_end))
    # the friction follows the step in use (also when a warm-up divergence halves it)
    assert kernel.friction == pytest.approx(max(1.0, 0.07 / kernel._eta(kernel._t)))
    kernel._step_scale = 0.5
    kernel._follow_step()
    assert kernel.friction == pytest.approx(max(1.0, 0.07 / (0.5 * min(window_step, at_end))))


@pytest.mark.parametrize("factor", [1.0, 2.0, 3.5])
def test_warm_up_explores_with_the_factor_between_the_first_and_the_last_window(monkeypatch, factor):
    monkeypatch.setattr(adaptation, "MIN_ADAPT_STEPS", 100)
    y, _, _ = _conjugate_data()
    stable, used = [], []

    class Recorded(SGLD):
        def _stable_step(self, positions):
            eta = super()._stable_step(positions)
            stable.append((self._sample_count, eta))
            assert len(positions) == 1  # SGLD: the window's end only
            return eta

        def sample(self, params):
            out = super().sample(params)
            used.append(self._adapted_eta)
            return out

    pyro.set_rng_seed(0)
    kernel = Recorded(scales_model, step_size=1e-4, backend="fx", map_steps=0, warmup_step_factor=factor)
    MCMC(kernel, num_samples=5, warmup_steps=100, disable_progbar=True).run(y)
    # windows end within samples 19, 29, 49 and 89; the step re-checked at the end of warm-up (sample 100)
    assert [count for count, _ in stable] == [19, 29, 49, 89, 100]
    for (start, eta), (stop, _) in zip(stable[:3], stable[1:4]):
        assert used[start:stop] == [pytest.approx(factor * eta)] * (stop - start)  # exploring
    assert used[89:100] == [pytest.approx(stable[3][1])] * 11  # the last window's step, not enlarged
    assert used[100] == pytest.approx(min(stable[3][1], stable[4][1]))  # the sampling step
    assert kernel._eta(kernel._t) == pytest.approx(used[100])


def test_sghmc_explores_with_a_step_its_friction_still_damps(monkeypatch):
    monkeypatch.setattr(adaptation, "MIN_ADAPT_STEPS", 100)
    y, _, _ = _conjugate_data()
    steps = []

    class Recorded(SGHMC):
        def sample(self, params):
            out = super().sample(params)
            steps.append(self._eta(self._t) * self.friction)
            return out

    pyro.set_rng_seed(0)
    kernel = Recorded(scales_model, step_size=1e-4, friction=20.0, backend="fx", map_steps=0, warmup_step_factor=3.0)
    MCMC(kernel, num_samples=5, warmup_steps=100, disable_progbar=True).run(y)
    # the capped step is at most 0.5 / c, and so is the exploring one (3x would reach 1.5: no damping left)
    assert kernel.inverse_mass_matrix is not None and max(steps) <= 0.5 + 1e-12


# y_i ~ N(w_1 + w_2, 1), w ~ N(0, I): the sum is pinned (posterior variance 1/201), the difference is loose (1); each
# coordinate's posterior variance is (1 + 1/201) / 2
RIDGE_N = 100


def ridge_model(y):
    w = pyro.sample("w", dist.Normal(y.new_zeros(2), 1.0).to_event(1))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("y", dist.Normal(w.sum(-1, keepdim=True), 1.0).to_event(1), obs=y)


def test_exploring_warm_up_estimates_the_variances_along_a_ridge_better():
    y = torch.zeros(RIDGE_N, 1, dtype=torch.float64)
    var = (1 + 1 / (2 * RIDGE_N + 1)) / 2
    errors = {}
    for factor in (1.0, 2.0):
        pyro.set_rng_seed(SEED)
        kernel = SGLD(ridge_model, vectorized_chains=8, warmup_step_factor=factor, backend="fx")
        MCMC(kernel, num_samples=1, warmup_steps=1200, disable_progbar=True).run(y)
        errors[factor] = float((kernel.inverse_mass_matrix / var).log().abs().mean())
    # at the sampling step the windows' chains cross the loose direction too slowly and underestimate the variances
    # several-fold; exploring with twice the step more than halves the mean log error (on this seed and others)
    assert errors[2.0] < 0.6 * errors[1.0], errors


def test_warmup_step_factor_is_checked():
    with pytest.raises(TypeError, match="warmup_step_factor"):
        SGLD(scales_model, warmup_step_factor="2")
    for bad in (0.5, 4.0):
        with pytest.raises(ValueError, match=r"warmup_step_factor must be in \[1, 4\)"):
            SGHMC(scales_model, warmup_step_factor=bad)
