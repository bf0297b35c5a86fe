# SPDX-License-Identifier: Apache-2.0
"""Argument checks of the moment maps of :mod:`pyro_sdebnn.ops.moments`: a wrongly shaped input raises a ValueError
that names the argument and the expected shape (instead of torch's bare matmul / broadcast error or a silent
broadcast), from the shapes alone."""

import pytest
import torch

from pyro_sdebnn.ops.moments import (
    gaussian_expected_log_likelihood,
    gaussian_predictive_variance,
    mean_field_conv2d_moments,
    mean_field_linear_moments,
    multiplicative_conv2d_moments,
    multiplicative_linear_moments,
    relu_moments,
    taylor_moments,
)

X, W, A = torch.ones(4, 3), torch.ones(2, 3), torch.full((3,), 0.1)


@pytest.mark.parametrize("args, message", [
    ((torch.ones(4, 5), None, W, A),
     r"mean must have shape \(\.\.\., in\) with in = weight.shape\[1\] = 3, got \(4, 5\)"),
    ((X, torch.ones(4, 1), W, A), r"var must have the shape of mean \(4, 3\) or be None, got \(4, 1\)"),
    ((X, None, torch.ones(2, 3, 1), A), r"weight must have shape \(out, in\), got \(2, 3, 1\)"),
    ((X, None, W, torch.ones(2)), r"alpha must have shape \(in,\) = \(3,\), got \(2,\)"),
    ((X, None, W, A, torch.ones(3)), r"bias must have shape \(out,\) = \(weight.shape\[0\],\) = \(2,\), got \(3,\)"),
])
def test_multiplicative_linear_moments_shape_errors(args, message):
    with pytest.raises(ValueError, match=message):
        multiplicative_linear_moments(*args)


def test_multiplicative_conv2d_moments_shape_errors():
    x, w, a = torch.ones(2, 4, 5, 5), torch.ones(6, 2, 3, 3), torch.ones(4)
    assert multiplicative_conv2d_moments(x, None, w, a, groups=2).mean.shape == (2, 6, 3, 3)
    with pytest.raises(ValueError, match=r"mean must have shape \(N, C_in, H, W\) with C_in = .* = 2, got \(2, 4, 5,"):
        multiplicative_conv2d_moments(x, None, w, torch.ones(2))
    with pytest.raises(ValueError, match=r"alpha must have shape \(C_in,\) = \(4,\), got \(2,\)"):
        multiplicative_conv2d_moments(x, None, w, torch.ones(2), groups=2)
    with pytest.raises(ValueError, match=r"weight must have shape \(C_out, C_in / groups, kH, kW\), got \(6, 2\)"):
        multiplicative_conv2d_moments(x, None, torch.ones(6, 2), a)
    with pytest.raises(ValueError, match=r"groups must be a positive int dividing C_out = .* = 6, got 4"):
        multiplicative_conv2d_moments(torch.ones(2, 8, 5, 5), None, w, torch.ones(8), groups=4)
    with pytest.raises(ValueError, match=r"var must have the shape of mean"):
        multiplicative_conv2d_moments(x, torch.ones(2, 4, 5, 1), w, a, groups=2)


def test_mean_field_moments_shape_errors():
    with pytest.raises(ValueError, match=r"weight_var must have shape weight.shape = \(2, 3\), got \(3,\)"):
        mean_field_linear_moments(X, None, W, torch.ones(3))
    with pytest.raises(ValueError, match=r"mean must have shape \(\.\.\., in\)"):
        mean_field_linear_moments(torch.ones(4, 2), None, W, W)
    w = torch.ones(3, 1, 3, 3)
    with pytest.raises(ValueError, match=r"weight_var must have shape weight.shape = \(3, 1, 3, 3\)"):
        mean_field_conv2d_moments(torch.ones(1, 1, 4, 4), None, w, torch.ones(3, 1, 3))
    with pytest.raises(ValueError, match=r"bias must have shape \(out,\)"):
        mean_field_conv2d_moments(torch.ones(1, 1, 4, 4), None, w, w, torch.ones(1))


def test_elementwise_moment_maps_refuse_a_variance_of_another_shape():
    # relu_moments and taylor_moments broadcast such a variance silently before
    with pytest.raises(ValueError, match=r"var must have the shape of mean \(4, 3\) or be None, got \(3,\)"):
        relu_moments(X, torch.ones(3))
    with pytest.raises(ValueError, match=r"var must have the shape of mean"):
        relu_moments(X.requires_grad_(), torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"var must have the shape of mean"):
        taylor_moments(torch.tanh, X, torch.ones(4, 1))
    with pytest.raises(TypeError, match="mean must be a torch.Tensor"):
        relu_moments([0.0], None)


def test_gaussian_likelihood_broadcast_errors():
    y, v = torch.zeros(5), torch.zeros(5)
    with pytest.raises(ValueError, match=r"y, loc, loc_var, log_var, log_var_var must broadcast with each other, got "
                                         r"y \(5,\), loc \(4,\)"):
        gaussian_expected_log_likelihood(y, torch.zeros(4), v, v, v)
    with pytest.raises(ValueError, match=r"loc_var, log_var, log_var_var must broadcast .* log_var \(2,\)"):
        gaussian_predictive_variance(v, torch.zeros(2), v)
