# SPDX-License-Identifier: Apache-2.0
"""Simulation-based calibration of SGLD and SGHMC on conjugate linear regression.

Simulation-based calibration [1]: draw the true weights from the prior, data from the likelihood, and posterior draws
from the sampler; if the sampler targets the posterior, the rank of each true weight among its (thinned, nearly
independent) posterior draws is uniform on :math:`\\{0, \\dots, L\\}`. The ranks of :math:`R \\times D` weights are
binned into 4 bins and compared with the uniform by a chi-square test at a false-alarm rate of 0.1 %.

The :math:`R = 200` replications run as one chain of one model holding :math:`R` independent copies of
:class:`~pyro_sdebnn.testing.ConjugateLinearRegression` (``D = 2``, prior scale 1, noise scale 1, ``N = 50``
points each, minibatches of 25): its posterior is the product of the :math:`R` posteriors, and every copy gets its own
noise, so each copy's draws are those of its own SGLD / SGHMC chain. Negative controls show that the test can fail:
a sampler at twice the temperature (draws too spread) and one whose prior is three times too narrow (draws shrunk
towards 0) must both exceed the critical value.

[1] Sean Talts, Michael Betancourt, Daniel Simpson, Aki Vehtari, Andrew Gelman (2018). "Validating Bayesian
    Inference Algorithms with Simulation-Based Calibration". arXiv:1804.06788.
"""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from scipy.stats import chi2

from pyro_sdebnn.infer.mcmc import SGHMC, SGLD
from pyro_sdebnn.testing import ConjugateLinearRegression

PROBLEM = ConjugateLinearRegression(dim=2, prior_scale=1.0, noise_scale=1.0)
REPLICATIONS, NUM_DATA, BATCH = 200, 50, 25
DRAWS, BINS = 15, 4  # ranks 0..15: 4 bins of 4 ranks each
THINNING = 50  # inner steps between draws, enough for nearly independent successive draws of both kernels
CRITICAL = chi2.ppf(1 - 1e-3, BINS - 1)  # 16.3: a correct sampler fails with probability 0.1 %


def replicated_model(prior_scale=PROBLEM.prior_scale):
    """``REPLICATIONS`` independent copies of ``PROBLEM.model``: ``x`` is ``(N, R, D)``, ``y`` is ``(N, R)``."""

    def model(x, y=None):
        shape = (REPLICATIONS, PROBLEM.dim)
        w = pyro.sample("w", dist.Normal(x.new_zeros(shape), prior_scale).to_event(2))
        with pyro.plate("data", x.shape[0]) as idx:
            loc = torch.einsum("nrd,rd->nr", x[idx], w)
            return pyro.sample("y", dist.Normal(loc, PROBLEM.noise_scale).to_event(1),
                               obs=None if y is None else y[idx])

    return model


def _simulate(seed):
    g = torch.Generator().manual_seed(seed)
    w = PROBLEM.prior_scale * torch.randn(REPLICATIONS, PROBLEM.dim, generator=g, dtype=torch.float64)
    x = torch.randn(NUM_DATA, REPLICATIONS, PROBLEM.dim, generator=g, dtype=torch.float64)
    y = torch.einsum("nrd,rd->nr", x, w) + PROBLEM.noise_scale * torch.randn(
        NUM_DATA, REPLICATIONS, generator=g, dtype=torch.float64
    )
    return w, x, y


def sbc_statistic(make_kernel, seed=0, prior_scale=PROBLEM.prior_scale):
    """Chi-square statistic of the binned ranks of the true weights among the sampler's draws."""
    w_true, x, y = _simulate(seed)
    pyro.set_rng_seed(seed)
    kernel = make_kernel(replicated_model(prior_scale))
    mcmc = MCMC(kernel, num_samples=DRAWS, warmup_steps=5, disable_progbar=True)
    mcmc.run(x, y)
    draws = mcmc.get_samples()["w"]  # (L, R, D)
    ranks = (draws < w_true).sum(0).flatten()  # in 0..L
    counts = torch.bincount(ranks // ((DRAWS + 1) // BINS), minlength=BINS).double()
    expected = ranks.numel() / BINS
    return float(((counts - expected) ** 2 / expected).sum())


def _sgld(model, temperature=1.0):
    return SGLD(model, step_size=2e-3, num_steps=THINNING, subsample_size=BATCH, temperature=temperature)


def _sghmc(model, temperature=1.0):
    return SGHMC(model, step_size=2e-2, friction=10.0, num_steps=THINNING, subsample_size=BATCH,
                 temperature=temperature)


@pytest.mark.parametrize("make_kernel", [_sgld, _sghmc], ids=["SGLD", "SGHMC"])
def test_ranks_of_the_true_weights_are_uniform(make_kernel):
    assert sbc_statistic(make_kernel) < CRITICAL


@pytest.mark.parametrize("make_kernel", [_sgld, _sghmc], ids=["SGLD", "SGHMC"])
def test_a_wrong_sampler_fails_the_calibration(make_kernel):
    # twice the temperature: draws too spread, the true weights land in the middle ranks too often; a prior three
    # times too narrow: draws shrunk towards 0, the true weights land in the extreme ranks too often
    assert sbc_statistic(lambda model: make_kernel(model, temperature=2.0)) > CRITICAL
    assert sbc_statistic(make_kernel, prior_scale=PROBLEM.prior_scale / 3) > CRITICAL
