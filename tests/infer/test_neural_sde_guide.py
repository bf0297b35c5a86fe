# SPDX-License-Identifier: Apache-2.0
"""NeuralSDEPath and NeuralSDEGuide: shapes, densities, prior lookup, user drifts, errors."""

import pyro
import pyro.distributions as dist
from pyro import poutine
import pytest
import torch
from torch import nn

from pyro_sdebnn.distributions import OUPath
from pyro_sdebnn.infer import NeuralSDEGuide, NeuralSDEPath
from pyro_sdebnn.nn.sde_drift import DriftMLP
from pyro_sdebnn.ops.sde_solve import time_grid


TIMES = time_grid((0.0, 1.0), 0.125, dtype=torch.float64)


def _q(dim=3, batch=(), scale=0.3, estimator="stl"):
    drift = DriftMLP(dim, hidden=8).double()
    with torch.no_grad():
        for p in drift.out.parameters():
            p.normal_(0, scale)
    init = torch.randn(batch + (dim,), dtype=torch.float64)
    return NeuralSDEPath(init, 0.5, TIMES, 1.0, correction=drift, estimator=estimator)


@pytest.mark.parametrize("batch", [(), (2,)])
@pytest.mark.parametrize("sample_shape", [(), (4,), (2, 3)])
def test_shapes(batch, sample_shape):
    q = _q(batch=batch)
    assert q.batch_shape == batch and q.event_shape == (8, 3)
    w = q.rsample(sample_shape)
    assert w.shape == sample_shape + batch + (8, 3)
    assert q.log_prob(w).shape == sample_shape + batch
    assert q.path_kl(w).shape == sample_shape + batch


def test_expand():
    q = _q().expand((5,))
    assert q.batch_shape == (5,)
    assert q.rsample().shape == (5, 8, 3)


@pytest.mark.parametrize("estimator", ["analytic", "full_mc", "stl"])
def test_path_kl_recomputed_from_value_equals_cached(estimator):
    q = _q(estimator=estimator)
    w = q.rsample((4,))
    cached = q.path_kl(w)
    recomputed = q.path_kl(w.clone())  # not the cached tensor: noise recovered from the path
    assert torch.allclose(cached, recomputed, rtol=1e-9, atol=1e-9)


def test_full_mc_is_log_q_minus_log_p():
    # independent densities: NeuralSDEPath.log_prob recomputed from the value, OUPath(method="euler")
    q = _q()
    w = q.rsample((6,))
    p = OUPath(q.init, 0.5, TIMES, 1.0, method="euler")
    log_ratio = q.log_prob(w.clone()) - p.log_prob(w)
    assert torch.allclose(q.path_kl(w, "full_mc"), log_ratio, rtol=1e-9, atol=1e-9)
    # the cached log_prob (from the stored noise) equals the recomputed one
    assert torch.allclose(q.log_prob(w), q.log_prob(w.clone()), rtol=1e-9, atol=1e-9)


def test_zero_correction_is_prior_in_distribution():
    # q = p: moments of the Euler chain equal the OUPath(euler) moments (mean and variance, closed form)
    n = 4000
    q = NeuralSDEPath(torch.ones(2, dtype=torch.float64), 0.5, TIMES, 1.0, correction=DriftMLP(2, 8).double())
    w = q.rsample((n,)).detach()
    p = OUPath(torch.ones(2, dtype=torch.float64), 0.5, TIMES, method="euler")
    var = p.variance
    assert ((w.mean(0) - p.mean).abs() < 4 * var.sqrt() / n ** 0.5).all()  # 4 standard errors of the mean
    # Gaussian marginals: the sample variance has standard error var * sqrt(2 / (n - 1)); 4 standard errors
    assert ((w.var(0) - var).abs() < 4 * var * (2 / (n - 1)) ** 0.5).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="estimator"):
        NeuralSDEPath(torch.zeros(2), 0.5, TIMES, estimator="bad")
    with pytest.raises(TypeError, match="nn.Module"):
        NeuralSDEPath(torch.zeros(2), 0.5, TIMES, correction=lambda t, w: w, estimator="stl")


def _two_site_model(y=torch.tensor(1.0)):
    times = torch.linspace(0, 1, 5)
    w0 = pyro.param("w0", torch.zeros(2))
    a = pyro.sample("a", OUPath(w0, 0.5, times, method="euler"))
    b = pyro.sample("b", OUPath(torch.ones(3), 0.2, times, method="euler"))
    pyro.sample("y", dist.Normal(a[-1].sum() + b[-1].sum(), 1.0), obs=y)


