# SPDX-License-Identifier: Apache-2.0
"""Moment propagation: means and variances of activations pushed through network layers.

Pure tensor maths behind the sampling-free layers of :mod:`pyro_sdebnn.nn.mnvi` [1].
A random activation is summarised by its element-wise mean and variance, carried together as a
:class:`Moments` pair. Every function here maps moments to moments under the two approximations
of [1] (Sec. 3.3): pre-activations are Gaussian (Assumption 2) and the units of a layer are
independent (Assumption 3), so only variances -- never covariances -- are propagated.

Shape convention: ``mean`` and ``var`` have identical shapes, ``(batch, features)`` for dense
layers and ``(batch, channels, height, width)`` for convolutions; ``var=None`` stands for an exactly
known (deterministic) input, e.g. the data, and lets the first layer skip the variance terms that
would be zero.

**References**

1. Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.
   arXiv:2103.08497.
2. Brendan J. Frey, Geoffrey E. Hinton (1999). "Variational Learning in Nonlinear Gaussian Belief
   Networks". Neural Computation 11(1).
3. Anqi Wu, Sebastian Nowozin, Edward Meeds, Richard E. Turner, José Miguel Hernández-Lobato,
   Alexander L. Gaunt (2019). "Deterministic Variational Inference for Robust Bayesian Neural Networks".
   ICLR 2019. arXiv:1810.03958.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "Moments",
    "gaussian_expected_log_likelihood",
    "multiplicative_linear_moments",
    "relu_moments",
    "taylor_moments",
]

_LOG_2PI = math.log(2.0 * math.pi)
_LOG_INV_SQRT_2PI = -0.5 * math.log(2.0 * math.pi)
_SQRT_HALF = math.sqrt(0.5)
_LOG2_E = 1.0 / math.log(2.0)
_LOG2_INV_SQRT_2PI = _LOG_INV_SQRT_2PI * _LOG2_E

#: Lower bound on the ReLU input variance (Schmitt & Roth (2021), App. A).
RELU_MIN_VAR = 1e-5


class Moments(NamedTuple):
    """Element-wise mean and variance of a random activation tensor.

    ``var=None`` means the activation is known exactly (variance zero), as for the network input.

    :param Tensor mean: the mean, any shape.
    :param var: the variance, same shape as ``mean``, or ``None`` for zero variance.
    :type var: Tensor or None

    >>> m = Moments(torch.zeros(2, 3), torch.ones(2, 3))
    >>> m.mean.shape, m.var.shape
    (torch.Size([2, 3]), torch.Size([2, 3]))
    """

    mean: Tensor
    var: Tensor | None = None


def check_moments(mean: Tensor, var: Tensor | None, name: str = "input", *, check_values: bool = True) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``(mean, var)`` is a valid moment pair.

    :param Tensor mean: the mean.
    :param var: the variance or ``None``.
    :param str name: the argument name used in error messages.
    :param bool check_values: also check ``var >= 0``, which NaN fails (a device synchronisation), and that ``var``
        has the device and (outside autocast) the dtype of ``mean``; callers run it under Pyro validation, once per
        container. Types and shapes are always checked.
    """
    if not isinstance(mean, Tensor):
        raise TypeError(f"{name}.mean must be a torch.Tensor, got {type(mean).__name__}")
    if var is None:
        return
    if not isinstance(var, Tensor):
        raise TypeError(f"{name}.var must be a torch.Tensor or None, got {type(var).__name__}")
    if var.shape != mean.shape:
        raise ValueError(
            f"{name}.var must have the shape of {name}.mean {tuple(mean.shape)}, got {tuple(var.shape)}"
        )
    if not check_values:
        return
    # under autocast the layers mix dtypes by design (autocast casts the operands of each operation)
    mixed = var.dtype != mean.dtype and not torch.is_autocast_enabled(mean.device.type)
    if mixed or var.device != mean.device:
        raise TypeError(
            f"{name}.var must have the dtype and device of {name}.mean ({mean.dtype}, {mean.device}), "
            f"got ({var.dtype}, {var.device})"
        )
    # a NaN propagates through ``min`` and fails ``>= 0``
    if var.numel() and not bool(var.min() >= 0):
        found = "NaN" if bool(var.isnan().any()) else f"a minimum of {var.min()}"
        raise ValueError(f"{name}.var must be non-negative (variances), got {found}")


