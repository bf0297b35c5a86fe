# SPDX-License-Identifier: Apache-2.0
"""Moment propagation of the MNVI layers (and ``probit_softmax`` on their output moments) against Monte Carlo and
exact reference computations.

Monte Carlo tolerances are ``Z = 5`` standard errors of the estimator: for a mean, ``sd / sqrt(N)``;
for a variance, ``sqrt((m4 - var^2) / N)`` with ``m4`` the sample fourth central moment. With at
most a few dozen compared entries per test, a 5-sigma bound fails by chance with probability < 1e-4.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from pyro_sdebnn.distributions import MultiplicativeNormal
from pyro_sdebnn.nn.mnvi import (
    MFConv2d,
    MFLinear,
    MNActivation,
    MNConcat,
    MNConv2d,
    MNLinear,
    MNReLU,
    MNResidualBlock,
    MNSequential,
    probit_softmax,
)
from pyro_sdebnn.nn.mnvi.normalization import MNBatchNorm2d
from pyro_sdebnn.nn.mnvi.pooling import MNAdaptiveAvgPool2d, MNAvgPool2d, MNMaxPool2d
from pyro_sdebnn.ops import Moments
from pyro_sdebnn.ops.moments import relu_moments

Z = 5.0


def _mc_check(samples: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> None:
    """Compare analytic moments with those of ``samples`` (first dim = Monte Carlo draws)."""
    n = samples.shape[0]
    mc_mean = samples.mean(0)
    centred = samples - mc_mean
    mc_var = centred.square().mean(0)
    m4 = centred.pow(4).mean(0)
    se_mean = (mc_var / n).sqrt()  # sd / sqrt(N)
    se_var = ((m4 - mc_var.square()).clamp_min(0) / n).sqrt()  # sqrt((m4 - var^2) / N)
    assert ((mean - mc_mean).abs() <= Z * se_mean + 1e-12).all(), (mean, mc_mean, se_mean)
    assert ((var - mc_var).abs() <= Z * se_var + 1e-12).all(), (var, mc_var, se_var)


@pytest.mark.parametrize("mu", [-1.0, -0.5, 0.0, 1.0, 3.0])
@pytest.mark.parametrize("s2", [0.25, 1.0, 4.0])  # P(Z > 0) >= 0.02: the MC estimate resolves it
def test_relu_moments_match_monte_carlo(mu, s2):
    n = 200_000
    z = mu + math.sqrt(s2) * torch.randn(n, 1, dtype=torch.float64)
    out = relu_moments(torch.tensor([mu], dtype=torch.float64), torch.tensor([s2], dtype=torch.float64))
    _mc_check(z.clamp_min(0), out.mean, out.var)


def test_relu_moments_stable_for_confident_inputs():
    # mu >> s: the naive (mu^2+s^2)Phi + mu s phi - E^2 cancels catastrophically in float32.
    mu = torch.tensor([30.0, 300.0, -300.0])
    s2 = torch.tensor([1e-4, 1e-2, 1e-2])
    out32 = relu_moments(mu, s2)
    out64 = relu_moments(mu.double(), s2.double())
    assert torch.allclose(out32.var.double(), out64.var, rtol=1e-4, atol=1e-12)
    assert torch.allclose(out64.var[:2], s2[:2].double(), rtol=1e-6)  # ReLU is the identity there
    assert out64.var[2] == 0 and out64.mean[2] == 0


def test_relu_variance_floor():
    out = relu_moments(torch.zeros(1), torch.zeros(1))
    floor = torch.tensor(1e-5)
    assert torch.allclose(out.mean, floor.sqrt() / math.sqrt(2 * math.pi))


def _linear_inputs(batch=3, n_in=4):
    mean = torch.randn(batch, n_in, dtype=torch.float64)
    var = torch.rand(batch, n_in, dtype=torch.float64) * 0.5
    return mean, var


def test_mn_linear_moments_match_induced_weight_distribution():
    layer = MNLinear(4, 2, dtype=torch.float64)
    with torch.no_grad():
        layer.rho.copy_(torch.tensor([-2.0, -1.0, 0.0, 0.5]))  # alpha in [0.13, 0.97]
    mean, var = _linear_inputs()
    out = layer(Moments(mean, var))
    n = 200_000
    w = MultiplicativeNormal(layer.weight.detach(), layer.alpha.detach(), noise_dim=-1).sample((n,))  # (n, 2, 4)
    x = mean + var.sqrt() * torch.randn(n, *mean.shape, dtype=torch.float64)  # (n, 3, 4), independent inputs
    z = torch.einsum("noi,nbi->nbo", w, x) + layer.bias.detach()
    _mc_check(z, out.mean.detach(), out.var.detach())


def test_mf_linear_moments_match_mean_field_weights():
    layer = MFLinear(4, 2, rho_init=-2.0, dtype=torch.float64)
    mean, var = _linear_inputs()
    out = layer(Moments(mean, var))
    n = 200_000
    w = layer.weight_distribution().sample((n,))
    x = mean + var.sqrt() * torch.randn(n, *mean.shape, dtype=torch.float64)
    z = torch.einsum("noi,nbi->nbo", w.detach(), x) + layer.bias.detach()
    _mc_check(z, out.mean.detach(), out.var.detach())


def test_two_layer_moments_exact_for_deterministic_input():
    # With a known input, the first pre-activations are exactly Gaussian and independent across
    # units (distinct weight rows), so Linear -> ReLU -> Linear moments are exact. From the second
    # hidden layer on, units share inputs (correlated) and are no longer Gaussian: Assumptions 2-3
    # of the MNVI layers (Schmitt & Roth 2021) then make the propagation approximate, so only this exact case is asserted.
    net = MNSequential(MNLinear(3, 5, dtype=torch.float64), MNReLU(), MNLinear(5, 2, dtype=torch.float64))
    with torch.no_grad():
        net[0].rho.fill_(-1.0)
        net[2].rho.fill_(-1.5)
    x = torch.randn(4, 3, dtype=torch.float64)
    out = net(Moments(x, None))
    n = 200_000
    w1 = net[0].weight_distribution().sample((n,)).detach()
    w2 = net[2].weight_distribution().sample((n,)).detach()
    h = torch.relu(torch.einsum("noi,bi->nbo", w1, x) + net[0].bias.detach())
    z = torch.einsum("noi,nbi->nbo", w2, h) + net[2].bias.detach()
    _mc_check(z, out.mean.detach(), out.var.detach())


def _unfolded_reference(conv, mean, var, weight_var=None):
    """Conv moments computed as a dense layer applied to every unfolded input patch."""
    k = conv.kernel_size
    cols_mean = F.unfold(mean, k, conv.dilation, conv.padding, conv.stride)  # (B, C*kh*kw, L)
    cols_var = F.unfold(var, k, conv.dilation, conv.padding, conv.stride)
    w = conv.weight.reshape(conv.out_channels, -1)
    out_mean = torch.einsum("ok,bkl->bol", w, cols_mean) + conv.bias[:, None]
    if weight_var is None:  # MN: alpha repeated over each channel's kh*kw patch entries
        alpha = conv.alpha.repeat_interleave(k[0] * k[1])[:, None]
        var_in = alpha * cols_mean.square() + (1 + alpha) * cols_var
        out_var = torch.einsum("ok,bkl->bol", w.square(), var_in)
    else:
        s = weight_var.reshape(conv.out_channels, -1)
        out_var = torch.einsum("ok,bkl->bol", s, cols_var + cols_mean.square()) + torch.einsum(
            "ok,bkl->bol", w.square(), cols_var)
    h = (mean.shape[-2] + 2 * conv.padding[0] - conv.dilation[0] * (k[0] - 1) - 1) // conv.stride[0] + 1
    return out_mean.reshape(mean.shape[0], conv.out_channels, h, -1), out_var.reshape(mean.shape[0], conv.out_channels,
                                                                                       h, -1)


@pytest.mark.parametrize("stride,padding", [(1, 0), (2, 1)])
def test_mn_conv_moments_equal_unfolded_linear(stride, padding):
    conv = MNConv2d(3, 4, 3, stride=stride, padding=padding, dtype=torch.float64)
    with torch.no_grad():
        conv.rho.copy_(torch.tensor([-3.0, -1.0, 0.5]))
    mean = torch.randn(2, 3, 7, 7, dtype=torch.float64)
    var = torch.rand(2, 3, 7, 7, dtype=torch.float64)
    out = conv(Moments(mean, var))
    ref_mean, ref_var = _unfolded_reference(conv, mean, var)
    assert torch.allclose(out.mean, ref_mean, atol=1e-12)  # same sums in a different order: round-off only
    assert torch.allclose(out.var, ref_var, atol=1e-12)


def test_mf_conv_moments_equal_unfolded_linear():
    conv = MFConv2d(2, 3, 3, padding=1, rho_init=-2.0, dtype=torch.float64)
    mean = torch.randn(2, 2, 5, 5, dtype=torch.float64)
    var = torch.rand(2, 2, 5, 5, dtype=torch.float64)
    out = conv(Moments(mean, var))
    ref_mean, ref_var = _unfolded_reference(conv, mean, var, conv.weight_var)
    assert torch.allclose(out.mean, ref_mean, atol=1e-12)
    assert torch.allclose(out.var, ref_var, atol=1e-12)


@pytest.mark.parametrize("groups", [1, 2])
def test_mn_conv_weight_distribution_matches_moment_path(groups):
    conv = MNConv2d(4, 4, 1, groups=groups, dtype=torch.float64)
    with torch.no_grad():
        conv.rho.copy_(torch.tensor([-3.0, -2.0, -1.0, 0.0]))
    mean = torch.randn(1, 4, 2, 2, dtype=torch.float64)
    out = conv(Moments(mean, None))
    # per-weight variance alpha_i m^2 from the distribution must reproduce the same output variance
    s = conv.weight_distribution().variance
    ref = F.conv2d(mean.square(), s, None, 1, 0, 1, groups)
    assert torch.allclose(out.var, ref, atol=1e-12)


@pytest.mark.parametrize("fn,derivative", [
    (torch.tanh, lambda m: 1 - torch.tanh(m) ** 2),
    (torch.sigmoid, lambda m: torch.sigmoid(m) * (1 - torch.sigmoid(m))),
    (lambda m: 2 * m + 1, lambda m: torch.full_like(m, 2.0)),
])
def test_taylor_activation_moments(fn, derivative):
    mean = torch.randn(5, dtype=torch.float64, requires_grad=True)
    var = torch.rand(5, dtype=torch.float64)
    out = MNActivation(fn)(Moments(mean, var))
    assert torch.allclose(out.mean, fn(mean))
    assert torch.allclose(out.var, derivative(mean).square() * var)
    (out.mean.sum() + out.var.sum()).backward()  # double backward through f' where it depends on mean
    assert torch.isfinite(mean.grad).all()


def test_taylor_activation_under_no_grad():
    with torch.no_grad():
        out = MNActivation(torch.tanh)(Moments(torch.zeros(3), torch.ones(3)))
    assert not out.mean.requires_grad and torch.allclose(out.var, torch.ones(3))


@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_variance_is_linear_map(training):
    bn = MNBatchNorm2d(3).double()
    reference = torch.nn.BatchNorm2d(3).double()
    with torch.no_grad():
        for m in (bn, reference):
            m.weight.copy_(torch.tensor([0.5, 2.0, -1.0]))
            m.running_var.copy_(torch.tensor([0.5, 1.5, 3.0]))
    bn.train(training)
    reference.train(training)
    mean = 2 + torch.randn(8, 3, 4, 4, dtype=torch.float64)
    var = torch.rand(8, 3, 4, 4, dtype=torch.float64)
    out = bn(Moments(mean, var))
    assert torch.allclose(out.mean, reference(mean))
    stat = mean.var(dim=(0, 2, 3), unbiased=False) if training else torch.tensor([0.5, 1.5, 3.0], dtype=torch.float64)
    expected = bn.weight.detach().square()[:, None, None] * var / (stat[:, None, None] + bn.eps)
    assert torch.allclose(out.var, expected)


def test_maxpool_carries_variance_of_mean_argmax():
    mean = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    var = torch.rand(2, 3, 4, 4, dtype=torch.float64)
    out = MNMaxPool2d(2)(Moments(mean, var))
    windows_mean = mean.unfold(2, 2, 2).unfold(3, 2, 2).reshape(2, 3, 2, 2, 4)
    windows_var = var.unfold(2, 2, 2).unfold(3, 2, 2).reshape(2, 3, 2, 2, 4)
    arg = windows_mean.argmax(-1, keepdim=True)
    assert torch.equal(out.mean, windows_mean.gather(-1, arg).squeeze(-1))
    assert torch.equal(out.var, windows_var.gather(-1, arg).squeeze(-1))


def test_average_pools_divide_variance_by_window_size():
    mean = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    var = torch.rand(1, 2, 4, 4, dtype=torch.float64)
    out = MNAvgPool2d(2)(Moments(mean, var))
    expected = var.unfold(2, 2, 2).unfold(3, 2, 2).sum((-1, -2)) / 16  # Var of a mean of 4 independent terms
    assert torch.allclose(out.var, expected)
    glob = MNAdaptiveAvgPool2d(1)(Moments(mean, var))
    assert torch.allclose(glob.var.flatten(), var.sum((-1, -2)).flatten() / 256)


def test_residual_block_adds_means_and_variances():
    main = MNSequential(MNLinear(3, 3, dtype=torch.float64))
    block = MNResidualBlock(main)
    mean, var = torch.randn(2, 3, dtype=torch.float64), torch.rand(2, 3, dtype=torch.float64)
    out = block(Moments(mean, var))
    branch = main(Moments(mean, var))
    assert torch.allclose(out.mean, branch.mean + mean)
    assert torch.allclose(out.var, branch.var + var)


def test_negative_variance_is_rejected_by_every_module_under_validation():
    # every module checks the moments it is given (types and shapes always, var >= 0 under Pyro validation), so
    # a network, a block and a single layer reject a negative variance alike, and inside a network the moments a
    # module of the user's built are checked at the layer that receives them
    block = MNResidualBlock(MNSequential(MNLinear(3, 3), MNReLU(), MNLinear(3, 3)), activation=MNReLU())
    net = MNSequential(MNLinear(3, 3), MNReLU(), block, MNActivation(torch.tanh))
    good = Moments(torch.randn(2, 3), torch.rand(2, 3))
    bad = Moments(torch.randn(2, 3), -torch.rand(2, 3))
    assert (net(good).var >= 0).all()
    for module in (net, block, block.main[1], MNReLU(), MNMaxPool2d(1), MNAvgPool2d(1), MNBatchNorm2d(3)):
        x = bad if not isinstance(module, (MNMaxPool2d, MNAvgPool2d, MNBatchNorm2d)) else Moments(
            torch.randn(1, 3, 2, 2), -torch.rand(1, 3, 2, 2))
        with pytest.raises(ValueError, match="non-negative"):
            module(x)
    with pytest.raises(ValueError, match="non-negative"):  # and inside a network, at the layer that receives it
        MNSequential(_SetVariance(-1.0), MNReLU())(good)


def test_containers_check_the_variance_once_and_where_a_users_module_built_it(monkeypatch):
    # under validation a container checks var >= 0 of its own input and vouches for what this package's modules
    # produce; moments built by a module of the user's are checked where they arrive, and the vouching ends with
    # the call (also when it raises)
    from pyro_sdebnn.nn.mnvi import _moment_inputs

    value_checks = []
    real = _moment_inputs.check_moments
    monkeypatch.setattr(_moment_inputs, "check_moments", lambda mean, var, name, check_values: (
        value_checks.append(check_values and var is not None), real(mean, var, name, check_values=check_values)))
    good = Moments(torch.randn(2, 3), torch.rand(2, 3))
    block = MNResidualBlock(MNSequential(MNLinear(3, 3), MNReLU(), MNLinear(3, 3)), activation=MNReLU())
    net = MNSequential(MNLinear(3, 3), MNReLU(), block, MNConcat(MNLinear(3, 1), MNLinear(3, 1)))
    net(good)
    assert sum(value_checks) == 1  # the network's input only, of 11 modules that take moments
    value_checks.clear()
    MNSequential(MNLinear(3, 3), _SetVariance(0.5), MNReLU(), MNLinear(3, 3))(good)
    assert sum(value_checks) == 2  # the input, and the moments _SetVariance built, at the MNReLU that receives them
    value_checks.clear()
    user_block = MNResidualBlock(_SetVariance(0.5), activation=MNReLU())
    MNSequential(user_block)(good)
    assert sum(value_checks) == 2  # the sum of a user's branch is checked by the activation after it
    with pytest.raises(ValueError, match="non-negative"):
        MNSequential(MNLinear(3, 3), _SetVariance(-1.0), MNReLU())(good)
    assert _moment_inputs._CHECKED.get() is None
    with pytest.raises(ValueError, match="non-negative"):  # the object a container vouched for is checked outside it
        MNReLU()(Moments(good.mean, -good.var))


class _SetVariance(torch.nn.Module):
    """Test helper: replaces the variance by a constant (negative for the error test)."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, input):
        return Moments(input.mean, torch.full_like(input.mean, self.value))


