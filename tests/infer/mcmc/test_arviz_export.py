# SPDX-License-Identifier: Apache-2.0
"""``to_inference_data`` on short runs: fewer than 4 draws per chain, where Pyro's ``MCMC.diagnostics()`` (split R-hat)
asserts, and ``arviz.from_pyro``, which calls it, fails."""

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_sdebnn.infer.mcmc import SGLD, to_inference_data
from pyro_sdebnn.infer.mcmc.diagnostics import SamplerWarning
from pyro_sdebnn.testing import ConjugateLinearRegression


def _model(y):
    z = pyro.sample("z", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(z, 1.0), obs=y)


def _run(num_samples, chains=2, **kwargs):
    pyro.set_rng_seed(0)
    kernel = SGLD(_model, step_size=0.1, vectorized_chains=chains, **kwargs)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=2, disable_progbar=True)
    with warnings.catch_warnings():  # a few draws cannot mix: the kernel may warn about R-hat
        warnings.simplefilter("ignore", SamplerWarning)
        mcmc.run(torch.tensor([0.5, -0.2, 1.0]))
    return mcmc


@pytest.mark.parametrize("num_samples", [1, 3])
def test_export_of_fewer_than_four_draws(num_samples):
    mcmc = _run(num_samples)
    idata = to_inference_data(mcmc)  # warnings are errors here: ArviZ's "more chains than draws" guess is not raised
    z = mcmc.get_samples(group_by_chain=True)["z"]
    assert idata.posterior["z"].shape == (2, num_samples)
    assert torch.equal(torch.as_tensor(idata.posterior["z"].values), z)
    assert idata.sample_stats["diverging"].shape == (2, num_samples) and not idata.sample_stats["diverging"].any()
    assert idata.log_likelihood["y"].shape == (2, num_samples, 3)
    y = torch.tensor([0.5, -0.2, 1.0])
    expected = torch.distributions.Normal(z[..., None], 1.0).log_prob(y)
    torch.testing.assert_close(torch.as_tensor(idata.log_likelihood["y"].values), expected)


def test_divergences_of_a_three_draw_run_are_exported():
    # eta = 1 is ~200 times the stability limit of this regression (largest Hessian eigenvalue ~ 900): the chain
    # diverges and restarts at every check; the export must mark the draws the kernel logged, without
    # MCMC.diagnostics() (which asserts 4 draws)
    problem = ConjugateLinearRegression(dim=2, prior_scale=1.0, noise_scale=0.5)
    x, y = problem.generate(200, seed=1)
    pyro.set_rng_seed(0)
    kernel = SGLD(problem.model, step_size=1.0, on_divergence="continue")
    mcmc = MCMC(kernel, num_samples=3, warmup_steps=0, disable_progbar=True)
    with pytest.warns(SamplerWarning, match="divergence"):
        mcmc.run(x, y)
    diverging = to_inference_data(mcmc, log_likelihood=False).sample_stats["diverging"].values
    logged = kernel.diagnostics()["divergences"]
    assert len(logged) >= 2  # a restart and the blown-up draw before it (the last draw's blow-up is seen after the run)
    assert diverging.shape == (1, 3) and diverging[0].tolist() == [i in logged for i in range(3)]


def test_kernel_diagnostics_are_those_of_mcmc_diagnostics():
    from pyro_sdebnn.infer.mcmc.arviz import _kernel_diagnostics

    mcmc = _run(6)
    full = mcmc.diagnostics()
    ours = _kernel_diagnostics(mcmc)
    assert ours and set(ours) < set(full)  # the kernel's entries, without the per-site ESS / R-hat
    assert all(ours[name] == full[name] for name in ours)
    assert "z" in full and "z" not in ours
