# SPDX-License-Identifier: Apache-2.0
"""SamplingFreeBNN (pyro_sdebnn.infer.mnvi): its closed-form KL, its model and guide under Pyro's own ELBOs and
``Predictive``, ``fit``, the one-pass predictives (regression; classification: probit default, Monte Carlo with common
random numbers), argument checks and the error of a diverging fit.

Monte Carlo tolerances are ``Z = 5`` standard errors (``sd / sqrt(number of draws)``) of the estimator.
"""

import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO, TraceMeanField_ELBO
from pyro.optim import Adam
from torch.utils.data import DataLoader, TensorDataset

from pyro_sdebnn.distributions import MultiplicativeNormal
from pyro_sdebnn.infer import (ClassificationPrediction, LinearKLWarmup, RegressionPrediction, SamplingFree_ELBO,
                               SamplingFreeBNN)
from pyro_sdebnn.nn.mnvi import (
    MFLinear,
    MNLinear,
    MNReLU,
    MNSequential,
    probit_softmax,
)
from pyro_sdebnn.nn.mnvi.normalization import MNBatchNorm1d
from pyro_sdebnn.ops import Moments

Z = 5.0
# The probit approximation is biased, not noisy: on this network (logit standard deviations ~0.2) its error is
# ~0.009 (the MNVI docs give it for other variances); the plain softmax of the mean logits errs by 0.024.
PROBIT_BOUND = 0.015


def _classifier(seed=0, rho_init=-3.0):
    torch.manual_seed(seed)
    net = MNSequential(MNLinear(2, 16, rho_init=rho_init), MNReLU(), MNLinear(16, 3, rho_init=rho_init))
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, MNLinear):
                m.weight.mul_(2.0)  # confident logits with a sizeable variance: a non-trivial test of the approximation
    return SamplingFreeBNN(net, "categorical", num_data=64)


def _regression_bnn(num_data=None, dtype=torch.float64, layer=MNLinear, **kwargs):
    net = MNSequential(layer(2, 16, dtype=dtype), MNReLU(), layer(16, 2, dtype=dtype))
    return SamplingFreeBNN(net, "normal", num_data=num_data, **kwargs)


def _reference(bnn, x, draws=20000):
    """Independent-draw Monte Carlo estimate of E[softmax(h)] and its standard error."""
    out = bnn.moments(x)
    gen = torch.Generator().manual_seed(123)
    h = out.mean + out.var.sqrt() * torch.randn((draws,) + out.mean.shape, generator=gen)
    p = torch.softmax(h, -1).detach()
    return p.mean(0), p.std(0) / math.sqrt(draws)


def test_default_predictive_is_deterministic_and_close_to_monte_carlo():
    bnn = _classifier()
    x = torch.randn(64, 2)
    torch.manual_seed(1)
    a = bnn.predict(x)
    after = torch.rand(1)
    torch.manual_seed(1)
    b = bnn.predict(x)
    assert torch.equal(torch.rand(1), after)  # no random numbers drawn
    assert isinstance(a, ClassificationPrediction) and a.probs.shape == (1, 64, 3)
    assert torch.equal(a.probs, b.probs)
    torch.testing.assert_close(a.probs.sum(-1), torch.ones(1, 64))
    ref, se = _reference(bnn, x)
    err = (a.mean_probs - ref).abs()
    assert (err <= PROBIT_BOUND + Z * se).all(), float(err.max())
    # the variance matters here: the plain softmax of the mean logits is far worse than the probit approximation
    plain = torch.softmax(bnn.moments(x).mean, -1).detach()
    assert (plain - ref).abs().max() > 2 * err.max()


def test_two_class_probit_is_mackay_on_the_logit_difference():
    torch.manual_seed(0)
    net = MNSequential(MNLinear(2, 16, rho_init=-1.0), MNReLU(), MNLinear(16, 2, rho_init=-1.0))
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, MNLinear):
                m.weight.mul_(2.0)  # logit standard deviations ~0.5
    bnn = SamplingFreeBNN(net, "categorical")
    x = torch.randn(64, 2)
    probs = bnn.predict(x).mean_probs
    out = bnn.moments(x)
    d = (out.mean[:, 1] - out.mean[:, 0]) / (1 + math.pi / 8 * out.var.sum(-1)).sqrt()
    torch.testing.assert_close(probs[:, 1], torch.sigmoid(d).detach())
    ref, se = _reference(bnn, x)
    # the error of the probit approximation to the logistic-normal integral alone: 0.006 here; the per-logit
    # form errs by 0.027 on this network
    assert ((probs - ref).abs() <= 0.01 + Z * se).all(), float((probs - ref).abs().max())