@pytest.mark.slow
def test_compiled_relu_matches_eager():
    mean, var = torch.randn(4, 3, 5, 5), torch.rand(4, 3, 5, 5)
    eager = MNReLU()(Moments(mean, var))
    fused = MNReLU(compile=True)(Moments(mean, var))
    # float32 kernels that fuse the same formulas: agreement to a few ulps of the values (~1e-7 relative)
    assert torch.allclose(fused.mean, eager.mean, rtol=1e-5, atol=1e-6)
    assert torch.allclose(fused.var, eager.var, rtol=1e-5, atol=1e-6)


def test_relu_compile_flag_does_not_shadow_module_compile():
    relu = MNReLU(compile=True)
    assert relu.use_compile is True and MNReLU().use_compile is False
    # the flag lives beside nn.Module.compile, which must stay the bound method
    assert relu.compile.__func__ is torch.nn.Module.compile
    assert "compile=True" in repr(relu)


def _wide_relu_inputs(dtype):
    # r = mu / s spans the lower tail, the centre, the band 4 < r < 6 where erf has not yet rounded to 1,
    # and far tails; s^2 spans 1e-8 (below the floor) to 1e4.
    g = torch.Generator().manual_seed(0)
    mu = torch.cat([torch.randn(20_000, generator=g, dtype=torch.float64) * 10, torch.linspace(-8, 8, 1601,
                                                                                              dtype=torch.float64)])
    s2 = torch.cat([torch.exp(torch.randn(20_000, generator=g, dtype=torch.float64) * 4),
                    torch.ones(1601, dtype=torch.float64)])
    return mu.to(dtype), s2.to(dtype)


