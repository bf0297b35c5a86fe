# SPDX-License-Identifier: Apache-2.0
"""A GPFunctionalPrior built *inside* the model, the way Pyro's examples build their distributions.

Every path that runs the model under Pyro's handlers: SVI with an autoguide and with a hand-written guide,
``Predictive`` with and without a guide, and the SG-MCMC kernels. The kernel is a fixed prior, so it must add no
parameter to the param store or the trace, and its own hyper-parameters must not move.
"""

from __future__ import annotations

import pyro
import pyro.contrib.gp as gp
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

from pyro_sdebnn.distributions import GPFunctionalPrior, fit_gp_kernel
from pyro_sdebnn.infer.mcmc import FSGHMC, FSGLD, SGHMC, SGLD

DTYPE = torch.float64
X = torch.linspace(-2, 2, 8, dtype=DTYPE).unsqueeze(-1)
Y = torch.sin(X[:, 0])
Z = torch.linspace(-1, 1, 3, dtype=DTYPE).unsqueeze(-1)


def _rbf():
    return gp.kernels.RBF(1, variance=torch.tensor(1.2, dtype=DTYPE), lengthscale=torch.tensor(0.8, dtype=DTYPE))


def _frozen():
    return _rbf().requires_grad_(False)


def _fitted():
    return fit_gp_kernel(_rbf(), X, Y, num_steps=3)


KERNELS = {"plain": _rbf, "requires_grad_false": _frozen, "fit_gp_kernel": _fitted}


def _make_gp_model(kernel):
    def model(x, y=None):
        f = pyro.sample("f", GPFunctionalPrior(kernel, x))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(f, 0.3), obs=y)

    return model


def _hand_guide(x, y=None):
    loc = pyro.param("f_loc", torch.zeros(x.shape[0], dtype=DTYPE))
    scale = pyro.param("f_scale", torch.full((x.shape[0],), 0.5, dtype=DTYPE), constraint=dist.constraints.positive)
    pyro.sample("f", dist.Normal(loc, scale).to_event(1))


def _hyperparameters(kernel):
    return {name: value.detach().clone() for name, value in kernel.named_parameters()}


@pytest.fixture(params=list(KERNELS), autouse=False)
def kernel(request):
    pyro.clear_param_store()
    yield KERNELS[request.param]()
    pyro.clear_param_store()


@pytest.mark.parametrize("guide_kind", ["AutoNormal", "hand"])
def test_svi_trains_with_the_prior_built_inside_the_model(kernel, guide_kind):
    model = _make_gp_model(kernel)
    before = _hyperparameters(kernel)
    guide = AutoNormal(model) if guide_kind == "AutoNormal" else _hand_guide
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    losses = [svi.step(X, Y) for _ in range(5)]
    assert all(torch.isfinite(torch.tensor(losses)))
    # only the guide's parameters are trainable, and they moved; the kernel is untouched
    expected = {"AutoNormal.locs.f", "AutoNormal.scales.f"} if guide_kind == "AutoNormal" else {"f_loc", "f_scale"}
    assert set(pyro.get_param_store().keys()) == expected
    loc_name = "AutoNormal.locs.f" if guide_kind == "AutoNormal" else "f_loc"
    assert pyro.param(loc_name).detach().abs().sum() > 0
    for name, value in _hyperparameters(kernel).items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)


def test_model_trace_holds_no_kernel_param_sites(kernel):
    trace = pyro.poutine.trace(_make_gp_model(kernel)).get_trace(X, Y)
    assert [name for name, site in trace.nodes.items() if site["type"] == "param"] == []
    assert not pyro.get_param_store().keys()


