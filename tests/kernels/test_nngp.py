# SPDX-License-Identifier: Apache-2.0
"""NNGP kernel: closed forms vs quadrature, limiting cases, and convergence of wide random MLPs to it."""

from __future__ import annotations

import math

import pyro
import pyro.contrib.gp as gp
import pytest
import torch

import pyro_sdebnn.kernels.nngp as nngp_module
from pyro_sdebnn.kernels import NNGP

DTYPE = torch.float64
ACTIVATIONS = {"relu": torch.relu, "erf": torch.erf, "tanh": torch.tanh}


def _inputs():
    return torch.tensor([[1.0, 0.0, 0.5], [0.2, -1.0, 0.3], [-0.7, 0.4, 0.0], [0.3, 0.3, 0.3]], dtype=DTYPE)


@pytest.mark.parametrize("activation, rtol", [("erf", 1e-6), ("relu", 2e-2)])
def test_closed_form_matches_quadrature(activation, rtol):
    # erf is smooth: 40-point Gauss-Hermite is exact to ~1e-6; ReLU's kink limits quadrature to ~1e-2
    x = _inputs()
    closed = NNGP(3, 1.7, 0.2, activation)(x)
    quad = NNGP(3, 1.7, 0.2, ACTIVATIONS[activation], num_quadrature=40)(x)
    torch.testing.assert_close(closed, quad, rtol=rtol, atol=0.0)


@pytest.mark.parametrize("activation", ["relu", "erf", "tanh"])
def test_kernel_matrix_is_symmetric_psd_with_consistent_diag(activation):
    x = torch.randn(12, 3, dtype=DTYPE)
    k = NNGP(2, 1.5, 0.1, activation)
    cov = k(x)
    torch.testing.assert_close(cov, cov.T)
    torch.testing.assert_close(k(x, diag=True), cov.diagonal())
    assert torch.linalg.eigvalsh(cov).min() > -1e-10


def test_cross_covariance_shape_and_consistency():
    x, z = torch.randn(5, 3, dtype=DTYPE), torch.randn(7, 3, dtype=DTYPE)
    k = NNGP(2, 1.5, 0.1, "tanh")
    full = k(torch.cat([x, z]))
    torch.testing.assert_close(k(x, z), full[:5, 5:])


def test_depth_zero_is_linear_kernel():
    x = _inputs()
    torch.testing.assert_close(NNGP(0, 2.0, 0.3)(x), 0.3 + 2.0 * x @ x.T / 3)


def test_relu_he_scaling_preserves_the_diagonal():
    # sigma_w^2 = 2, sigma_b^2 = 0: E[relu(u)^2] = k / 2, so K^l(x, x) = K^0(x, x) at every depth
    x = _inputs()
    torch.testing.assert_close(NNGP(5, 2.0, 0.0)(x, diag=True), 2.0 * x.square().mean(-1))


def test_quadrature_chunking_gives_same_result(monkeypatch):
    x = torch.randn(6, 2, dtype=DTYPE)
    k = NNGP(2, 1.3, 0.1, "tanh", num_quadrature=10)
    expected = k(x)
    monkeypatch.setattr(nngp_module, "_QUADRATURE_CHUNK", 250)  # 2 pairs per chunk
    torch.testing.assert_close(k(x), expected)


def test_hyperparameter_gradients_are_finite_on_the_diagonal():
    x = _inputs()
    for activation in ("relu", "erf", "tanh"):
        k = NNGP(2, 1.5, 0.1, activation)
        k(x).sum().backward()
        for name, p in k.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), (activation, name)


def test_fits_with_gpregression():
    x = torch.linspace(-2, 2, 20, dtype=DTYPE).unsqueeze(-1)
    k = NNGP(1, torch.tensor(1.0, dtype=DTYPE), torch.tensor(0.1, dtype=DTYPE), input_dim=1)
    model = gp.models.GPRegression(x, x[:, 0].abs(), k, noise=torch.tensor(0.1, dtype=DTYPE))
    losses = gp.util.train(model, torch.optim.Adam(model.parameters(), lr=0.05), num_steps=20)
    assert losses[-1] < losses[0]