def _relu_moments_ndtr(mean, var, min_var=1e-5):
    """Reference: the closed form of relu_moments evaluated with two ``ndtr`` calls and no shared terms."""
    var = var.clamp_min(min_var)
    std = var.sqrt()
    r = mean / std
    cdf, sf = torch.special.ndtr(r), torch.special.ndtr(-r)
    std_pdf = torch.exp(-0.5 * r.square()) / math.sqrt(2 * math.pi) * std
    out_mean = mean * cdf + std_pdf
    out_var = var * cdf - out_mean * (std_pdf - mean * sf)
    return Moments(out_mean, out_var.clamp_min(0.0))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_relu_moments_single_erf_equals_ndtr_reference_float64(requires_grad):
    # Same closed form, evaluated with one erf instead of two ndtr: in float64 they agree to rounding, compared on
    # the natural scales of the output (s for the mean, s^2 for the variance), with and without autograd.
    mu, s2 = _wide_relu_inputs(torch.float64)
    ref = _relu_moments_ndtr(mu, s2)
    out = relu_moments(mu.clone().requires_grad_(requires_grad), s2)
    s2f = s2.clamp_min(1e-5)
    assert ((out.mean.detach() - ref.mean).abs() / s2f.sqrt()).max() < 1e-13
    assert ((out.var.detach() - ref.var).abs() / s2f).max() < 1e-13


