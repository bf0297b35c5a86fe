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
from typing import NamedTuple, cast

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


# ----------------------------------------------------------------------------------- argument checks (shapes only)
# Pure Python on ``.shape`` / ``.ndim``: no tensor data is read, so they cost no device synchronisation, and they turn
# torch's bare broadcast and matmul errors (or a silent broadcast) into a ValueError naming the argument.
def _check_tensor(name: str, value: object) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _check_broadcast(**tensors: object) -> None:
    shapes = {name: tuple(_check_tensor(name, t).shape) for name, t in tensors.items()}
    try:
        torch.broadcast_shapes(*shapes.values())
    except RuntimeError:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"{', '.join(shapes)} must broadcast with each other, got {listed}") from None


def _check_shape(name: str, value: object, shape: tuple[int, ...], expected: str) -> None:
    if tuple(_check_tensor(name, value).shape) != shape:
        raise ValueError(f"{name} must have shape {expected} = {shape}, got {tuple(cast(Tensor, value).shape)}")


def _check_var(mean: Tensor, var: object) -> None:
    if var is not None and tuple(_check_tensor("var", var).shape) != tuple(mean.shape):
        raise ValueError(f"var must have the shape of mean {tuple(mean.shape)} or be None, "
                         f"got {tuple(cast(Tensor, var).shape)}")


