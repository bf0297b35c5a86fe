# SPDX-License-Identifier: Apache-2.0
"""SamplingFree_ELBO, the expected-likelihood distributions and SamplingFreeBNN.

Monte Carlo tolerances are ``Z = 5`` standard errors (``sd / sqrt(N)``) of the estimator.
"""

import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO, TraceMeanField_ELBO
from pyro.optim import Adam

from pyro_sdebnn.distributions import MultiplicativeNormal
from pyro_sdebnn.infer import (
    ClassificationPrediction,
    LinearKLWarmup,
    PiecewiseKLSchedule,
    RegressionPrediction,
    SamplingFree_ELBO,
)
from pyro_sdebnn.nn.mnvi import (
    MFLinear,
    MNLinear,
    MNReLU,
    MNSequential,
    SamplingFreeBNN,
)
from pyro_sdebnn.nn.mnvi.handlers import sampling_free
from pyro_sdebnn.nn.mnvi.likelihoods import SamplingFreeCategorical, SamplingFreeNormal
from pyro_sdebnn.ops.moments import gaussian_expected_log_likelihood

Z = 5.0


def _regression_bnn(num_data=None, dtype=torch.float64, layer=MNLinear, **kwargs):
    net = MNSequential(layer(2, 16, dtype=dtype), MNReLU(), layer(16, 2, dtype=dtype))
    return SamplingFreeBNN(net, "normal", num_data=num_data, **kwargs)


@pytest.mark.parametrize("loc_var,log_var_var", [(0.0, 0.0), (0.3, 0.1), (1.0, 1.0), (0.2, 2.0)])
def test_gaussian_expected_log_likelihood_matches_monte_carlo(loc_var, log_var_var):
    y, loc, log_var = torch.tensor(0.7, dtype=torch.float64), torch.tensor(-0.2, dtype=torch.float64), torch.tensor(
        0.4, dtype=torch.float64)
    n = 400_000
    mu = loc + math.sqrt(loc_var) * torch.randn(n, dtype=torch.float64)
    c = log_var + math.sqrt(log_var_var) * torch.randn(n, dtype=torch.float64)
    samples = -0.5 * (math.log(2 * math.pi) + c + torch.exp(-c) * (mu - y) ** 2)
    closed = gaussian_expected_log_likelihood(y, loc, torch.tensor(loc_var), log_var, torch.tensor(log_var_var))
    se = samples.std() / math.sqrt(n)  # sd / sqrt(N)
    assert (closed - samples.mean()).abs() <= Z * se + 1e-12
    if log_var_var >= 1.0:
        # the exponent printed in eq. (15) of Schmitt & Roth (2021), e^{-c + v_c}, is rejected by the same Monte Carlo
        printed = -0.5 * (math.log(2 * math.pi) + log_var + torch.exp(-log_var + log_var_var) * (loc_var + (loc - y) ** 2))
        assert (printed - samples.mean()).abs() > Z * se


def test_gaussian_predictive_variance_matches_monte_carlo():
    d = SamplingFreeNormal(torch.tensor(0.0), torch.tensor(0.5), torch.tensor(-0.3), torch.tensor(0.8))
    n = 400_000
    mu = 0.5 ** 0.5 * torch.randn(n, dtype=torch.float64)
    c = -0.3 + 0.8 ** 0.5 * torch.randn(n, dtype=torch.float64)
    y = mu + torch.exp(0.5 * c) * torch.randn(n, dtype=torch.float64)
    se = ((y ** 2 - y.var()).std() / math.sqrt(n)).item()  # standard error of the sample variance
    assert abs(d.variance.item() - y.var().item()) <= Z * se