def test_relu_moments_gradients_are_exact():
    # one function for training and prediction, with in-place operations on its temporaries: autograd's gradients
    # must be those of the closed form, checked against finite differences in float64 on both sides of 0, in the
    # tails and at the variance floor; and against the analytic dE/dmu = Phi(r) (Frey & Hinton 1999)
    g = torch.Generator().manual_seed(2)
    mean = torch.cat([torch.randn(20, generator=g, dtype=torch.float64) * 2, torch.tensor([-9.0, 9.0, 0.0],
                      dtype=torch.float64)]).requires_grad_()
    var = torch.cat([torch.rand(20, generator=g, dtype=torch.float64) + 0.1, torch.tensor([1.0, 1.0, 1e-7],
                     dtype=torch.float64)]).requires_grad_()
    assert torch.autograd.gradcheck(lambda m, v: tuple(relu_moments(m, v)), (mean[:22], var[:22]))
    out = relu_moments(mean, var)
    (grad,) = torch.autograd.grad(out.mean.sum(), mean)
    expected = torch.special.ndtr(mean / var.clamp_min(1e-5).sqrt()).detach()
    assert torch.allclose(grad, expected, rtol=1e-12, atol=1e-15)


def test_relu_moments_single_erf_float32_error_bound():
    # float32 against the float64 reference, on every point of the wide input set. The erf tails carry an absolute
    # error of ~1 ulp, which enters the variance multiplied by ~r^2 where 2 < |r| < 6 (erf not yet rounded to +-1).
    # The bound 24 eps s^2 (2.9e-6 relative, the docstring's 3e-6) covers that; the naive evaluation
    # (mu^2 + s^2) Phi + mu s phi - E^2 does not, because mu^2 cancels against E^2 and, for |r| > 6, s^2 is lost
    # entirely. The mean carries the rounding of mu itself (|mu| eps), bounded by a few eps (|mu| + s).
    mu, s2 = _wide_relu_inputs(torch.float64)
    ref = _relu_moments_ndtr(mu, s2)
    out = relu_moments(mu.float(), s2.float())
    s2f = s2.clamp_min(1e-5)
    eps = torch.finfo(torch.float32).eps
    mean_err = (out.mean.double() - ref.mean).abs()
    assert (mean_err <= 8 * eps * (mu.abs() + s2f.sqrt())).all()
    assert ((out.var.double() - ref.var).abs() / s2f).max() < 24 * eps