def test_monte_carlo_predictive_uses_common_random_numbers():
    bnn = _classifier(seed=2)
    x0 = torch.randn(1, 2)
    x = torch.cat([x0, torch.randn(30, 2), x0])
    pyro.set_rng_seed(3)
    pred = bnn.predict(x, predictive="mc", num_samples=4000)
    assert pred.probs.shape == (4000, 32, 3)
    # the same input gets the same draws (independent draws per input would differ)
    assert torch.equal(pred.probs[:, 0], pred.probs[:, -1])
    pyro.set_rng_seed(3)
    assert torch.equal(bnn.predict(x, predictive="mc", num_samples=4000).probs, pred.probs)  # same seed
    ref, ref_se = _reference(bnn, x)
    se = (pred.probs.var(0) / 4000 + ref_se ** 2).sqrt()
    assert ((pred.mean_probs - ref).abs() <= Z * se + 1e-6).all()


@pytest.mark.parametrize("predictive", ["probit", "mc"])
def test_streamed_predictive_equals_one_call(predictive):
    bnn = _classifier(seed=4)
    x = torch.randn(13, 2)
    pyro.set_rng_seed(5)
    full = bnn.predict(x, predictive=predictive, num_samples=7).probs
    pyro.set_rng_seed(5)
    streamed = bnn.predict(DataLoader(TensorDataset(x), batch_size=5), predictive=predictive, num_samples=7).probs
    torch.testing.assert_close(streamed, full, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kwargs,match", [({"predictive": "laplace"}, "predictive"),
                                          ({"num_samples": 0}, "num_samples"),
                                          ({"num_samples": 2.0}, "num_samples")])
def test_bad_predictive_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _classifier().predict(torch.randn(3, 2), **kwargs)


@pytest.mark.parametrize("likelihood", ["normal", "categorical"])
@pytest.mark.parametrize("layer", [MNLinear, MFLinear])
def test_diverging_fit_raises_floating_point_error(likelihood, layer):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    c = 2 if likelihood == "normal" else 3
    bnn = SamplingFreeBNN(MNSequential(layer(2, 8), MNReLU(), layer(8, c)), likelihood, num_data=32)
    x = torch.randn(32, 2)
    y = torch.randn(32) if likelihood == "normal" else torch.randint(0, 3, (32,))
    with pytest.raises(FloatingPointError, match="learning rate"):
        bnn.fit(x, y, num_epochs=20, batch_size=8, optim=pyro.optim.SGD({"lr": 1e6}))


def test_predict_runs_in_eval_mode_and_restores_the_mode():
    # predict switches to eval mode (batch norm: running statistics) only when some module is training, and puts the
    # network back in the mode it had (the top module's flag, for every submodule)
    torch.manual_seed(0)
    net = MNSequential(MNLinear(2, 8), MNBatchNorm1d(8), MNReLU(), MNLinear(8, 3))
    bnn = SamplingFreeBNN(net, "categorical", num_data=16)
    x = torch.randn(16, 2) * 3 + 1
    with torch.no_grad():
        net(Moments(x, None))  # running statistics that differ from this batch's
    net.eval()
    expected = bnn.predict(x).probs
    assert not any(m.training for m in net.modules())
    net.train()
    torch.testing.assert_close(bnn.predict(x).probs, expected, rtol=0, atol=0)
    assert all(m.training for m in net.modules())
    net.eval()
    net[1].train()  # a submodule left in training mode: still predicted in eval mode
    torch.testing.assert_close(bnn.predict(x).probs, expected, rtol=0, atol=0)
    assert not any(m.training for m in net.modules())
    net.train()  # the batch statistics would give another prediction (the checks above can fail)
    with torch.no_grad():
        train_mode = probit_softmax(*net(Moments(x, None)))
    assert not torch.allclose(train_mode, expected)


