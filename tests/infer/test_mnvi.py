# SPDX-License-Identifier: Apache-2.0
"""MNVI classification predictive (probit default, Monte Carlo with common random numbers), MNConcat,
side-effect-free ``SamplingFree_ELBO.loss`` and the error of a diverging fit.

Monte Carlo tolerances are ``Z = 5`` standard errors (``sd / sqrt(S)``) of the estimator.
"""

import math

import pyro
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pyro_sdebnn.infer import ClassificationPrediction, SamplingFree_ELBO, SamplingFreeBNN
from pyro_sdebnn.nn.mnvi import (
    MFLinear,
    MNConcat,
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


def _reference(bnn, x, draws=20000):
    """Independent-draw Monte Carlo estimate of E[softmax(h)] and its standard error."""
    out = bnn.moments(x)
    gen = torch.Generator().manual_seed(123)
    h = out.mean + out.var.sqrt() * torch.randn((draws,) + out.mean.shape, generator=gen)
    p = torch.softmax(h, -1).detach()
    return p.mean(0), p.std(0) / math.sqrt(draws)


def test_probit_softmax_without_variance_is_softmax_and_checks_arguments():
    h = torch.randn(5, 4)
    torch.testing.assert_close(probit_softmax(h, torch.zeros_like(h)), torch.softmax(h, -1))
    # variance shrinks the logits towards 0: less confident
    assert (probit_softmax(h, torch.ones_like(h)).amax(-1) < torch.softmax(h, -1).amax(-1)).all()
    with pytest.raises(ValueError, match="same shape"):
        probit_softmax(h, torch.zeros(5, 3))
    with pytest.raises(TypeError, match="torch.Tensors"):
        probit_softmax(h, 0.0)


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


def test_mn_concat_stacks_branch_moments():
    torch.manual_seed(0)
    a, b = MNLinear(4, 1), MNLinear(4, 2)
    heads = MNConcat(a, b)
    x = Moments(torch.randn(6, 4), torch.rand(6, 4))
    out, oa, ob = heads(x), a(x), b(x)
    torch.testing.assert_close(out.mean, torch.cat([oa.mean, ob.mean], -1))
    torch.testing.assert_close(out.var, torch.cat([oa.var, ob.var], -1))
    t = torch.randn(6, 4)
    torch.testing.assert_close(heads(t), torch.cat([a(t), b(t)], -1))
    assert heads(Moments(t, None)).var.shape == (6, 3)
    # each head has its own noise variances
    assert {n for n, _ in heads.named_parameters() if n.endswith("rho")} == {"branches.0.rho", "branches.1.rho"}
    with pytest.raises(ValueError, match="at least one"):
        MNConcat()
    with pytest.raises(TypeError, match="branch 1"):
        MNConcat(a, "b")


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