def _relu_moments_autograd(mean, var, out_grads):
    """Gradients of the closed form by autograd through its operations (no hand-written backward)."""
    from pyro_sdebnn.ops.moments import _relu_moments_forward

    mean, var = mean.detach().requires_grad_(), var.detach().requires_grad_()
    out_mean, out_var, *_ = _relu_moments_forward(mean, var, 1e-5, backward_terms=False)
    loss = (out_mean * out_grads[0] + out_var.clamp_min(0.0) * out_grads[1]).sum()
    return torch.autograd.grad(loss, (mean, var))


def _relu_moments_backward(mean, var, out_grads):
    mean, var = mean.detach().requires_grad_(), var.detach().requires_grad_()
    out = relu_moments(mean, var)
    return torch.autograd.grad((out.mean * out_grads[0] + out.var * out_grads[1]).sum(), (mean, var))


def test_relu_moments_hand_written_backward_equals_autograd():
    # relu_moments trains through a hand-written backward (dE/dmu = Phi, dE/ds2 = phi/(2s), dV/dmu = 2E(1 - Phi),
    # dV/ds2 = Phi - E phi/s). On the wide input set (both tails, the variance floor, and ~10 % of points whose
    # variance rounds below zero and is clamped) and random output gradients: in float64 it equals autograd through
    # the closed form to rounding, and in float32 its error against that float64 reference is within a few dozen eps
    # of the gradients' natural scales (|g_E| + |g_V| (|E| + s) for mu, divided by s for s^2), as autograd's is.
    mu, s2 = _wide_relu_inputs(torch.float64)
    g = torch.Generator().manual_seed(3)
    out_grads = torch.randn((2,) + mu.shape, generator=g, dtype=torch.float64)
    from pyro_sdebnn.ops.moments import _relu_moments_forward

    raw_var = _relu_moments_forward(mu, s2, 1e-5)[1]
    assert (raw_var < 0).sum() > 100 and (s2 < 1e-5).sum() > 10  # the clamps' masks are exercised
    std = s2.clamp_min(1e-5).sqrt()
    scale_mu = out_grads[0].abs() + out_grads[1].abs() * (relu_moments(mu, s2).mean.abs() + std)
    scales = (scale_mu, scale_mu / std)
    reference = _relu_moments_autograd(mu, s2, out_grads)
    for got, ref, scale in zip(_relu_moments_backward(mu, s2, out_grads), reference, scales):
        assert ((got - ref).abs() / scale).max() < 1e-14
    eps = torch.finfo(torch.float32).eps
    got32 = _relu_moments_backward(mu.float(), s2.float(), out_grads.float())
    for got, ref, scale in zip(got32, reference, scales):
        assert ((got.double() - ref).abs() / scale).max() < 32 * eps