def test_kl_matches_monte_carlo():
    bnn = _regression_bnn(prior_scale=0.7)
    with torch.no_grad():
        for _, layer in bnn.bayesian_layers():
            layer.rho.uniform_(-2.0, 0.0)
    closed = bnn.kl_divergence()
    n = 20_000
    total = 0.0
    for _, layer in bnn.bayesian_layers():
        q, p = layer.weight_distribution(), bnn.prior(layer)
        w = q.sample((n,))
        total = total + (q.log_prob(w) - p.log_prob(w)).detach().sum((-2, -1))
    se = total.std() / math.sqrt(n)
    assert (closed.detach() - total.mean()).abs() <= Z * se


def test_sampling_free_training_fits_toy_regression():
    x = torch.linspace(-2, 2, 64, dtype=torch.float64).unsqueeze(-1).expand(-1, 2).contiguous()
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(64, dtype=torch.float64)
    bnn = _regression_bnn(num_data=64)
    before = bnn.predict(x)
    history = bnn.fit(x, y, num_epochs=30, batch_size=64, optim=Adam({"lr": 0.05}),
                      kl_schedule=LinearKLWarmup(1, start=1.0))  # constant kappa = 1: losses comparable
    after = bnn.predict(x)
    assert history[-1] < history[0] - 0.5  # per-datum negative ELBO drops by more than half a nat
    assert ((after.mean - y) ** 2).mean() < 0.5 * ((before.mean - y) ** 2).mean()


