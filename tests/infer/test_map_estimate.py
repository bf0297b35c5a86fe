# SPDX-License-Identifier: Apache-2.0
"""MAPEstimate (AutoDelta): the weight-decay solution, its full-Hessian Laplace approximation, a single sample."""

import pytest
import torch

from pyro_sdebnn.infer import MAPEstimate
from pyro_sdebnn.nn._mlp import make_mlp


def _blobs(n=64, spread=0.3):
    torch.manual_seed(0)
    y = torch.arange(n) % 2
    x = torch.randn(n, 2) * spread + (2.0 * y - 1.0).unsqueeze(-1)
    return x, y


def test_map_recovers_weight_decay_solution():
    """AutoDelta MAP == Adam on NLL + prior (same objective): logits agree."""
    x, y = _blobs(32)
    net = make_mlp([2, 2])  # logistic regression: a strictly convex MAP objective
    fit = MAPEstimate(net, "categorical", prior_scale=1.0).fit(x, y, num_epochs=600, lr=0.05, batch_size=None)
    w = torch.zeros(2, 2, requires_grad=True)
    b = torch.zeros(2, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, tolerance_grad=1e-9, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        nll = torch.nn.functional.cross_entropy(x @ w.T + b, y, reduction="sum")
        loss = nll + 0.5 * (w.square().sum() + b.square().sum())
        loss.backward()
        return loss

    opt.step(closure)
    expected = (x @ w.T + b).detach()
    logits = fit.predict_outputs(x)[0]
    # The logit differences (softmax is shift invariant per row) agree to Adam's convergence tolerance.
    torch.testing.assert_close(logits[:, 1] - logits[:, 0], expected[:, 1] - expected[:, 0], atol=2e-2, rtol=1e-2)


def test_map_laplace_approximation_full_hessian():
    torch.manual_seed(0)
    y = torch.arange(48) % 2
    x = torch.randn(48, 2) * 0.8 + (1.0 * y - 0.5).unsqueeze(-1)
    fit = MAPEstimate(make_mlp([2, 4, 2], "tanh"), "categorical").fit(x, y, num_epochs=400, lr=0.05, batch_size=None)
    posterior = fit.laplace_approximation(x, y).get_posterior()
    num_params = sum(v.numel() for v in fit.map_weights().values())
    assert posterior.loc.shape == (num_params,)
    # H^-1 with H the Hessian of -log p(D, w) = sum_i CE(f_w(x_i), y_i) + |w|^2 / 2 (+ const), by plain autograd
    net, weights = make_mlp([2, 4, 2], "tanh"), fit.map_weights()
    shapes = {name.removeprefix("net."): value.shape for name, value in weights.items()}

    def neg_log_joint(flat):
        params, i = {}, 0
        for name, shape in shapes.items():
            params[name], i = flat[i:i + shape.numel()].reshape(shape), i + shape.numel()
        logits = torch.func.functional_call(net, params, (x,))
        return torch.nn.functional.cross_entropy(logits, y, reduction="sum") + flat.pow(2).sum() / 2

    flat = torch.cat([value.reshape(-1) for value in weights.values()]).double()
    net.double()
    x = x.double()
    hessian = torch.autograd.functional.hessian(neg_log_joint, flat)
    torch.testing.assert_close(posterior.covariance_matrix.double(), torch.linalg.inv(hessian), rtol=2e-3, atol=1e-5)


def test_map_is_one_sample():
    """A point estimate has one predictive sample and one ELBO particle; other values are rejected."""
    x, y = _blobs(16)
    fit = MAPEstimate(make_mlp([2, 4, 2]), "categorical").fit(x, y, num_epochs=1)
    assert fit.predict(x).probs.shape == (1, 16, 2) and fit.predict(x, num_samples=1).probs.shape == (1, 16, 2)
    with pytest.raises(ValueError, match="num_samples must be 1"):
        fit.predict(x, num_samples=10)
    with pytest.raises(ValueError, match="num_samples must be 1"):
        fit.predict_outputs(x, num_samples=10)
    with pytest.raises(ValueError, match="num_particles must be 1"):
        MAPEstimate(make_mlp([2, 4, 2]), "categorical").fit(x, y, num_epochs=1, num_particles=4)