def _check_layer_args(mean: object, var: object, weight: object, bias: object, *, conv: bool, groups: int = 1
                      ) -> int:
    """Check the arguments shared by the dense / convolutional moment maps; return the input size (features or
    channels) that the per-input parameters must have."""
    weight = _check_tensor("weight", weight)
    mean = _check_tensor("mean", mean)
    if conv:
        if weight.ndim != 4:
            raise ValueError(f"weight must have shape (C_out, C_in / groups, kH, kW), got {tuple(weight.shape)}")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or weight.shape[0] % groups:
            raise ValueError(f"groups must be a positive int dividing C_out = weight.shape[0] = {weight.shape[0]}, "
                             f"got {groups!r}")
        size = weight.shape[1] * groups
        if mean.ndim not in (3, 4) or mean.shape[-3] != size:
            raise ValueError(f"mean must have shape (N, C_in, H, W) with C_in = weight.shape[1] * groups = {size}, "
                             f"got {tuple(mean.shape)}")
    else:
        if weight.ndim != 2:
            raise ValueError(f"weight must have shape (out, in), got {tuple(weight.shape)}")
        size = weight.shape[1]
        if mean.ndim < 1 or mean.shape[-1] != size:
            raise ValueError(f"mean must have shape (..., in) with in = weight.shape[1] = {size}, "
                             f"got {tuple(mean.shape)}")
    _check_var(mean, var)
    if bias is not None:
        _check_shape("bias", bias, (weight.shape[0],), "(out,) = (weight.shape[0],)")
    return size


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
    size = _check_layer_args(mean, var, weight, bias, conv=False)
    _check_shape("alpha", alpha, (size,), "(in,)")
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
    size = _check_layer_args(mean, var, weight, bias, conv=True, groups=groups)
    _check_shape("alpha", alpha, (size,), "(C_in,)")
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
    _check_layer_args(mean, var, weight, bias, conv=False)
    _check_shape("weight_var", weight_var, tuple(weight.shape), "weight.shape")
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
    _check_layer_args(mean, var, weight, bias, conv=True, groups=groups)
    _check_shape("weight_var", weight_var, tuple(weight.shape), "weight.shape")
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

    When a gradient is needed, the derivatives are the closed forms :math:`\partial\mathbb E/\partial\mu = \Phi(r)`,
    :math:`\partial\mathbb E/\partial s^2 = \varphi(r)/(2s)`, :math:`\partial\mathbb V/\partial\mu =
    2\mathbb E\,(1-\Phi(r))`, :math:`\partial\mathbb V/\partial s^2 = \Phi(r) - \mathbb E\,\varphi(r)/s` ([2]),
    evaluated by a hand-written backward from three saved terms instead of autograd through the dozen and a half
    operations of the forward pass; they equal autograd's to rounding, higher derivatives and :mod:`torch.func`
    included.

    :param Tensor mean: :math:`\mu`.
    :param var: :math:`s^2`, same shape, or ``None`` for an exactly known input (then ``Moments(relu(mean), None)``).
    :param float min_var: the variance floor.

    >>> m = relu_moments(torch.tensor([0.0]), torch.tensor([1.0]))
    >>> torch.allclose(m.mean, torch.tensor([(2 * torch.pi) ** -0.5]))
    True
    """
    _check_var(_check_tensor("mean", mean), var)
    if var is None:  # an exactly known input (the Moments convention): the rectifier of its value
        return Moments(F.relu(mean), None)
    if torch.is_grad_enabled() and (mean.requires_grad or var.requires_grad) and not torch.compiler.is_compiling():
        out_mean, out_var, *_ = _ReLUMoments.apply(mean, var, min_var)
        return Moments(out_mean, out_var)
    out_mean, out_var, *_ = _relu_moments_forward(mean, var, min_var, backward_terms=False)
    return Moments(out_mean, out_var.clamp_min_(0.0))


def _relu_moments_forward(mean: Tensor, var: Tensor, min_var: float, backward_terms: bool = True,
                          inplace: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    r"""The closed form of :func:`relu_moments` before the final clamp: :math:`(\mathbb E, \mathbb V, 2\Phi(r),
    \varphi(r)/s)`, the last two being what the hand-written backward of :class:`_ReLUMoments` needs (without
    ``backward_terms``, :math:`\varphi(r)/s` is not computed and is ``None``). ``inplace=False`` replaces the two
    in-place ``addcmul_`` by ``addcmul``, which :func:`torch.func.vmap` batches (the derivatives of the backward).

    Written for few activation-sized temporaries, because every fresh buffer is written to memory that is not in the
    cache (and, once the allocator has handed the last pass's memory back to the operating system, page by page
    through page faults): the in-place operations (trailing underscore) act only on fresh temporaries that autograd
    has not saved, so under ``torch.compile`` autograd can still trace it, and ``del`` drops the others as soon as
    they are used. exp2 rather than exp, because on the CPU exp of arguments that underflow (confident units,
    :math:`|r| > 13`) takes a slow path in MKL's vector math that exp2 does not.
    """
    var = var.clamp_min(min_var)
    inv_std = var.rsqrt()
    z = (mean * inv_std).mul_(_SQRT_HALF)  # r / sqrt(2)
    pdf = torch.addcmul(z.new_full((), _LOG2_INV_SQRT_2PI), z, z, value=-_LOG2_E).exp2_()  # phi(r)
    cdf2 = torch.erf(z).add_(1.0)  # 2 Phi(r); the factors 1/2 go into the addcmul's below (exact: a power of two)
    del z
    std_pdf = (var * inv_std).mul_(pdf)  # s phi(r)
    pdf_over_std = pdf * inv_std if backward_terms else None  # phi(r) / s
    del inv_std, pdf
    out_mean = torch.addcmul(std_pdf, mean, cdf2, value=0.5)  # mu Phi(r) + s phi(r)
    addcmul = Tensor.addcmul_ if inplace else torch.addcmul
    excess = addcmul(std_pdf, mean, torch.rsub(cdf2, 2.0), value=-0.5)  # E - mu = s phi(r) - mu Phi(-r)
    out_var = addcmul(excess.mul_(out_mean).neg_(), var, cdf2, value=0.5)  # s^2 Phi(r) - E (E - mu)
    return out_mean, out_var, cdf2, pdf_over_std


class _ReLUMoments(torch.autograd.Function):
    r""":func:`relu_moments` with a hand-written backward (Frey & Hinton (1999)), for training.

    With :math:`\Phi = \Phi(r)`, :math:`\varphi = \varphi(r)`, :math:`r = \mu/s` and the output moments
    :math:`\mathbb E, \mathbb V`, the derivatives of the closed form are

    .. math::

        \frac{\partial\mathbb E}{\partial\mu} = \Phi, \quad
        \frac{\partial\mathbb E}{\partial s^2} = \frac{\varphi}{2s}, \quad
        \frac{\partial\mathbb V}{\partial\mu} = 2\,\mathbb E\,(1 - \Phi), \quad
        \frac{\partial\mathbb V}{\partial s^2} = \Phi - \mathbb E\,\frac{\varphi}{s},

    so the vector-Jacobian product with output gradients :math:`(g_E, g_V)` is, with :math:`a = g_E - 2 g_V\mathbb E`,
    :math:`g_\mu = g_E - a\,(1 - \Phi)` and :math:`g_{s^2} = \tfrac12 (a\,\varphi/s + 2 g_V \Phi)`: about ten
    element-wise passes over the saved :math:`2\Phi`, :math:`\varphi/s` and :math:`\mathbb E`, where autograd
    differentiates the forward pass operation by operation, saving the operands of each. As autograd does for the
    clamps, :math:`g_{s^2}` is zero where :math:`s^2` was raised to the floor and :math:`g_V` where :math:`\mathbb V`
    rounded below zero. A backward that is itself differentiated (``create_graph=True``, e.g.
    :func:`torch.func.hessian`) and the forward mode (:meth:`jvp`) recompute the three terms from the inputs by
    differentiable operations, so higher derivatives are exact too.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(mean: Tensor, var: Tensor, min_var: float):
        out_mean, out_var, cdf2, pdf_over_std = _relu_moments_forward(mean, var, min_var)
        clamped = out_var < 0
        return out_mean, out_var.clamp_min_(0.0), cdf2, pdf_over_std, clamped

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        mean, var, min_var = inputs
        out_mean, _, cdf2, pdf_over_std, clamped = output
        ctx.min_var = min_var
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(cdf2, pdf_over_std, clamped)
        ctx.save_for_backward(mean, var, out_mean, cdf2, pdf_over_std, clamped)
        ctx.save_for_forward(mean, var)

    @staticmethod
    def jvp(ctx, tangent_mean: Tensor | None, tangent_var: Tensor | None, _):
        """Forward mode (``torch.func.jvp`` / ``jacfwd``): the Jacobian of the class docstring times the tangents,
        from terms recomputed by differentiable operations, so that the result can be differentiated again."""
        mean, var = ctx.saved_tensors
        out_mean, out_var, cdf2, terms = _relu_moments_forward(mean, var, ctx.min_var, inplace=False)
        pdf_over_std = cast(Tensor, terms)
        zero = torch.zeros_like(out_mean)
        d_mean, d_var = zero, zero
        if tangent_mean is not None:  # dE = Phi t_mu, dV = 2 E (1 - Phi) t_mu
            d_mean = d_mean + 0.5 * cdf2 * tangent_mean
            d_var = d_var + out_mean * (2.0 - cdf2) * tangent_mean
        if tangent_var is not None:  # dE = phi / (2 s) t_s2, dV = (Phi - E phi / s) t_s2, zero below the floor
            tangent_var = tangent_var.masked_fill(var < ctx.min_var, 0.0)
            d_mean = d_mean + 0.5 * pdf_over_std * tangent_var
            d_var = d_var + (0.5 * cdf2 - out_mean * pdf_over_std) * tangent_var
        return d_mean, d_var.masked_fill(out_var < 0, 0.0), None, None, None

    @staticmethod
    def backward(ctx, grad_mean: Tensor | None, grad_var: Tensor | None, *_):
        mean, var, out_mean, cdf2, pdf_over_std, clamped = ctx.saved_tensors
        if grad_mean is None and grad_var is None:
            return None, None, None
        if torch.is_grad_enabled():  # a backward to be differentiated (create_graph): its terms recomputed from the
            # inputs by differentiable operations (the saved ones are constants to autograd)
            out_mean, out_var, cdf2, pdf_over_std = _relu_moments_forward(mean, var, ctx.min_var, inplace=False)
            clamped = out_var < 0
        needs_mean, needs_var = ctx.needs_input_grad[:2]
        if grad_var is None:  # g_V = 0: a = g_E
            a = cast(Tensor, grad_mean)
            grad_mu = torch.mul(a, cdf2).mul_(0.5) if needs_mean else None  # g_E Phi
            grad_s2 = torch.mul(a, pdf_over_std).mul_(0.5) if needs_var else None
        else:
            grad_var = grad_var.masked_fill(clamped, 0.0)
            grad_var_mean = grad_var * out_mean  # g_V E
            a = (torch.neg(grad_var_mean).mul_(2.0) if grad_mean is None
                 else torch.add(grad_mean, grad_var_mean, alpha=-2.0))  # g_E - 2 g_V E
            # g_E - a (1 - Phi) = 2 g_V E + a Phi
            grad_mu = torch.addcmul(grad_var_mean, a, cdf2, value=0.25).mul_(2.0) if needs_mean else None
            # (a phi/s + g_V 2 Phi) / 2
            grad_s2 = torch.addcmul(torch.mul(a, pdf_over_std), grad_var, cdf2).mul_(0.5) if needs_var else None
        if grad_s2 is not None:
            grad_s2 = grad_s2.masked_fill_(var < ctx.min_var, 0.0)
        return grad_mu, grad_s2, None


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
    _check_var(_check_tensor("mean", mean), var)
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
    _check_broadcast(y=y, loc=loc, loc_var=loc_var, log_var=log_var, log_var_var=log_var_var)
    precision = torch.exp(log_var_var * 0.5 - log_var)
    return -0.5 * (_LOG_2PI + log_var + precision * (loc_var + (loc - y).square()))


def gaussian_predictive_variance(loc_var: Tensor, log_var: Tensor, log_var_var: Tensor) -> Tensor:
    r"""Variance of the Gaussian predictive :math:`v_\mu + e^{\bar c + v_c/2}` (Schmitt & Roth (2021), eq. (19)).

    >>> gaussian_predictive_variance(torch.tensor(1.0), torch.tensor(0.0), torch.tensor(0.0))
    tensor(2.)
    """
    _check_broadcast(loc_var=loc_var, log_var=log_var, log_var_var=log_var_var)
    return loc_var + torch.exp(log_var + 0.5 * log_var_var)
