# SPDX-License-Identifier: Apache-2.0
"""SGLD (and SGHMC, its momentum variant) against the closed-form posterior of conjugate Bayesian linear regression (and
against NUTS)."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS
from pyro.ops.stats import effective_sample_size

from pyro_sdebnn.infer.mcmc import PolynomialDecay, SGHMC, SGLD
from pyro_sdebnn.testing import ConjugateLinearRegression

PROBLEM = ConjugateLinearRegression(dim=2, prior_scale=1.0, noise_scale=1.0)
NUM_DATA = 50
# The statistical tests below check the chains' stationary distribution, not the start or the backend: the chains start
# from their own prior draws (map_steps=0; the warm-up carries them to the posterior, which is a harder start than the
# MAP) and every inner step is the traced step (backend="fx"; the update rule is the same as the eager one). The MAP
# warm start and the auto backend's eager start, which run chain by chain, are tested in
# test_map_warm_start_reaches_the_mode, test_kernel_chains.py and test_kernel_backends.py.
FAST = dict(map_steps=0, backend="fx")


def _data():
    return PROBLEM.generate(NUM_DATA, seed=1, dtype=torch.float64)


def _run(kernel, num_samples, warmup_steps, x, y):
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, disable_progbar=True)
    mcmc.run(x, y)
    return mcmc.get_samples(group_by_chain=True)["w"]  # (chains, draws, D): vectorised chains are chains


def _assert_matches(w, mean, var, *, var_rtol=0.2, k_sigma=4.0, extra_se=None):
    flat = w.reshape(-1, w.shape[-1])
    ess = effective_sample_size(w, chain_dim=0, sample_dim=1)  # (D,)
    assert (ess > 200).all(), f"too few effective samples for a meaningful test: {ess}"
    # Monte Carlo standard error of the mean: sd / sqrt(ESS); the tolerance is k_sigma of those
    se = (var / ess).sqrt() if extra_se is None else (var / ess + extra_se**2).sqrt()
    assert ((flat.mean(0) - mean).abs() < k_sigma * se).all(), (flat.mean(0), mean, se)
    # the variance is asked to be within var_rtol (20 % by default): the MC error of a variance from ESS >= 200 is
    # sqrt(2/ESS) <= 10 %, so 20 % is at least 2 standard errors (the lowest ESS here, SGLD with decaying steps, is
    # 311-552 over seeds 0-8); the rest of the margin is the samplers' discretisation bias
    assert ((flat.var(0) / var - 1).abs() < var_rtol).all(), flat.var(0) / var


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")  # 32 short chains: R-hat 1.11
def test_sgld_decaying_steps_recovers_posterior():
    x, y = _data()
    mean, cov = PROBLEM.posterior(x, y)
    kernel = SGLD(PROBLEM.model, step_size=PolynomialDecay(a=2e-3, b=100.0, gamma=0.3), num_steps=10,
                  subsample_size=25, vectorized_chains=32, **FAST)
    w = _run(kernel, 500, 100, x, y)  # decaying steps mix slowly: 500 draws x 32 chains give ESS ~310-550
    _assert_matches(w, mean, cov.diagonal())


@pytest.mark.slow
def test_sghmc_recovers_posterior():
    x, y = _data()
    mean, cov = PROBLEM.posterior(x, y)
    # the unit-mass SGHMC with this step and friction (the adapted mass matrix is tested in test_kernel_adaptation)
    kernel = SGHMC(PROBLEM.model, step_size=2e-2, friction=10.0, num_steps=10, subsample_size=25,
                   vectorized_chains=32, adapt_mass_matrix=False, **FAST)
    w = _run(kernel, 250, 100, x, y)
    _assert_matches(w, mean, cov.diagonal())


def test_preconditioned_sgld_recovers_posterior_mean():
    x, y = _data()
    mean, cov = PROBLEM.posterior(x, y)
    kernel = SGLD(PROBLEM.model, step_size=1e-2, num_steps=10, subsample_size=25, preconditioned=True,
                  vectorized_chains=32, **FAST)
    # the preconditioner adapts over ~1/(1 - 0.99) = 100 steps; chains started in the prior need ~1000 steps
    w = _run(kernel, 150, 200, x, y)
    # pSGLD drops the Gamma correction term of [Li et al. 2016]: a small O(eta) bias, hence 30 % on the variance
    _assert_matches(w, mean, cov.diagonal(), var_rtol=0.3)


def test_full_batch_sgld_matches_nuts():
    x, y = _data()
    nuts = MCMC(NUTS(PROBLEM.model, max_tree_depth=4), num_samples=300, warmup_steps=100, disable_progbar=True)
    nuts.run(x, y)
    w_nuts = nuts.get_samples()["w"]
    ess_nuts = effective_sample_size(w_nuts.unsqueeze(0), chain_dim=0, sample_dim=1)
    var_nuts = w_nuts.var(0)
    kernel = SGLD(PROBLEM.model, step_size=1e-3, num_steps=10, vectorized_chains=32, **FAST)  # batch_size = N
    w = _run(kernel, 150, 50, x, y)
    # NUTS' own Monte Carlo error enters the comparison: se^2 = var/ESS_sgld + var/ESS_nuts
    _assert_matches(w, w_nuts.mean(0), var_nuts, var_rtol=0.25, extra_se=(var_nuts / ess_nuts).sqrt())


def test_cold_posterior_scales_the_covariance():
    # p(w|D)^(1/T) of a Gaussian posterior is Gaussian with the same mean and covariance T * Sigma
    x, y = _data()
    mean, cov = PROBLEM.posterior(x, y)
    temperature = 0.5
    kernel = SGLD(PROBLEM.model, step_size=1e-3, num_steps=10, temperature=temperature, vectorized_chains=32,
                  **FAST)
    w = _run(kernel, 150, 50, x, y)
    _assert_matches(w, mean, temperature * cov.diagonal(), var_rtol=0.25)


def test_map_warm_start_reaches_the_mode():
    # full-batch Adam on the potential converges to the MAP, which is the posterior mean here
    x, y = _data()
    mean, _ = PROBLEM.posterior(x, y)
    kernel = SGLD(PROBLEM.model, step_size=1e-3, map_steps=500, map_lr=0.05)
    kernel.setup(0, x, y)
    torch.testing.assert_close(kernel.initial_params["w"], mean, atol=1e-3, rtol=0)


def stiff_gaussian_model():
    # a looser and a stiff coordinate: curvatures 25 and 100, the stiff one at eta * lambda = 3 below
    pyro.sample("w", dist.Normal(torch.zeros(2, dtype=torch.float64),
                                 torch.tensor([0.2, 0.1], dtype=torch.float64)).to_event(1))


@pytest.mark.parametrize("integrator", ["lm", "euler"])
def test_default_noise_keeps_a_gaussian_exact_at_three_quarters_of_the_stability_limit(integrator):
    # eta = 0.03 on curvature 100: three quarters of SGLD's stability limit 4 / lambda (the adapted step's cap with
    # the default integrator). The Leimkuhler-Matthews noise keeps the stationary variance 0.01 exactly; Euler-
    # Maruyama's is 0.01 / (1 - eta * lambda / 4) = 0.04 (its cap is a quarter of the limit). Seeded by conftest.
    kernel = SGLD(stiff_gaussian_model, step_size=0.03, num_steps=1, vectorized_chains=16, adapt_mass_matrix=False,
                  adapt_step_size=False, integrator=integrator, **FAST)
    mcmc = MCMC(kernel, num_samples=300, warmup_steps=50, disable_progbar=True)
    mcmc.run()
    w = mcmc.get_samples(group_by_chain=True)["w"][..., 1:]  # (16, 300, 1): the stiff coordinate
    ess = float(effective_sample_size(w, chain_dim=0, sample_dim=1))
    ratio = float(w.reshape(-1).var()) / 0.01
    se = (2 / ess) ** 0.5  # relative standard error of a variance from ESS draws
    if integrator == "lm":
        assert abs(ratio - 1) < 4 * se, (ratio, ess)
    else:  # the negative control: 4x, far outside those bounds
        assert abs(ratio - 4) < 4 * 4 * se and ratio > 1 + 8 * se, (ratio, ess)


def test_integrator_is_checked():
    with pytest.raises(ValueError, match="integrator must be 'lm' or 'euler', got 'rk4'"):
        SGLD(stiff_gaussian_model, integrator="rk4")
    with pytest.raises(ValueError, match="integrator='lm' and preconditioned=True exclude each other"):
        SGLD(stiff_gaussian_model, integrator="lm", preconditioned=True)
    assert SGLD(stiff_gaussian_model).integrator == "lm"
    assert SGLD(stiff_gaussian_model, preconditioned=True).integrator == "euler"
