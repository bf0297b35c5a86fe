# SPDX-License-Identifier: Apache-2.0
"""SamplingFree_ELBO (on SamplingFreeBNN models), its KL schedules, the ``sampling_free`` handler and the
expected-likelihood distributions; SamplingFreeBNN itself is tested in ``test_mnvi.py``.

Monte Carlo tolerances are ``Z = 5`` standard errors (``sd / sqrt(N)``) of the estimator.
"""

import math

import pyro
import pyro.poutine as poutine
import pytest
import torch

from pyro_sdebnn.infer import PiecewiseKLSchedule, SamplingFree_ELBO, SamplingFreeBNN
from pyro_sdebnn.nn.mnvi import (
    MFLinear,
    MNLinear,
    MNReLU,
    MNSequential,
)
from pyro_sdebnn.nn.mnvi.handlers import sampling_free
from pyro_sdebnn.nn.mnvi.normalization import MNBatchNorm1d
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


def test_piecewise_schedule_is_the_published_uci_schedule():
    schedule = PiecewiseKLSchedule([100, 150], [0.01, 0.1, 1.0])
    assert [schedule(e) for e in (0, 99, 100, 149, 150, 199)] == [0.01, 0.01, 0.1, 0.1, 1.0, 1.0]
    with pytest.raises(ValueError, match="len"):
        PiecewiseKLSchedule([10], [1.0])


def test_elbo_loss_leaves_batch_norm_statistics_unchanged():
    torch.manual_seed(0)
    net = MNSequential(MNLinear(2, 8), MNBatchNorm1d(8), MNReLU(), MNLinear(8, 2))
    bnn = SamplingFreeBNN(net, "normal", num_data=16)
    x, y = torch.randn(16, 2) * 3 + 1, torch.randn(16)
    bn = net[1]
    net.train()
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    elbo = SamplingFree_ELBO()
    loss = elbo.loss(bnn.model, bnn.guide, x, y)
    assert all(torch.equal(before[k], v) for k, v in bn.state_dict().items())
    # ... yet the loss is the training objective: batch statistics, the value loss_and_grads reports
    assert loss == pytest.approx(elbo.loss_and_grads(bnn.model, bnn.guide, x, y), rel=1e-6)
    # a training step does update them (the check above can fail)
    assert not torch.equal(before["running_mean"], bn.running_mean)
    assert int(bn.num_batches_tracked) == 1


def test_autoguide_auxiliary_site_is_named_with_what_to_use_instead():
    """AutoNormal on a plain Pyro model: its auxiliary "<site>_unconstrained" is not a model site; the error says so
    and names the guides that work, instead of only "guide site 'w_unconstrained' is not in the model"."""
    import pyro.distributions as dist
    from pyro.infer.autoguide import AutoNormal

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)

    pyro.clear_param_store()
    x = torch.randn(5, 2)
    with pytest.raises(ValueError, match="'w_unconstrained' is not in the model: it is an auxiliary site of an "
                                         "autoguide.*SamplingFreeBNN.guide"):
        SamplingFree_ELBO().loss(model, AutoNormal(model), x, x[:, 0])


def _own_parameter_guide(bnn):
    def guide(x, y=None):  # a guide with its own parameters at the model's sites, not the layers'
        for name, layer in bnn.bayesian_layers():
            loc = pyro.param(f"loc.{name}", torch.zeros_like(layer.weight))
            pyro.sample(f"bnn.{name}.weight", pyro.distributions.Normal(loc, 0.1).to_event(layer.weight.dim()))
    return guide


@pytest.mark.parametrize("make_guide", [lambda bnn: pyro.infer.autoguide.AutoDelta(bnn.model),
                                        lambda bnn: pyro.infer.autoguide.AutoNormal(bnn.model),
                                        _own_parameter_guide], ids=["AutoDelta", "AutoNormal", "own-parameters"])
def test_a_guide_other_than_the_layers_raises_instead_of_training_the_kl_alone(make_guide):
    # the sampling-free model propagates the layers' own variational parameters whatever the guide samples: with
    # AutoDelta (or a guide with its own parameters) SVI ran, the likelihood trained the layers and the guide's
    # parameters got the KL alone
    pyro.clear_param_store()
    bnn = _regression_bnn(num_data=8)
    x, y = torch.randn(8, 2, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    svi = pyro.infer.SVI(bnn.model, make_guide(bnn), pyro.optim.Adam({"lr": 0.01}), SamplingFree_ELBO())
    with pytest.raises(ValueError, match=r"guide's weight 'bnn.0.weight' is not the variational posterior of layer "
                                         r"'0'.*SamplingFreeBNN.guide.*Trace_ELBO"):
        svi.step(x, y)
    pyro.clear_param_store()  # the same guide trains the same model by weight sampling
    svi = pyro.infer.SVI(bnn.model, make_guide(bnn), pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())
    assert math.isfinite(svi.step(x, y))
    pyro.clear_param_store()  # and the model's own guide under SamplingFree_ELBO
    assert math.isfinite(pyro.infer.SVI(bnn.model, bnn.guide, pyro.optim.Adam({"lr": 0.01}),
                                        SamplingFree_ELBO()).step(x, y))