def test_categorical_expected_log_likelihood_is_unbiased():
    loc = torch.tensor([[1.0, -0.5, 0.2], [0.0, 2.0, -1.0]], dtype=torch.float64)
    var = torch.tensor([[0.5, 1.0, 0.2], [2.0, 0.1, 0.3]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    n = 200_000
    logits = loc + var.sqrt() * torch.randn(n, 2, 3, dtype=torch.float64)
    reference = torch.log_softmax(logits, -1)[:, [0, 1], y]
    d = SamplingFreeCategorical(loc, var, num_samples=n)
    estimate = d.log_prob(y)
    se = reference.std(0) / math.sqrt(n)  # two independent estimates: difference has sd sqrt(2) * se
    assert ((estimate - reference.mean(0)).abs() <= Z * math.sqrt(2) * se).all()
    assert torch.allclose(d.probs.sum(-1), torch.ones(2, dtype=torch.float64))


def test_categorical_expected_log_likelihood_with_leading_sample_dimensions():
    # values of shape sample_shape + batch_shape (here (2, 4) and (3, 1) for batch (4,)) broadcast like any
    # Pyro distribution; with the same logit draws, each row equals the evaluation at that row alone, and the
    # whole equals torch's Categorical averaged over the S draws (same numbers: round-off only)
    loc = torch.randn(4, 3, dtype=torch.float64)
    d = SamplingFreeCategorical(loc, torch.rand(4, 3, dtype=torch.float64), num_samples=5)
    for value in (torch.tensor([[0, 1, 2, 0], [2, 2, 1, 0]]), torch.tensor([[0], [1], [2]])):
        pyro.set_rng_seed(1)
        estimate = d.log_prob(value)
        pyro.set_rng_seed(1)
        logits = d._sample_logits()  # (S, 4, 3): the draws log_prob used
        reference = torch.distributions.Categorical(logits=logits.movedim(0, -2)).log_prob(value.unsqueeze(-1)).mean(-1)
        assert estimate.shape == torch.broadcast_shapes(value.shape, (4,))
        assert torch.allclose(estimate, reference, rtol=1e-12, atol=1e-14)
        for i in range(value.shape[0]):
            pyro.set_rng_seed(1)
            assert torch.equal(estimate[i], d.log_prob(value[i].expand(4)))


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


@pytest.mark.parametrize("kl_scale", [1.0, 0.3])
def test_loss_equals_closed_form_with_minibatch_scaling(kl_scale):
    num_data, batch = 100, 10
    bnn = _regression_bnn(num_data=num_data)
    x, y = torch.randn(batch, 2, dtype=torch.float64), torch.randn(batch, dtype=torch.float64)
    elbo = SamplingFree_ELBO(kl_scale=kl_scale)
    loss = elbo.differentiable_loss(bnn.model, bnn.guide, x, y)
    expected = -num_data / batch * bnn.expected_log_likelihood(x, y).sum() + kl_scale * bnn.kl_divergence()
    assert torch.allclose(loss, expected, rtol=1e-12)
    assert elbo.loss(bnn.model, bnn.guide, x, y) == pytest.approx(expected.item(), rel=1e-10)
    # poutine.scale multiplies both terms
    scaled = elbo.differentiable_loss(poutine.scale(bnn.model, 0.01), poutine.scale(bnn.guide, 0.01), x, y)
    assert torch.allclose(scaled, 0.01 * expected, rtol=1e-12)


def test_mean_field_layers_use_normal_normal_kl():
    bnn = _regression_bnn(num_data=20, layer=MFLinear)
    x, y = torch.randn(5, 2, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    loss = SamplingFree_ELBO().differentiable_loss(bnn.model, bnn.guide, x, y)
    expected = -4 * bnn.expected_log_likelihood(x, y).sum() + bnn.kl_divergence()
    assert torch.allclose(loss, expected, rtol=1e-12)


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


def test_nan_loss_raises():
    bnn = _regression_bnn(num_data=4)
    x, y = torch.randn(4, 2, dtype=torch.float64), torch.full((4,), float("nan"), dtype=torch.float64)
    pyro.enable_validation(False)  # with validation, the NaN target is already rejected as out of support
    try:
        with pytest.raises(FloatingPointError, match="loss is nan"):
            SamplingFree_ELBO().loss_and_grads(bnn.model, bnn.guide, x, y)
    finally:
        pyro.enable_validation(True)


@pytest.mark.parametrize("kwargs,match", [({"kl_scale": -1.0}, "kl_scale"), ({"vectorize_particles": True},
                                                                              "vectorize_particles")])
def test_bad_elbo_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingFree_ELBO(**kwargs)


def test_kl_without_registered_pair_falls_back_to_reparametrised_monte_carlo():
    # KL(MultivariateNormal || Independent(Normal)) is not registered, so the ELBO estimates each row's KL by one
    # reparametrised draw, log q(w) - log p(w). With K independent rows, the summed estimate has standard deviation
    # sqrt(K) sd_1 (sd_1 of one row, measured below from independent draws); its reparametrised gradient in the
    # guide's means is w / b^2 per entry, of expectation loc / b^2 (the analytic gradient) and, summed over all
    # entries, standard deviation sqrt(K 1'Sigma 1) / b^2 (= 33). A non-reparametrised draw (q.sample()) would
    # give the score-function gradient, of expectation 0 here.
    num_rows, dim, b = 2000, 3, 1.5
    loc = (1.0 + 0.5 * torch.randn(num_rows, dim, dtype=torch.float64)).requires_grad_()  # E grad.sum() = 2667
    scale_tril = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.8, 0.0], [-0.3, 0.2, 0.6]], dtype=torch.float64)
    prior = pyro.distributions.Normal(torch.zeros((), dtype=torch.float64), b).expand([num_rows, dim]).to_event(1)

    def model():
        with pyro.plate("rows", num_rows):
            pyro.sample("w", prior)

    def guide():
        with pyro.plate("rows", num_rows):
            pyro.sample("w", pyro.distributions.MultivariateNormal(loc, scale_tril=scale_tril))

    q = pyro.distributions.MultivariateNormal(loc.detach(), scale_tril=scale_tril)
    with pytest.raises(NotImplementedError):
        torch.distributions.kl_divergence(q, prior)  # the pair really has no closed form registered
    loss = SamplingFree_ELBO().differentiable_loss(model, guide)
    exact = torch.distributions.kl_divergence(
        q, pyro.distributions.MultivariateNormal(torch.zeros(dim, dtype=torch.float64),
                                                 b ** 2 * torch.eye(dim, dtype=torch.float64))).sum()
    w = q.sample((200,))
    sd_1 = (q.log_prob(w) - prior.log_prob(w)).std()  # from 400,000 independent rows
    assert (loss.detach() - exact).abs() <= Z * sd_1 * math.sqrt(num_rows)
    (grad,) = torch.autograd.grad(loss, loc)
    sd_grad = math.sqrt(num_rows * (scale_tril @ scale_tril.T).sum().item()) / b ** 2
    assert (grad.sum() - loc.detach().sum() / b ** 2).abs() <= Z * sd_grad