def multiplicative_linear_moments(
    mean: Tensor, var: Tensor | None, weight: Tensor, alpha: Tensor, bias: Tensor | None = None
) -> Moments:
    r"""Moments of a dense layer whose weights are induced by multiplicative input noise.

    With weights :math:`w_{ij}\sim\mathcal N(m_{ij}, \alpha_j m_{ij}^2)` and independent inputs of
    mean :math:`x` and variance :math:`v` (eq. (9) of [1]):

    .. math::

        \mathbb E[z] = Mx + b, \qquad
        \mathbb V[z] = (M\circ M)\big((1+\alpha)\circ v + \alpha\circ x\circ x\big).

    Both moments are exact for independent inputs (the output covariance is dropped).

    :param Tensor mean: input means ``(..., in)``.
    :param var: input variances ``(..., in)`` or ``None`` (deterministic input).
    :param Tensor weight: weight means ``M`` of shape ``(out, in)``.
    :param Tensor alpha: noise variances ``(in,)``.
    :param bias: ``(out,)`` or ``None`` (the bias is a point estimate).
    :returns: output :class:`Moments` ``(..., out)``.

    >>> out = multiplicative_linear_moments(torch.ones(4, 3), None, torch.ones(2, 3), torch.full((3,), 0.1))
    >>> out.mean[0], out.var[0]
    (tensor([3., 3.]), tensor([0.3000, 0.3000]))
    """
    out_mean = F.linear(mean, weight, bias)
    return Moments(out_mean, F.linear(*_multiplicative_variance_input(mean, var, weight.square(), alpha, -1)))


def multiplicative_conv2d_moments(
    mean: Tensor,
    var: Tensor | None,
    weight: Tensor,
    alpha: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
) -> Moments:
    r"""Moments of a 2-d convolution with multiplicative noise shared within each input channel.

    The convolutional analogue of :func:`multiplicative_linear_moments` (Schmitt & Roth (2021), Sec. 3.3.1):
    :math:`\mathbb E[z] = M * x + b`, :math:`\mathbb V[z] = (M\circ M) * ((1+\alpha) v + \alpha x^2)`
    with :math:`\alpha` of shape ``(in_channels,)`` broadcast over the spatial dimensions.

    :param Tensor mean: input means ``(N, C_in, H, W)``.
    :param var: input variances of the same shape, or ``None``.
    :param Tensor weight: ``(C_out, C_in / groups, kH, kW)``.
    :param Tensor alpha: ``(C_in,)``.
    :returns: output :class:`Moments` ``(N, C_out, H', W')``.

    >>> out = multiplicative_conv2d_moments(torch.ones(1, 2, 4, 4), None, torch.ones(3, 2, 3, 3), torch.ones(2))
    >>> out.mean.shape, out.var[0, 0, 0, 0]
    (torch.Size([1, 3, 2, 2]), tensor(18.))
    """
    out_mean = F.conv2d(mean, weight, bias, stride, padding, dilation, groups)
    var_in, weight_sq = _multiplicative_variance_input(mean, var, weight.square(), alpha, -3, groups)
    return Moments(out_mean, F.conv2d(var_in, weight_sq, None, stride, padding, dilation, groups))


def _multiplicative_variance_input(
    mean: Tensor, var: Tensor | None, weight_sq: Tensor, alpha: Tensor, dim: int, groups: int = 1
) -> tuple[Tensor, Tensor]:
    r"""The operands ``(u, W)`` of the variance map :math:`(M\circ M)\,((1+\alpha) v + \alpha x^2)`.

    With :math:`(1+\alpha) v + \alpha x^2 = v + \alpha (v + x^2)` the input side costs two fused
    element-wise passes (``addcmul`` twice) instead of five; for a deterministic input (``var=None``) the
    factor :math:`\alpha` is moved onto the (small) squared weights, :math:`(M\circ M)\,\mathrm{diag}(\alpha)`,
    leaving one pass (``x^2``). ``dim`` is the input-feature dimension of ``mean`` (``-1`` dense, ``-3`` conv).
    """
    if var is None:
        if groups == 1:
            shape = (-1,) + (1,) * (-dim - 1)  # alpha along the weight's input dimension (dim 1)
            return mean.square(), weight_sq * alpha.reshape(shape)
        return alpha.reshape((-1,) + (1,) * (-dim - 1)) * mean.square(), weight_sq
    a = alpha.reshape((-1,) + (1,) * (-dim - 1))
    return torch.addcmul(var, torch.addcmul(var, mean, mean), a), weight_sq