class _Structured(nn.Module):
    """A user drift (t, w) -> R^D: a learnable linear pull towards a target."""

    def __init__(self, dim):
        super().__init__()
        self.target = nn.Parameter(torch.zeros(dim))
        self.rate = nn.Parameter(torch.zeros(()))

    def forward(self, t, w):
        return self.rate * (self.target - w)


def test_guide_several_sites_and_user_drift():
    guide = NeuralSDEGuide(_two_site_model, drift={"a": _Structured(2), "b": DriftMLP(3, 4)})
    out = guide()
    assert out["a"].shape == (4, 2) and out["b"].shape == (4, 3)
    assert isinstance(guide.drifts["a"], _Structured)
    # the guide starts at the model's current init, also after the param changes
    with torch.no_grad():
        pyro.param("w0").add_(5.0)
    q = guide.get_posterior()
    assert torch.equal(q["a"].init, pyro.param("w0"))


def test_guide_factory_and_svi_updates_drift():
    guide = NeuralSDEGuide(_two_site_model, drift=lambda name, dim: _Structured(dim))
    from pyro_sdebnn.infer import TracePathKL_ELBO

    svi = pyro.infer.SVI(_two_site_model, guide, pyro.optim.Adam({"lr": 0.05}), TracePathKL_ELBO())
    for _ in range(5):
        svi.step()
    assert guide.drifts["a"].rate.abs() > 0
    assert any("drifts" in name for name in pyro.get_param_store().keys())


def test_elbo_rejects_unguided_latent_sites():
    from pyro_sdebnn.infer import TracePathKL_ELBO

    def model():
        pyro.sample("w", OUPath(torch.zeros(2), 0.5, TIMES.float(), method="euler"))
        pyro.sample("z", dist.Normal(0.0, 1.0))

    guide = NeuralSDEGuide(model)
    assert set(guide()) == {"w"} and guide.unguided_sites == ["z"]
    with pytest.warns(UserWarning, match="not guide"), pytest.raises(ValueError, match="'z' has no guide site"):
        TracePathKL_ELBO().loss(model, guide)


def _sampled_start_model():
    w0 = pyro.sample("w0", dist.Normal(torch.zeros(2), 1.0).to_event(1))
    w = pyro.sample("w", OUPath(w0, 0.5, TIMES.float(), method="euler"))
    pyro.sample("y", dist.Normal(w[-1].sum(), 0.5), obs=torch.tensor(1.0))


def test_path_starts_at_the_guide_sample_of_an_upstream_site():
    from pyro.infer.autoguide import AutoGuideList, AutoNormal

    from pyro_sdebnn.infer import TracePathKL_ELBO

    guide = AutoGuideList(_sampled_start_model)
    guide.append(AutoNormal(poutine.block(_sampled_start_model, hide=["w"]), init_scale=1e-3))
    guide.append(NeuralSDEGuide(_sampled_start_model, drift_hidden=4))
    trace = poutine.trace(guide).get_trace()
    assert torch.equal(trace.nodes["w"]["fn"].init, trace.nodes["w0"]["value"])
    # and the ELBO's model replays that w0: the prior and the guide path start at the same point
    elbo = TracePathKL_ELBO()
    model_trace, guide_trace = next(elbo._get_traces(_sampled_start_model, guide, (), {}))
    assert torch.equal(model_trace.nodes["w"]["fn"].init, guide_trace.nodes["w"]["fn"].init)
    svi = pyro.infer.SVI(_sampled_start_model, guide, pyro.optim.Adam({"lr": 0.01}), elbo)
    assert all(torch.isfinite(torch.tensor(svi.step())) for _ in range(3))


def test_upstream_site_without_a_guide_value_raises():
    from pyro.infer.autoguide import AutoGuideList, AutoNormal

    with pytest.raises(ValueError, match="'w0'.*fresh prior draw"):
        NeuralSDEGuide(_sampled_start_model)()
    # the guide of w0 runs after NeuralSDEGuide: no value yet
    guide = AutoGuideList(_sampled_start_model)
    guide.append(NeuralSDEGuide(_sampled_start_model, drift_hidden=4))
    guide.append(AutoNormal(poutine.block(_sampled_start_model, hide=["w"])))
    with pytest.raises(ValueError, match="'w0'"):
        poutine.trace(guide).get_trace()
    # w0 hidden from NeuralSDEGuide by poutine.block: its fresh draws are detected when the guide is set up
    with pytest.raises(ValueError, match="hidden from the guide"):
        poutine.trace(NeuralSDEGuide(poutine.block(_sampled_start_model, expose=["w"]))).get_trace()