# torch.func's forward mode (jacfwd, hessian) triggers torch's own deprecation warning of torch.jit.script, internally
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_relu_moments_higher_derivatives_and_torch_func():
    # the hand-written backward must not cut higher derivatives or torch.func: double backward, hessian (jacfwd of
    # jacrev: forward mode over the vmapped backward) and jvp against autograd through the closed form, in float64
    # (both sides of 0, the floor)
    from pyro_sdebnn.ops.moments import _relu_moments_forward

    def closed_form(m, v):
        out_mean, out_var, *_ = _relu_moments_forward(m, v, 1e-5, backward_terms=False)
        return out_mean, out_var.clamp_min(0.0)

    g = torch.Generator().manual_seed(4)
    mean = torch.cat([torch.randn(8, generator=g, dtype=torch.float64) * 2, torch.tensor([-4.0, 4.0])])
    var = torch.cat([torch.rand(8, generator=g, dtype=torch.float64) + 0.1, torch.tensor([1e-7, 1.0])])
    assert torch.autograd.gradgradcheck(lambda m, v: tuple(relu_moments(m, v)), (mean.clone().requires_grad_(),
                                                                                   var.clone().requires_grad_()))

    def loss(fn):
        return lambda m, v: sum((w * o).sum() for w, o in zip((1.5, -0.7), fn(m, v)))

    ours, ref = loss(lambda m, v: tuple(relu_moments(m, v))), loss(closed_form)
    for argnums in (0, 1):
        torch.testing.assert_close(torch.func.hessian(ours, argnums)(mean, var),
                                   torch.func.hessian(ref, argnums)(mean, var), rtol=1e-12, atol=1e-14)
    tangents = (torch.randn(10, generator=g, dtype=torch.float64), torch.randn(10, generator=g, dtype=torch.float64))
    got = torch.func.jvp(lambda m, v: tuple(relu_moments(m, v)), (mean, var), tangents)[1]
    want = torch.func.jvp(closed_form, (mean, var), tangents)[1]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("with_var", [False, True])