def mean_field_linear_moments(
    mean: Tensor, var: Tensor | None, weight: Tensor, weight_var: Tensor, bias: Tensor | None = None
) -> Moments:
    r"""Moments of a dense layer with a mean-field Gaussian weight posterior.

    With :math:`w_{ij}\sim\mathcal N(m_{ij}, s_{ij})` (eq. (8) of [1], [3]):

    .. math::

        \mathbb E[z] = Mx + b, \qquad \mathbb V[z] = S(v + x\circ x) + (M\circ M) v .

    :param Tensor weight_var: per-weight variances ``S`` of shape ``(out, in)``.

    >>> out = mean_field_linear_moments(torch.ones(1, 3), None, torch.ones(2, 3), torch.full((2, 3), 0.1))
    >>> out.var
    tensor([[0.3000, 0.3000]])
    """
    out_mean = F.linear(mean, weight, bias)
    second = mean.square() if var is None else mean.square() + var
    out_var = F.linear(second, weight_var)
    if var is not None:
        out_var = out_var + F.linear(var, weight.square())
    return Moments(out_mean, out_var)


def mean_field_conv2d_moments(
    mean: Tensor,
    var: Tensor | None,
    weight: Tensor,
    weight_var: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
) -> Moments:
    r"""Convolutional analogue of :func:`mean_field_linear_moments`: :math:`S*(v+x^2) + (M\circ M)*v`.

    >>> out = mean_field_conv2d_moments(torch.ones(1, 1, 3, 3), None, torch.ones(1, 1, 3, 3), torch.ones(1, 1, 3, 3))
    >>> out.var.flatten()
    tensor([9.])
    """
    conv = lambda x, w, b=None: F.conv2d(x, w, b, stride, padding, dilation, groups)  # noqa: E731
    out_mean = conv(mean, weight, bias)
    second = mean.square() if var is None else mean.square() + var
    out_var = conv(second, weight_var)
    if var is not None:
        out_var = out_var + conv(var, weight.square())
    return Moments(out_mean, out_var)


def relu_moments(mean: Tensor, var: Tensor | None, min_var: float = RELU_MIN_VAR) -> Moments:
    r"""Exact mean and variance of :math:`\max(Z, 0)` for :math:`Z\sim\mathcal N(\mu, s^2)`.

    With :math:`r = \mu/s` (eq. (11) of [1], [2]; [3], Sec. 3):

    .. math::

        \mathbb E = \mu\Phi(r) + s\varphi(r), \qquad
        \mathbb V = (\mu^2+s^2)\Phi(r) + \mu s\varphi(r) - \mathbb E^2 .

    The variance is evaluated as :math:`\mathbb V = s^2\Phi(r) - \mathbb E\,(\mathbb E - \mu)` with
    :math:`\mathbb E - \mu = s\varphi(r) - \mu\Phi(-r)` computed directly, which is algebraically equal but
    avoids cancelling :math:`\mu^2` against :math:`\mathbb E^2` when :math:`\mu \gg s`. Both tails come
    from one error function, :math:`\Phi(\pm r) = \tfrac12(1 \pm \operatorname{erf}(r/\sqrt2))`, and the density
    is evaluated as :math:`\varphi(r) = 2^{-\log_2(e)\, r^2/2 - \log_2\sqrt{2\pi}}` (``exp2``: on the CPU, ``exp`` of
    arguments that underflow, i.e. confident units, takes a slow path). The tails'
    absolute error of about one float ulp enters :math:`\mathbb V` multiplied by :math:`\sim r^2` where
    :math:`\operatorname{erf}` has not yet rounded to :math:`\pm 1` (:math:`2 \lesssim |r| \lesssim 6`). The tests
    bound the float32 variance error by :math:`24\epsilon\, s^2` (a relative error below ``3e-6``) against a
    float64 reference, over :math:`|r|` up to :math:`10^3` and :math:`s^2` from ``1e-8`` to ``1e4``. The input
    variance is floored at ``min_var`` (``1e-5``, as in Schmitt & Roth (2021), App. A).

    :param Tensor mean: :math:`\mu`.
    :param var: :math:`s^2`, same shape, or ``None`` for an exactly known input (then ``Moments(relu(mean), None)``).
    :param float min_var: the variance floor.

    >>> m = relu_moments(torch.tensor([0.0]), torch.tensor([1.0]))
    >>> torch.allclose(m.mean, torch.tensor([(2 * torch.pi) ** -0.5]))
    True
    """
    # Written for few activation-sized temporaries, because every fresh buffer is written to memory that is not in
    # the cache (and, once the allocator has handed the last pass's memory back to the operating system, page by
    # page through page faults): the in-place operations (trailing underscore) act only on fresh temporaries that
    # autograd has not saved, so this one function serves training and prediction, and ``del`` drops the others as
    # soon as they are used. exp2 rather than exp, because on the CPU exp of arguments that underflow (confident
    # units, |r| > 13) takes a slow path in MKL's vector math that exp2 does not.
    if var is None:  # an exactly known input (the Moments convention): the rectifier of its value
        return Moments(F.relu(mean), None)
    var = var.clamp_min(min_var)
    inv_std = var.rsqrt()
    std_pdf = var * inv_std  # s; times phi(r) below
    z = (mean * inv_std).mul_(_SQRT_HALF)  # r / sqrt(2)
    del inv_std
    std_pdf.mul_(torch.addcmul(z.new_full((), _LOG2_INV_SQRT_2PI), z, z, value=-_LOG2_E).exp2_())  # s phi(r)
    cdf2 = torch.erf(z).add_(1.0)  # 2 Phi(r); the factors 1/2 go into the addcmul's below (exact: a power of two)
    del z
    out_mean = torch.addcmul(std_pdf, mean, cdf2, value=0.5)  # mu Phi(r) + s phi(r)
    excess = std_pdf.addcmul_(mean, torch.rsub(cdf2, 2.0), value=-0.5)  # E - mu = s phi(r) - mu Phi(-r)
    out_var = excess.mul_(out_mean).neg_().addcmul_(var, cdf2, value=0.5)  # s^2 Phi(r) - E (E - mu)
    return Moments(out_mean, out_var.clamp_min_(0.0))