def test_path_started_from_an_earlier_path():
    def model():
        a = pyro.sample("a", OUPath(torch.ones(2), 0.5, TIMES.float(), method="euler"))
        b = pyro.sample("b", OUPath(a[-1], 0.5, TIMES.float(), method="euler"))
        pyro.sample("y", dist.Normal(b[-1].sum(), 0.5), obs=torch.tensor(1.0))

    guide = NeuralSDEGuide(model, drift_hidden=4)
    trace = poutine.trace(guide).get_trace()
    assert torch.equal(trace.nodes["b"]["fn"].init, trace.nodes["a"]["value"][-1])
    with pytest.raises(ValueError, match="earlier path"):
        guide.get_posterior()


def test_user_drift_registered_once_and_plain_function_drift():
    from pyro_sdebnn.infer import TracePathKL_ELBO

    def model():
        w = pyro.sample("w", OUPath(torch.zeros(2), 0.5, TIMES.float(), method="euler"))
        pyro.sample("y", dist.Normal(w[-1].sum(), 0.5), obs=torch.tensor(1.0))

    pyro.clear_param_store()
    guide = NeuralSDEGuide(model, drift=_Structured(2))
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), TracePathKL_ELBO())
    svi.step()
    names = sorted(pyro.get_param_store().keys())
    assert len(names) == 2 and names[0].endswith("drifts$$$w.rate") and names[1].endswith("drifts$$$w.target")
    # a plain (t, w) function: used as the drift (here the closed-form pull towards 1), no parameters
    guide = NeuralSDEGuide(model, drift=lambda t, w: 0.5 * (1.0 - w))
    out = guide()["w"]
    assert out.shape == (8, 2) and list(guide.parameters()) == []
    q = guide.get_posterior()["w"]
    assert torch.equal(q.correction(torch.tensor(0.0), torch.zeros(3, 2)), torch.full((3, 2), 0.5))
    for estimator in ("analytic", "full_mc", "stl"):
        assert torch.isfinite(torch.tensor(TracePathKL_ELBO(estimator=estimator).loss(model, guide)))


def test_guide_requires_euler_prior():
    def model():
        pyro.sample("w", OUPath(torch.zeros(2), 0.5, TIMES.float()))

    with pytest.raises(ValueError, match="euler"):
        NeuralSDEGuide(model)()


def test_guide_one_module_for_two_sites_is_an_error():
    with pytest.raises(ValueError, match="several"):
        NeuralSDEGuide(_two_site_model, drift=DriftMLP(2, 4))()


def test_combines_with_autoguidelist_for_other_latents():
    from pyro import poutine
    from pyro.infer.autoguide import AutoGuideList, AutoNormal

    from pyro_sdebnn.infer import TracePathKL_ELBO

    def model():
        z = pyro.sample("z", dist.Normal(0.0, 1.0))
        w = pyro.sample("w", OUPath(torch.zeros(2), 0.5, TIMES.float(), method="euler"))
        pyro.sample("y", dist.Normal(w[-1].sum() + z, 0.5), obs=torch.tensor(1.0))

    guide = AutoGuideList(model)
    guide.append(NeuralSDEGuide(poutine.block(model, expose=["w"]), drift_hidden=4))
    guide.append(AutoNormal(poutine.block(model, hide=["w"])))
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), TracePathKL_ELBO())
    for _ in range(3):
        assert torch.isfinite(torch.tensor(svi.step()))
    assert set(guide()) == {"w", "z"}


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(drift_hidden=2.5), ValueError, "drift_hidden"), (dict(drift_hidden=0), ValueError, "drift_hidden"),
    (dict(drift_layers=0), ValueError, "drift_layers"), (dict(drift_layers=True), ValueError, "drift_layers"),
    (dict(bottleneck=0), ValueError, "bottleneck"), (dict(activation="gelu"), ValueError, "activation"),
    (dict(model=3), TypeError, "model must be"),
])
def test_bad_guide_arguments_are_named_when_the_guide_is_built(kwargs, error, match):
    """These were accepted by the constructor and failed at the first SVI step (drift_hidden=2.5 with torch's
    "empty(): argument 'size' must be tuple of ints"); NeuralSDEGuide(3) was accepted."""
    def model():
        pyro.sample("w", OUPath(torch.zeros(2), 0.5, TIMES, method="euler"))

    args = dict(model=model)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        NeuralSDEGuide(args.pop("model"), **args)


def test_a_non_finite_initial_state_is_named_as_such():
    """With Pyro's validation off, a NaN in the prior's init (e.g. w0 after a diverged fit) was reported as "the
    initial state ... changes from one run of the model to the next ... hidden from the guide" (NaN != NaN)."""
    init = torch.zeros(2)
    init[1] = float("nan")

    def model():
        pyro.sample("w", OUPath(init, 0.5, TIMES, method="euler"))

    with pyro.validation_enabled(False), pytest.raises(ValueError, match="'w' holds NaN or Inf"):
        NeuralSDEGuide(model)()