@pytest.mark.parametrize("kind", ["linear", "conv", "conv-groups"])
def test_multiplicative_variance_equals_literal_formula(kind, with_var):
    # (M o M)((1 + alpha) v + alpha x^2), written literally, against the rearranged evaluation
    # (alpha folded onto the squared weights when v = 0). float64: agreement to rounding.
    from pyro_sdebnn.ops.moments import multiplicative_conv2d_moments, multiplicative_linear_moments

    g = torch.Generator().manual_seed(1)
    if kind == "linear":
        x, w, alpha = (torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g,
                       dtype=torch.float64), torch.rand(4, generator=g, dtype=torch.float64))
        v = torch.rand(5, 4, generator=g, dtype=torch.float64) if with_var else None
        out = multiplicative_linear_moments(x, v, w, alpha)
        a, vv = alpha, (torch.zeros_like(x) if v is None else v)
        literal = F.linear((1 + a) * vv + a * x * x, w * w)
    else:
        groups = 2 if kind == "conv-groups" else 1
        x, w, alpha = (torch.randn(2, 4, 6, 6, generator=g, dtype=torch.float64),
                       torch.randn(6, 4 // groups, 3, 3, generator=g, dtype=torch.float64),
                       torch.rand(4, generator=g, dtype=torch.float64))
        v = torch.rand(2, 4, 6, 6, generator=g, dtype=torch.float64) if with_var else None
        out = multiplicative_conv2d_moments(x, v, w, alpha, None, 1, 1, 1, groups)
        a, vv = alpha.reshape(-1, 1, 1), (torch.zeros_like(x) if v is None else v)
        literal = F.conv2d((1 + a) * vv + a * x * x, w * w, None, 1, 1, 1, groups)
    assert torch.allclose(out.var, literal, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kernel, stride, padding, shape", [
    (2, 2, 0, (4, 3, 8, 8)), (2, 2, 0, (3, 7, 9)), (3, 3, 0, (2, 2, 9, 10)), (3, 2, 1, (1, 2, 7, 6)),
])
def test_maxpool_training_and_inference_agree_ties_included(dtype, kernel, stride, padding, shape):
    # one path: the same means and the same carried variances with and without autograd, also where a window's
    # maximum is tied (e.g. ReLU means that underflowed to 0, or half-precision rounding): the variance of the first tied entry
    g = torch.Generator().manual_seed(0)
    mean = torch.randint(-3, 3, shape, generator=g).to(dtype)  # six values, both signs: many tied maxima
    var = torch.rand(*shape, generator=g).to(dtype)
    pool = MNMaxPool2d(kernel, stride, padding)
    with torch.no_grad():
        inference = pool(Moments(mean, var))
    training = pool(Moments(mean.clone().requires_grad_(), var.clone().requires_grad_()))
    assert torch.equal(inference.mean, training.mean.detach()) and torch.equal(inference.var, training.var.detach())
    # reference: the first maximal entry of every window, in row-major order
    neg_inf = torch.tensor(float("-inf"), dtype=dtype)
    padded_mean = F.pad(mean, (padding,) * 4, value=neg_inf.item())
    padded_var = F.pad(var, (padding,) * 4)
    windows_mean = padded_mean.unfold(-2, kernel, stride).unfold(-2, kernel, stride).flatten(-2)
    windows_var = padded_var.unfold(-2, kernel, stride).unfold(-2, kernel, stride).flatten(-2)
    is_max = windows_mean == windows_mean.amax(-1, keepdim=True)
    assert (is_max.sum(-1) > 1).any()  # ties occur
    first = is_max.int().argmax(-1, keepdim=True)  # argmax of a 0/1 tensor: the first maximal entry
    assert torch.equal(inference.mean, windows_mean.gather(-1, first).squeeze(-1))
    assert torch.equal(inference.var, windows_var.gather(-1, first).squeeze(-1))