def test_predictive_with_and_without_guide(kernel):
    model = _make_gp_model(kernel)
    prior_draws = Predictive(model, num_samples=4)(X)
    # Predictive puts the sample dimension left of the model's one plate, as for a MultivariateNormal site
    assert prior_draws["f"].shape == (4, 1, 8) and prior_draws["obs"].shape == (4, 8)
    guide = AutoNormal(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    svi.step(X, Y)
    posterior = Predictive(model, guide=guide, num_samples=4, return_sites=("f", "obs"))(X)
    assert posterior["f"].shape == (4, 1, 8) and posterior["obs"].shape == (4, 8)
    # the guide's samples of f are what the predictive returns for f (the model's site is replayed)
    assert torch.isfinite(posterior["obs"]).all()


@pytest.mark.parametrize(
    "kernel_class, kernel_name", [(SGLD, "plain"), (SGHMC, "fit_gp_kernel")], ids=["SGLD-plain", "SGHMC-fitted"]
)
def test_sgmcmc_samples_a_model_with_the_prior_inside(kernel_class, kernel_name):
    pyro.clear_param_store()
    kernel = KERNELS[kernel_name]()
    pyro.set_rng_seed(0)
    # backend="eager": the prior's Cholesky with jitter escalation branches on data, so a model that builds it
    # at every run cannot be traced into a graph (backend="auto" falls back to eager with a RuntimeWarning)
    options = {"friction": 10.0} if kernel_class is SGHMC else {}
    sampler = kernel_class(_make_gp_model(kernel), step_size=1e-3, num_steps=2, backend="eager", **options)
    mcmc = MCMC(sampler, num_samples=3, warmup_steps=1, disable_progbar=True)
    mcmc.run(X, Y)
    samples = mcmc.get_samples()["f"]
    assert samples.shape == (3, 8) and torch.isfinite(samples).all()
    assert not torch.equal(samples[0], samples[-1])
    assert not pyro.get_param_store().keys()


def _hierarchical_model(kernel):
    """A linear network (output site ``f`` for the functional kernels) plus a latent offset function at fixed
    points ``Z`` whose GP prior is built inside the model; the functional kernels keep that prior
    (``prior_sites``)."""

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=DTYPE), 1.0).to_event(1))
        offset = pyro.sample("offset", GPFunctionalPrior(kernel, Z))
        f = pyro.deterministic("f", x[:, 0] * w[0] + w[1] + offset.mean())
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(f, 0.3), obs=y)

    return model


@pytest.mark.parametrize(
    "kernel_class, kernel_name",
    [(FSGLD, "requires_grad_false"), (FSGHMC, "plain")],
    ids=["FSGLD-frozen", "FSGHMC-plain"],
)
def test_functional_sgmcmc_samples_a_model_with_the_prior_inside(kernel_class, kernel_name):
    pyro.clear_param_store()
    kernel = KERNELS[kernel_name]()
    pyro.set_rng_seed(0)
    options = {"friction": 10.0} if kernel_class is FSGHMC else {}
    sampler = kernel_class(
        _hierarchical_model(kernel),
        gp_prior=_rbf(),
        prior_sites=("offset",),
        step_size=1e-4,
        num_steps=2,
        num_measurement_data=4,
        num_measurement_box=2,
        map_steps=0,
        backend="eager",
        **options,
    )
    mcmc = MCMC(sampler, num_samples=3, warmup_steps=1, disable_progbar=True)
    mcmc.run(X, Y)
    samples = mcmc.get_samples()
    assert samples["offset"].shape == (3, 3) and samples["w"].shape == (3, 2)
    assert torch.isfinite(samples["offset"]).all() and not torch.equal(samples["w"][0], samples["w"][-1])
    assert not pyro.get_param_store().keys()


def test_building_the_prior_leaves_the_users_params_untouched():
    """The user's stored parameters keep their identity, their ``unconstrained`` back-reference and their value,
    and a user parameter named like a kernel hyper-parameter does not leak into the kernel (or back)."""
    pyro.clear_param_store()
    real = pyro.param("w", torch.ones(2, dtype=DTYPE))
    lengthscale = pyro.param("lengthscale", torch.tensor(5.0, dtype=DTYPE), constraint=dist.constraints.positive)
    kernel = _rbf()
    prior = GPFunctionalPrior(kernel, X)
    # (checked before any new pyro.param call, which would re-attach the back-reference)
    assert hasattr(real, "unconstrained") and real.unconstrained() is pyro.get_param_store()._params["w"]
    assert set(pyro.get_param_store().keys()) == {"w", "lengthscale"}
    assert pyro.param("w") is real
    torch.testing.assert_close(pyro.param("lengthscale"), lengthscale)
    pyro.clear_param_store()
    expected = _rbf()(X)  # evaluated with an empty store: lengthscale 0.8, not the user's 5.0
    pyro.clear_param_store()
    torch.testing.assert_close(prior.covariance_matrix, expected.detach() + prior.delta * torch.eye(8, dtype=DTYPE))