def taylor_moments(fn: Callable[[Tensor], Tensor], mean: Tensor, var: Tensor | None) -> Moments:
    r"""First-order Taylor moments of an element-wise function (eq. (12) of [1]).

    .. math::

        \mathbb E[f(Z)] \approx f(\mu), \qquad \mathbb V[f(Z)] \approx f'(\mu)^2 s^2 .

    :math:`f'(\mu)` comes from autograd (the gradient of :math:`\sum f(\mu)`), so ``fn`` must act
    element-wise; the result stays differentiable in ``mean`` (double backward) and ``var``.

    >>> m = taylor_moments(torch.tanh, torch.zeros(2), torch.full((2,), 0.5))
    >>> m.mean, m.var
    (tensor([0., 0.]), tensor([0.5000, 0.5000]))
    """
    if var is None:
        return Moments(fn(mean), None)
    outer_grad = torch.is_grad_enabled()
    with torch.enable_grad():
        point = mean if mean.requires_grad else mean.detach().requires_grad_(True)
        value = fn(point)
        (slope,) = torch.autograd.grad(value.sum(), point, create_graph=outer_grad and mean.requires_grad)
    if not outer_grad:
        value = value.detach()
    elif not mean.requires_grad:
        value = fn(mean)
    return Moments(value, slope.square() * var)


def gaussian_expected_log_likelihood(
    y: Tensor, loc: Tensor, loc_var: Tensor, log_var: Tensor, log_var_var: Tensor
) -> Tensor:
    r"""Expected heteroscedastic Gaussian log-likelihood under Gaussian network outputs.

    For :math:`\mu\sim\mathcal N(\bar\mu, v_\mu)` and an independent log-variance
    :math:`c\sim\mathcal N(\bar c, v_c)` (eq. (15) of Schmitt & Roth (2021), with the exponent corrected
    to :math:`v_c/2`, since :math:`\mathbb E[e^{-c}] = e^{-\bar c + v_c/2}`):

    .. math::

        \mathbb E[\log\mathcal N(y;\mu, e^{c})] = -\tfrac12\big(\log 2\pi + \bar c
            + e^{-\bar c + v_c/2}\,(v_\mu + (\bar\mu - y)^2)\big).

    :param Tensor y: targets. The other tensors broadcast with it.
    :returns: the expected log-likelihood, element-wise.

    >>> gaussian_expected_log_likelihood(torch.tensor(0.0), torch.tensor(0.0), torch.tensor(0.0),
    ...                                  torch.tensor(0.0), torch.tensor(0.0))
    tensor(-0.9189)
    """
    precision = torch.exp(log_var_var * 0.5 - log_var)
    return -0.5 * (_LOG_2PI + log_var + precision * (loc_var + (loc - y).square()))


def gaussian_predictive_variance(loc_var: Tensor, log_var: Tensor, log_var_var: Tensor) -> Tensor:
    r"""Variance of the Gaussian predictive :math:`v_\mu + e^{\bar c + v_c/2}` (Schmitt & Roth (2021), eq. (19)).

    >>> gaussian_predictive_variance(torch.tensor(1.0), torch.tensor(0.0), torch.tensor(0.0))
    tensor(2.)
    """
    return loc_var + torch.exp(log_var + 0.5 * log_var_var)