@pytest.mark.parametrize("shape", [(100, 6, 28, 28), (2, 16, 11, 9), (3, 5, 4)])
def test_maxpool_2x2_without_autograd_halves_and_equals_max_pool2d(shape, monkeypatch):
    # the 2x2 / stride-2 window without autograd on the CPU runs as two branch-free halvings (no max_pool2d call),
    # with max_pool2d's values: the mean's maximum and the variance of its first arg-max in row-major order
    g = torch.Generator().manual_seed(1)
    mean, var = torch.randn(shape, generator=g).exp(), torch.rand(shape, generator=g)
    out, index = F.max_pool2d(mean, 2, 2, return_indices=True)
    expected_var = var.flatten(-2).gather(-1, index.flatten(-2)).view_as(out)
    monkeypatch.setattr(F, "max_pool2d", None)  # the pooling module calls F.max_pool2d through the module F
    with torch.no_grad():
        pooled = MNMaxPool2d(2)(Moments(mean, var))
    assert torch.equal(pooled.mean, out) and torch.equal(pooled.var, expected_var)



def test_probit_softmax_without_variance_is_softmax_and_checks_arguments():
    h = torch.randn(5, 4)
    torch.testing.assert_close(probit_softmax(h, torch.zeros_like(h)), torch.softmax(h, -1))
    # variance shrinks the logits towards 0: less confident
    assert (probit_softmax(h, torch.ones_like(h)).amax(-1) < torch.softmax(h, -1).amax(-1)).all()
    with pytest.raises(ValueError, match="same shape"):
        probit_softmax(h, torch.zeros(5, 3))
    with pytest.raises(TypeError, match="torch.Tensors"):
        probit_softmax(h, 0.0)


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


def test_relu_moments_of_an_exactly_known_input():
    # var=None is the Moments convention for an exactly known input; relu_moments raised AttributeError on it
    mean = torch.tensor([-1.0, 0.0, 2.0])
    out = relu_moments(mean, None)
    assert out.var is None and torch.equal(out.mean, torch.tensor([0.0, 0.0, 2.0]))