def test_kl_without_registered_pair_needs_a_reparametrised_guide():
    def model():
        pyro.sample("angle", pyro.distributions.Normal(0.0, 1.0))

    def guide():
        pyro.sample("angle", pyro.distributions.VonMises(0.0, 2.0))  # no KL to a Normal, no rsample

    with pytest.raises(ValueError, match="'angle' has no registered KL .* not reparametrised"):
        SamplingFree_ELBO().loss(model, guide)


def test_registered_kl_needs_no_reparametrisation():
    # an analytic KL is exact without rsample: a Poisson guide against a Poisson prior is accepted (validation on)
    rate = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)

    def model():
        pyro.sample("n", pyro.distributions.Poisson(torch.tensor(3.0, dtype=torch.float64)))

    def guide():
        pyro.sample("n", pyro.distributions.Poisson(rate))

    loss = SamplingFree_ELBO().differentiable_loss(model, guide)
    exact = 2.0 * math.log(2.0 / 3.0) - 2.0 + 3.0  # KL(Poi(a) || Poi(b)) = a log(a / b) - a + b
    assert loss.item() == pytest.approx(exact, rel=1e-12)
    (grad,) = torch.autograd.grad(loss, rate)
    assert grad.item() == pytest.approx(math.log(2.0 / 3.0), rel=1e-12)  # d/da = log(a / b)


def test_sampling_free_handler_samples_sites_without_a_closed_form_mean():
    # TransformedDistribution has no `mean`: under the handler such a latent site is sampled as usual (same draw
    # as without the handler under the same seed), while sites with a mean take it
    affine = pyro.distributions.TransformedDistribution(
        pyro.distributions.Normal(0.0, 1.0), [pyro.distributions.transforms.AffineTransform(1.0, 2.0)])
    with pytest.raises(NotImplementedError):
        affine.mean
    pyro.set_rng_seed(3)
    plain = pyro.sample("x", affine)
    pyro.set_rng_seed(3)
    with sampling_free():
        sampled = pyro.sample("x", affine)
        mean = pyro.sample("y", pyro.distributions.Normal(1.0, 2.0))
    assert torch.equal(sampled, plain) and sampled != 1.0
    assert mean == 1.0
    with sampling_free(), pyro.plate("rows", 3):  # a plate without `subsample` draws its indices as usual
        assert torch.equal(pyro.sample("z", pyro.distributions.Normal(1.0, 2.0)), torch.ones(3))


def test_guide_only_site_raises():
    bnn = _regression_bnn()
    x, y = torch.randn(3, 2, dtype=torch.float64), torch.randn(3, dtype=torch.float64)

    def guide(x, y):
        bnn.guide(x, y)
        pyro.sample("extra", pyro.distributions.Normal(0.0, 1.0), infer={"is_auxiliary": True})

    with pytest.raises(ValueError, match="not in the model"):
        SamplingFree_ELBO().loss(bnn.model, guide, x, y)


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


def test_piecewise_schedule_is_the_published_uci_schedule():
    schedule = PiecewiseKLSchedule([100, 150], [0.01, 0.1, 1.0])
    assert [schedule(e) for e in (0, 99, 100, 149, 150, 199)] == [0.01, 0.01, 0.1, 0.1, 1.0, 1.0]
    with pytest.raises(ValueError, match="len"):
        PiecewiseKLSchedule([10], [1.0])