def test_trace_elbo_trains_same_model_with_multiplicative_normal_sites():
    bnn = _regression_bnn(num_data=32)
    x, y = torch.randn(32, 2, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
    guide_trace = poutine.trace(bnn.guide).get_trace(x, y)
    sites = [s for s in guide_trace.nodes.values() if s["type"] == "sample"]
    assert len(sites) == 2 and all(isinstance(s["fn"].base_dist, MultiplicativeNormal) for s in sites)
    svi = SVI(bnn.model, bnn.guide, Adam({"lr": 1e-2}), Trace_ELBO())
    loss = svi.step(x, y)
    assert math.isfinite(loss)
    rho = bnn.net[0].rho
    svi.optim.get_state()  # optimiser created for every parameter, rho included
    assert pyro.get_param_store()["bnn$$$0.rho"] is rho
    # the reparametrised weight sample gives rho a gradient through Trace_ELBO as well
    loss = Trace_ELBO().differentiable_loss(bnn.model, bnn.guide, x, y)
    (grad,) = torch.autograd.grad(loss, rho)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_mean_field_elbo_uses_the_same_analytic_kl():
    # TraceMeanField_ELBO: sampled likelihood, analytic KL -- its KL part must equal ours exactly
    bnn = _regression_bnn(num_data=6)
    x, y = torch.randn(6, 2, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    elbo = TraceMeanField_ELBO()
    model_trace, guide_trace = elbo._get_trace(bnn.model, bnn.guide, (x, y), {})
    loss = elbo._differentiable_loss_particle(model_trace, guide_trace)[1]
    expected = -model_trace.nodes["obs"]["log_prob_sum"] + bnn.kl_divergence()
    assert torch.allclose(loss, expected, rtol=1e-12)


def test_pyro_predictive_samples_observations():
    bnn = _regression_bnn(num_data=5)
    x = torch.randn(5, 2, dtype=torch.float64)
    samples = Predictive(bnn.model, guide=bnn.guide, num_samples=4, return_sites=["obs"])(x)
    assert samples["obs"].shape == (4, 5)


def test_sampled_model_runs_network_on_sampled_weights():
    bnn = _regression_bnn(num_data=8)
    x = torch.randn(8, 2, dtype=torch.float64)
    guide_trace = poutine.trace(bnn.guide).get_trace(x)
    model_trace = poutine.trace(poutine.replay(bnn.model, trace=guide_trace)).get_trace(x)
    w0, w2 = guide_trace.nodes["bnn.0.weight"]["value"], guide_trace.nodes["bnn.2.weight"]["value"]
    h = torch.relu(x @ w0.T + bnn.net[0].bias)
    out = h @ w2.T + bnn.net[2].bias
    fn = model_trace.nodes["obs"]["fn"]
    assert torch.allclose(fn.loc, out[:, 0]) and torch.allclose(fn.scale, torch.exp(0.5 * out[:, 1]))


def test_weights_drawn_in_an_outer_plate_run_the_network_once_per_draw():
    # Predictive(parallel=True) and vectorised ELBO particles draw the weights in an outer plate, (S, 1) + weight
    # shape: functional_call passed the stacked weights to F.linear and failed ("t() expects a tensor with <= 2
    # dimensions"); now each draw runs the network and the likelihood has batch shape (S, b)
    bnn = _regression_bnn(num_data=8)
    x = torch.randn(8, 2, dtype=torch.float64)
    draws = {f"bnn.{i}.weight": torch.randn((3, 1) + bnn.net[i].weight.shape, dtype=torch.float64) for i in (0, 2)}
    with pyro.plate("draws", 3, dim=-2):
        fn = poutine.trace(poutine.condition(bnn.model, data=draws)).get_trace(x).nodes["obs"]["fn"]
    assert fn.batch_shape == (3, 8)
    for s in range(3):
        h = torch.relu(x @ draws["bnn.0.weight"][s, 0].T + bnn.net[0].bias)
        out = h @ draws["bnn.2.weight"][s, 0].T + bnn.net[2].bias
        torch.testing.assert_close(fn.loc[s], out[:, 0])
        torch.testing.assert_close(fn.scale[s], torch.exp(0.5 * out[:, 1]))
    samples = Predictive(bnn.model, guide=bnn.guide, num_samples=4, parallel=True, return_sites=["obs"])(x)
    assert samples["obs"].shape == (4, 8)
    elbo = Trace_ELBO(num_particles=4, vectorize_particles=True, max_plate_nesting=1)
    assert math.isfinite(elbo.loss(bnn.model, bnn.guide, x, torch.randn(8, dtype=torch.float64)))
    bn = SamplingFreeBNN(MNSequential(MNLinear(2, 4), MNBatchNorm1d(4), MNReLU(), MNLinear(4, 2)), "normal", name="bn")
    with pytest.raises(ValueError, match="batch-norm layer '1' is in training mode.*net.eval()"):
        Predictive(bn.model, guide=bn.guide, num_samples=2, parallel=True)(torch.randn(8, 2))
    bn.net.eval()
    assert Predictive(bn.model, guide=bn.guide, num_samples=2, parallel=True)(torch.randn(8, 2))["obs"].shape == (2, 8)


def test_classification_elbo_and_predictive():
    net = MNSequential(MNLinear(2, 8), MNReLU(), MNLinear(8, 3))
    bnn = SamplingFreeBNN(net, "categorical", num_data=40, num_logit_samples=4)
    x, y = torch.randn(40, 2), torch.randint(0, 3, (40,))
    history = bnn.fit(x, y, num_epochs=3, batch_size=20)
    assert all(math.isfinite(h) for h in history)
    pred = bnn.predict(x, predictive="mc", num_samples=6)
    assert isinstance(pred, ClassificationPrediction) and pred.probs.shape == (6, 40, 3)
    assert torch.allclose(pred.probs.sum(-1), torch.ones(6, 40))
    pred = bnn.predict(x)  # default: the deterministic probit approximation, one row
    assert isinstance(pred, ClassificationPrediction) and pred.probs.shape == (1, 40, 3)
    assert torch.allclose(pred.probs.sum(-1), torch.ones(1, 40))


def test_regression_predictive_is_one_pass_gaussian():
    bnn = _regression_bnn()
    x = torch.randn(7, 2, dtype=torch.float64)
    pred = bnn.predict(x)
    out = bnn.moments(x)
    assert isinstance(pred, RegressionPrediction) and pred.loc.shape == (1, 7)
    expected = (out.var[:, 0] + torch.exp(out.mean[:, 1] + 0.5 * out.var[:, 1])).sqrt()
    assert torch.allclose(pred.scale[0], expected.detach())


@pytest.mark.parametrize("make,match", [
    (lambda net: SamplingFreeBNN(net, "poisson"), "likelihood"),
    (lambda net: SamplingFreeBNN(net, num_data=0), "num_data"),
    (lambda net: SamplingFreeBNN(net, prior_scale=-1.0), "prior_scale"),
    (lambda net: SamplingFreeBNN(torch.nn.Linear(2, 2)), "no BayesianLayer"),
])
def test_bad_bnn_arguments(make, match):
    net = MNSequential(MNLinear(2, 2))
    with pytest.raises(ValueError, match=match):
        make(net)


def test_bad_data_raises():
    bnn = _regression_bnn(num_data=10)
    with pytest.raises(ValueError, match="y must have shape"):
        bnn.model(torch.randn(4, 2, dtype=torch.float64), torch.randn(5, dtype=torch.float64))
    with pytest.raises(TypeError, match="normal-likelihood targets y must be a floating-point tensor"):
        bnn.model(torch.randn(4, 2, dtype=torch.float64), torch.arange(4))
    with pytest.raises(TypeError, match="categorical labels y must be an integer tensor"):
        SamplingFreeBNN(MNSequential(MNLinear(2, 3)), "categorical").model(torch.randn(4, 2), torch.zeros(4))
    with pytest.raises(ValueError, match=r"\(N, 2\)"):
        SamplingFreeBNN(MNSequential(MNLinear(2, 3)), "normal").predict(torch.randn(4, 2))


def test_inputs_of_another_dtype_than_the_network_raise_naming_x():
    # a float64 network given float32 inputs outside predict (which converts them) failed deep in F.linear with
    # "mat1 and mat2 must have the same dtype"; as for the SDE-BNN it is a TypeError naming x and both conversions
    bnn = _regression_bnn(num_data=4)
    x, y = torch.randn(4, 2), torch.randn(4)
    for run in (lambda: bnn.model(x, y), lambda: bnn.moments(x), lambda: bnn.expected_log_likelihood(x, y),
                lambda: SamplingFree_ELBO().loss(bnn.model, bnn.guide, x, y)):
        with pytest.raises(TypeError, match=r"x must have the network's dtype torch.float64, got torch.float32"):
            run()
    assert bnn.predict(x).loc.dtype == torch.float64  # predict converts the inputs, as before


def test_categorical_net_with_one_logit_column_raises_naming_the_outputs():
    """A one-column categorical net is a network error, not (as Pyro's support check would say) a label error."""
    bnn = SamplingFreeBNN(MNSequential(MNLinear(2, 1)), "categorical")
    with pytest.raises(ValueError, match=r"C >= 2 classes, got \(4, 1\)"):
        bnn.model(torch.randn(4, 2), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"C >= 2 classes"):
        bnn.predict(torch.randn(4, 2))


def test_num_data_follows_the_data_of_each_fit_unless_given():
    """num_data=None is set by fit to N; a second fit on a smaller data set kept the first N, scaling its likelihood
    by 40/10 as if it had four times the data. A num_data given to the constructor is the user's and stays."""
    x, y = torch.randn(40, 2), torch.randn(40)
    bnn = SamplingFreeBNN(MNSequential(MNLinear(2, 2)), "normal")
    bnn.fit(x, y, num_epochs=1)
    assert bnn.num_data == 40
    bnn.fit(x[:10], y[:10], num_epochs=1)
    assert bnn.num_data == 10
    trace = poutine.trace(bnn.model).get_trace(x[:10], y[:10])
    assert trace.nodes["obs"]["scale"] == 1.0  # the whole (new) data set: no N/b scaling
    given = SamplingFreeBNN(MNSequential(MNLinear(2, 2)), "normal", num_data=100, name="given")
    given.fit(x[:10], y[:10], num_epochs=1)
    assert given.num_data == 100


@pytest.mark.parametrize("predictive", ["probit", "mc"])
def test_predict_on_tensors_follows_the_network_dtype(predictive):
    """fit casts float32 tensors to a float64 network (train_svi); predict on the same tensors failed with "mat1 and
    mat2 must have the same dtype". Tensors are now cast as a loader's batches are: the float64 inputs' prediction."""
    bnn = SamplingFreeBNN(MNSequential(MNLinear(2, 4), MNReLU(), MNLinear(4, 3)).double(), "categorical")
    x = torch.randn(6, 2)
    preds = []
    for xs in (x, x.double()):
        torch.manual_seed(0)
        preds.append(bnn.predict(xs, predictive=predictive).probs)
    assert preds[0].dtype == torch.float64
    torch.testing.assert_close(preds[0], preds[1], rtol=0, atol=0)
