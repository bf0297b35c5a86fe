# SPDX-License-Identifier: Apache-2.0
"""ODENet / ResNet: identities with the SDE-BNN, mean-field VI with AutoNormal, likelihoods, bad input."""

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Predictive, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal, init_to_value
from pyro.optim import Adam

from pyro_sdebnn.infer import ClassificationPrediction, RegressionPrediction
from pyro_sdebnn.nn import SDEBNN, ODENet, ResNet
from pyro_sdebnn.nn.continuous_depth import LIKELIHOODS

# float64, same operations in the same order: the identities below hold to rounding, ~1e-15 relative;
# 1e-12 leaves room for a different summation order in BLAS / grouped convolutions.
RTOL = ATOL = 1e-12


SHAPES = {"vector": (3, 2), "image": ((1, 8, 8), 10)}


def _inputs(kind, n=5):
    return torch.randn(n, 3, dtype=torch.float64) if kind == "vector" else torch.rand(n, 1, 8, 8, dtype=torch.float64)


def _pair(kind, cls, **kwargs):
    """An SDEBNN and a baseline with the same field, augmentation, grid and head (float64), named apart: two networks
    used in one process have different names (else the second raises rather than share the first's head)."""
    in_dim, out_dim = SHAPES[kind]
    sde = SDEBNN(in_dim, out_dim, hidden=4, augment=1, sigma=0.3, theta=1.5, dt=0.25, name="sde").double()
    if cls is ODENet:
        base = ODENet(in_dim, out_dim, hidden=4, augment=1, dt=0.25, name="base", **kwargs).double()
    else:
        base = ResNet(in_dim, out_dim, hidden=4, augment=1, blocks=4, name="base", **kwargs).double()
    base.head.load_state_dict(sde.head.state_dict())
    return sde, base