def _mlp_kernel_estimate(x, depth, width, weight_variance, bias_variance, phi, num_networks, generator):
    """Per-network estimate of the output covariance of random MLPs of the given width.

    The readout is integrated out exactly: Cov(out(x), out(x') | hidden) = s_b^2 + s_w^2 mean_i phi(h_i) phi(h'_i).
    """
    estimates = []
    for _ in range(num_networks):
        h = x
        for _layer in range(depth):
            fan_in = h.shape[-1]
            w = torch.randn(fan_in, width, dtype=DTYPE, generator=generator) * math.sqrt(weight_variance / fan_in)
            b = torch.randn(width, dtype=DTYPE, generator=generator) * math.sqrt(bias_variance)
            h = phi(h @ w + b)
        # h holds phi(pre-activations) of the last hidden layer
        estimates.append(bias_variance + weight_variance * h @ h.T / width)
    return torch.stack(estimates)


@pytest.mark.slow
@pytest.mark.parametrize("activation", ["relu", "erf", "tanh"])
def test_wide_random_mlps_converge_to_nngp(activation):
    # Lee et al. (2018), Deep neural networks as Gaussian processes: the empirical output covariance of random MLPs approaches the NNGP kernel as width grows
    x = _inputs()
    depth, wv, bv = 2, 1.8, 0.1
    expected = NNGP(depth, wv, bv, activation)(x).detach()
    generator = torch.Generator().manual_seed(0)
    errors = {}
    for width in (16, 1024):
        est = _mlp_kernel_estimate(x, depth, width, wv, bv, ACTIVATIONS[activation], 16, generator)
        mean = est.mean(0)
        # SE of the mean of 16 independent per-network estimates; finite-width bias is O(1 / width)
        se = est.std(0) / math.sqrt(est.shape[0])
        errors[width] = (mean - expected).abs().max().item()
        if width == 1024:
            assert ((mean - expected).abs() <= 5 * se + 2.0 / width).all(), (mean, expected, se)
    assert errors[1024] < errors[16] / 3, errors


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="depth"):
        NNGP(-1)
    with pytest.raises(ValueError, match="activation"):
        NNGP(1, activation="sigmoid")
    with pytest.raises(TypeError, match="activation"):
        NNGP(1, activation=3)
    with pytest.raises(ValueError, match="weight_variance"):
        NNGP(1, weight_variance=0.0)
    with pytest.raises(ValueError, match="bias_variance"):
        NNGP(1, bias_variance=-1.0)
    with pytest.raises(ValueError, match="features"):
        NNGP(1)(torch.zeros(2, 3), torch.zeros(2, 4))


def test_active_dims():
    x = torch.randn(4, 3, dtype=DTYPE)
    k = NNGP(1, 1.0, 0.0, input_dim=2, active_dims=[0, 2])
    torch.testing.assert_close(k(x), NNGP(1, 1.0, 0.0)(x[:, [0, 2]]))


def test_two_kernels_with_different_hyperparameters_in_one_store_need_a_scope():
    # documents the Pyro param-store sharing (see the NNGP note) and the scope that avoids it
    x = _inputs()
    NNGP(1, 1.0, 0.0)(x)
    with pyro.get_param_store().scope():
        k2 = NNGP(1, 2.0, 0.0)(x)
    # ReLU with sigma_b = 0 is positively homogeneous, so K^1 scales with (sigma_w^2)^2 = 4
    torch.testing.assert_close(k2, 4.0 * NNGP(1, 1.0, 0.0)(x))


@pytest.mark.parametrize("kwargs, name", [
    ({"weight_variance": float("inf")}, "weight_variance"),
    ({"bias_variance": float("inf")}, "bias_variance"),
])
def test_infinite_variances_are_refused(kwargs, name):
    # they were accepted, and the infinite kernel matrix failed later in GPFunctionalPrior's Cholesky factorisation
    with pytest.raises(ValueError, match=f"`{name}` must be a (non-negative|positive) finite scalar"):
        NNGP(depth=1, **kwargs)