@pytest.mark.parametrize("kind", ["vector", "image"])
def test_sdebnn_along_constant_path_is_odenet(kind):
    sde, ode = _pair(kind, ODENet)
    with torch.no_grad():
        sde.w0.copy_(ode.weights)
    path = ode.weights.detach().expand(sde.times.shape[0] - 1, -1)  # w_t = w0 for all t
    x = _inputs(kind)
    torch.testing.assert_close(sde(x, path), ode(x), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kind", ["vector", "image"])
def test_sdebnn_along_prior_mean_path_is_resnet(kind):
    # sigma -> 0: the Euler OU prior path collapses onto its mean w0 (1 - theta dt)^k, and the SDE-BNN is the
    # ResNet whose block k uses the path value at the left end point t_k.
    sde, res = _pair(kind, ResNet)
    mean = sde.prior().mean.detach()
    with torch.no_grad():
        res.weights.copy_(torch.cat([sde.w0.detach().unsqueeze(0), mean[:-1]]))
    x = _inputs(kind)
    torch.testing.assert_close(sde(x, mean), res(x), rtol=RTOL, atol=ATOL)


def test_sdebnn_converges_linearly_to_resnet_as_sigma_to_zero():
    # Same standard-normal noise for both sigmas: the Euler path is mean + sigma * L z, so the output deviation
    # is J sigma L z + O(sigma^2); a 10x smaller sigma gives a 10x smaller deviation up to the relative remainder
    # O(sigma): ~15 % at sigma = 1e-3 for these weights, so <= 1.5 % at 1e-4 -> ratio in 10 * (1 +- 0.02).
    x = _inputs("vector")
    deviations, state = [], None
    for sigma in (1e-4, 1e-5):
        sde = SDEBNN(3, 2, hidden=4, augment=1, sigma=sigma, theta=1.5, dt=0.25).double()
        if state is None:
            with torch.no_grad():
                sde.w0.copy_(torch.linspace(-0.5, 0.5, sde.num_weights, dtype=torch.float64))
            state = sde.state_dict()
        sde.load_state_dict(state)  # same w0 and head for both sigmas
        pyro.set_rng_seed(3)
        path = sde.prior().sample()
        deviations.append((sde(x, path) - sde(x, sde.prior().mean)).abs().max())
    assert deviations[0] > 0
    assert 9.8 < deviations[0] / deviations[1] < 10.2


@pytest.mark.parametrize("kind", ["vector", "image"])
@pytest.mark.parametrize("blocks", [1, 3, 10])
def test_resnet_with_shared_weights_is_euler_odenet(kind, blocks):
    in_dim, out_dim = SHAPES[kind]
    ode = ODENet(in_dim, out_dim, hidden=4, augment=1, dt=1.0 / blocks, name="ode").double()
    res = ResNet(in_dim, out_dim, hidden=4, augment=1, blocks=blocks, name="res").double()
    res.head.load_state_dict(ode.head.state_dict())
    assert res.num_steps == ode.num_steps == blocks
    with torch.no_grad():
        res.weights.copy_(ode.weights.expand(blocks, -1))
    x = _inputs(kind)
    torch.testing.assert_close(res(x), ode(x), rtol=RTOL, atol=ATOL)


def test_odenet_euler_converges_to_the_ode():
    # Euler is first order: halving dt halves the global error; the error against a fine grid (dt = 1/512)
    # drops by 2 +- 0.2 (higher-order terms at dt = 1/8 vs 1/16) per halving.
    x = _inputs("vector")
    nets = [ODENet(3, 2, hidden=4, augment=1, dt=1.0 / k, name=f"dt{k}").double() for k in (8, 16, 512)]
    for net in nets[1:]:
        net.load_state_dict(nets[0].state_dict())
    with torch.no_grad():
        nets[0].weights.mul_(4.0)  # a strong field, so that the error is well above rounding
        for net in nets[1:]:
            net.weights.copy_(nets[0].weights)
    outs = [net(x) for net in nets]
    ratio = (outs[0] - outs[2]).abs().max() / (outs[1] - outs[2]).abs().max()
    assert 1.8 < ratio < 2.2


@pytest.mark.parametrize("kind", ["vector", "image"])
def test_same_seed_same_initial_net_as_sdebnn(kind):
    # baselines of a comparison start from the SDE-BNN's initial weights w0 and head (same draws, same order)
    in_dim, out_dim = SHAPES[kind]
    pyro.set_rng_seed(1)
    sde = SDEBNN(in_dim, out_dim, hidden=4, augment=1, dt=0.2)
    for cls, kwargs in ((ODENet, dict(dt=0.2)), (ResNet, dict(blocks=5))):
        pyro.set_rng_seed(1)
        base = cls(in_dim, out_dim, hidden=4, augment=1, **kwargs)
        assert torch.equal(base.weights.expand(5, -1), sde.w0.expand(5, -1))
        assert torch.equal(base.head.weight, sde.head.weight) and torch.equal(base.head.bias, sde.head.bias)


def test_batched_weights_match_one_by_one():
    net = ResNet((1, 8, 8), 10, hidden=4, blocks=2, likelihood="categorical").double()
    x = _inputs("image", 3)
    weights = net.weights.detach() + 0.1 * torch.randn(4, *net.weight_shape, dtype=torch.float64)
    batched = net(x, weights)
    assert batched.shape == (4, 3, 10)
    for s in range(4):
        torch.testing.assert_close(batched[s], net(x, weights[s]), rtol=RTOL, atol=ATOL)


def _regression(n=24):
    x = torch.linspace(-1, 1, n).unsqueeze(-1)
    return x, torch.sin(3 * x).squeeze(-1)


def test_deterministic_training_reduces_nll():
    x, y = _regression()
    net = ODENet(1, 1, hidden=8, augment=2, dt=0.25)
    opt = torch.optim.Adam(net.parameters(), lr=2e-2)
    start = net.nll(x, y).item()
    for _ in range(100):
        opt.zero_grad()
        net.nll(x, y).backward()
        opt.step()
    assert net.nll(x, y).item() < start - 1.0


@pytest.mark.parametrize("cls", [ODENet, ResNet])
def test_mean_field_trains_with_posterior_spread(cls):
    x, y = _regression()
    kwargs = dict(dt=0.25) if cls is ODENet else dict(blocks=4)
    net = cls(1, 1, hidden=8, augment=2, obs_scale=0.3, **kwargs)
    with torch.no_grad():
        initial_rmse = ((net(x).squeeze(-1) - y) ** 2).mean().sqrt()
    init_scale = 1e-2
    guide = AutoNormal(net.model, init_loc_fn=init_to_value(values={"w": net.weights.detach()}),
                       init_scale=init_scale)
    svi = SVI(net.model, guide, Adam({"lr": 2e-2}), TraceMeanField_ELBO(num_particles=2, vectorize_particles=False))
    losses = [svi.step(x, y) for _ in range(150)]
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 10.0
    names = set(pyro.get_param_store().keys())
    assert {"AutoNormal.locs.w", "AutoNormal.scales.w", "head$$$weight", "obs_scale"} <= names
    # the point-estimate weights play no part in the Bayesian model
    assert "weights" not in poutine.trace(net.model).get_trace(x, y).nodes
    # the KL to the N(0, 1) prior widens the weakly identified weights well beyond the initial scale
    scales = guide.scales.w.detach()
    assert scales.shape == net.weight_shape and scales.median() > 5 * init_scale
    assert Predictive(net.model, guide=guide, num_samples=3)(x)["obs"].shape == (3, x.shape[0])
    pred = net.predict(x, guide, num_samples=16)
    assert isinstance(pred, RegressionPrediction) and pred.loc.shape == (16, x.shape[0])
    assert pred.loc.std(0).mean() > 1e-3  # distinct posterior samples give distinct functions
    # and the predictive mean fits clearly better than the initial net (a clear improvement, not a good fit: MFVI
    # underfits sin(3x))
    assert ((pred.mean - y) ** 2).mean().sqrt() < 0.75 * initial_rmse


@pytest.mark.parametrize("likelihood", LIKELIHOODS)
def test_likelihoods(likelihood):
    x, y = _regression(12)
    out_dim = 3 if likelihood == "categorical" else 1
    if likelihood == "categorical":
        y = (x.squeeze(-1) > 0).long() + (x.squeeze(-1) > 0.5).long()
    net = ODENet(1, out_dim, hidden=4, augment=1, dt=0.5, likelihood=likelihood)
    assert torch.isfinite(net.nll(x, y))
    guide = AutoNormal(net.model)
    svi = SVI(net.model, guide, Adam({"lr": 1e-2}), TraceMeanField_ELBO())
    assert torch.isfinite(torch.tensor(svi.step(x, y, num_data=30)))
    expected = ClassificationPrediction if likelihood == "categorical" else RegressionPrediction
    assert isinstance(net.predict(x), expected) and isinstance(net.predict(x, guide, num_samples=3), expected)


def test_dtype_follows_module():
    net = ResNet(2, 1, hidden=4, blocks=3).double()
    assert net.times.dtype == torch.float64 and net(torch.randn(4, 2, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("make, match", [
    (lambda: ODENet(0, 1), "in_dim"),
    (lambda: ODENet((1, 7, 8), 10), "in_dim"),
    (lambda: ODENet(1, 0), "out_dim"),
    (lambda: ODENet(1, 1, hidden=0), "hidden"),
    (lambda: ODENet(1, 1, augment=-1), "augment"),
    (lambda: ODENet(1, 1, dt=0.0), "dt"),
    (lambda: ODENet(1, 1, dt=-0.1), "dt"),
    (lambda: ODENet(1, 1, t_span=(1.0, 0.0)), "t_span"),
    (lambda: ODENet(1, 1, likelihood="poisson"), "likelihood"),
    (lambda: ODENet(1, 1, prior_scale=0.0), "prior_scale"),
    (lambda: ODENet(1, 1, obs_scale=-1.0), "obs_scale"),
    (lambda: ODENet(1, 1, activation="gelu"), "activation"),
    (lambda: ResNet(1, 1, blocks=0), "blocks"),
    (lambda: ResNet(1, 1, t_span=(0.0, 0.0)), "t_span"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_constructor_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("call, match", [
    (lambda net: net(torch.randn(4, 3)), "x must have shape"),
    (lambda net: net(torch.randn(4, 2), torch.randn(7)), "weights must have shape"),
    (lambda net: net.predict(torch.randn(4, 2), num_samples=0), "num_samples"),
    (lambda net: net.predict(torch.randn(4, 2), num_samples=True), "num_samples"),
    (lambda net: net.nll(torch.randn(4, 2), torch.randn(3)), "y must"),
    (lambda net: net.model(torch.randn(4, 2), torch.randn(4), num_data=2), "num_data"),
], ids=["x", "weights", "num_samples", "num_samples_bool", "y", "num_data"])
def test_bad_call_arguments(call, match):
    net = ODENet(2, 1, hidden=4, dt=0.5)
    with pytest.raises(ValueError, match=match):
        call(net)


def test_nll_raises_on_non_finite_loss():
    net = ODENet(1, 1, hidden=4, dt=0.5)
    with pyro.validation_enabled(False), pytest.raises(ValueError, match="non-finite"):
        net.nll(torch.full((3, 1), float("nan")), torch.zeros(3))


def test_predict_on_tensors_follows_the_network_dtype():
    """As a loader's batches, float32 tensors given to a float64 ODENet's predict are cast to float64."""
    pyro.clear_param_store()
    ode = ODENet(2, 2, hidden=4, augment=1, dt=0.5, likelihood="categorical").double()
    x = torch.randn(5, 2)
    a, b = ode.predict(x).probs, ode.predict(x.double()).probs
    assert a.dtype == torch.float64
    torch.testing.assert_close(a, b, rtol=0, atol=0)
