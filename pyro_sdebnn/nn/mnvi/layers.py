# SPDX-License-Identifier: Apache-2.0
r"""Dense and convolutional layers with the weight posterior induced by multiplicative activation noise.

Multiplying every input activation :math:`x_j` of a layer by independent noise
:math:`\varepsilon_j\sim\mathcal N(1, \alpha_j)` is the same, in distribution, as drawing the weights
from ([1], eq. (5))

.. math::

    q(w_{ij}) = \mathcal N(m_{ij}, \alpha_j m_{ij}^2), \qquad \alpha_j = \operatorname{softplus}(\rho_j),

so a layer with ``in`` inputs adds only ``in`` parameters ``rho`` (one per input *channel* for a
convolution) to its deterministic twin. The weight means are stored under the deterministic name
``weight``, so ``state_dict`` keys line up with ``torch.nn.Linear`` / ``torch.nn.Conv2d``.

Each layer has two forward modes, chosen by the input type:

- ``layer(Moments(mean, var)) -> Moments``: sampling-free moment propagation (eq. (9) of [1]).
- ``layer(tensor) -> tensor``: the ordinary deterministic layer with weights ``weight``; run it under
  :func:`torch.func.functional_call` with sampled weights for Monte Carlo (e.g. ``Trace_ELBO``).

The bias is a point estimate: the activation noise multiplies the inputs, not the bias.

**References**

1. Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.
   arXiv:2103.08497.
2. Diederik P. Kingma, Tim Salimans, Max Welling (2015). "Variational Dropout and the Local
   Reparameterization Trick". NeurIPS 2015. arXiv:1506.02557.
"""

from __future__ import annotations

import math
import numbers
from typing import cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributions import Distribution

from pyro_sdebnn.distributions import MultiplicativeNormal
from pyro_sdebnn.nn.mnvi._moment_inputs import as_moments, check_features
from pyro_sdebnn.ops.moments import Moments, multiplicative_conv2d_moments, multiplicative_linear_moments

__all__ = ["MNConv2d", "MNLinear"]

#: Initial value of the noise parameter ``rho`` (Schmitt & Roth (2021), App. A): ``softplus(-3) ~= 0.049``.
RHO_INIT = -3.0


class BayesianLayer(nn.Module):
    """Base class of the layers whose ``weight`` has a Gaussian variational posterior.

    Subclasses implement :meth:`weight_distribution`; the bias and every other parameter are point
    estimates. :class:`~pyro_sdebnn.infer.SamplingFreeBNN` finds these layers with
    ``isinstance`` and turns each ``weight`` into one Pyro sample site.

    >>> layer = MNLinear(3, 2)
    >>> isinstance(layer, BayesianLayer), layer.weight_distribution().batch_shape, layer.num_noise_parameters
    (True, torch.Size([2, 3]), 3)
    """

    weight: Tensor

    def weight_distribution(self) -> Distribution:
        """The variational posterior of ``weight`` (batch shape ``weight.shape``)."""
        raise NotImplementedError

    @property
    def num_noise_parameters(self) -> int:
        """Number of parameters added to the deterministic layer."""
        raise NotImplementedError


def _rho_init(value: float | None, default: float) -> float:
    """``value`` (``None``: ``default``) as a finite float: a NaN or infinite ``rho`` gives NaN or infinite noise."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Tensor)):
        raise TypeError(f"rho_init must be a real number or None, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"rho_init must be finite, got {value}")
    return value


def _check_positive_ints(**values: int) -> None:
    # torch accepts e.g. nn.Linear(0, 2); a Bayesian layer without inputs or outputs is a mistake.
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


class _MomentLayer(BayesianLayer):
    """The forward of the Bayesian dense and convolutional layers: the torch layer on a tensor, else
    :meth:`_propagate` on :class:`Moments`.

    A subclass names its input size (``_features``, its dimension ``_feature_dim``), sets its default noise
    parameter ``_rho_init`` and implements :meth:`_init_noise`, :meth:`_propagate` and :meth:`weight_distribution`.
    """

    _features: str
    _feature_dim: int
    _rho_init: float

    def _init_noise(self, rho_init: float) -> None:
        raise NotImplementedError

    def _propagate(self, mean: Tensor, var: Tensor | None) -> Moments:
        raise NotImplementedError

    @overload
    def forward(self, input: Tensor) -> Tensor: ...

    @overload
    def forward(self, input: Moments) -> Moments: ...

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        moments = as_moments(input)
        if moments is None:  # as_moments returns None for a plain tensor only
            return super().forward(cast(Tensor, input))
        what = "features" if self._feature_dim == -1 else "channels"
        check_features(moments.mean, getattr(self, self._features), self._feature_dim, "input.mean", what)
        return self._propagate(moments.mean, moments.var)


class _MomentLinear(_MomentLayer, nn.Linear):
    """:class:`torch.nn.Linear` (tensor input) that propagates :class:`Moments`."""

    _features, _feature_dim = "in_features", -1

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        rho_init: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        _check_positive_ints(in_features=in_features, out_features=out_features)
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._init_noise(_rho_init(rho_init, self._rho_init))


class _MomentConv2d(_MomentLayer, nn.Conv2d):
    """:class:`torch.nn.Conv2d` (tensor input, zero padding only) that propagates :class:`Moments`."""

    _features, _feature_dim = "in_channels", -3

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        *,
        rho_init: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        _check_positive_ints(in_channels=in_channels, out_channels=out_channels, groups=groups)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels and out_channels must be divisible by groups={groups}")
        if padding_mode != "zeros":
            raise ValueError(
                f"padding_mode must be 'zeros' (the variance path pads with zeros), got {padding_mode!r}"
            )
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, "zeros",
            device=device, dtype=dtype,
        )
        self._init_noise(_rho_init(rho_init, self._rho_init))

    def _conv_args(self) -> tuple:
        return (self.stride, self.padding, self.dilation, self.groups)


class _MultiplicativeMixin:
    rho: nn.Parameter
    weight: Tensor
    _features: str
    _rho_init = RHO_INIT

    def _init_noise(self, rho_init: float) -> None:
        self.rho = nn.Parameter(self.weight.new_full((getattr(self, self._features),), rho_init))

    @property
    def alpha(self) -> Tensor:
        r""":math:`\alpha = \operatorname{softplus}(\rho)`, the variance of the multiplicative noise."""
        return F.softplus(self.rho)

    @property
    def num_noise_parameters(self) -> int:
        return self.rho.numel()


class MNLinear(_MultiplicativeMixin, _MomentLinear):
    r"""Dense layer whose weight posterior is induced by multiplicative Gaussian input noise.

    .. math::

        w_{ij}\sim\mathcal N(m_{ij}, \alpha_j m_{ij}^2),\quad
        \mathbb E[z] = Mx + b,\quad \mathbb V[z] = (M\circ M)\big((1+\alpha)\circ v + \alpha\circ x^2\big).

    A :class:`torch.nn.Linear` (same arguments, initialisation and ``state_dict`` keys) plus ``rho``.

    :param int in_features: input size.
    :param int out_features: output size.
    :param bool bias: whether to learn a (point-estimated) bias.
    :param float rho_init: initial ``rho`` (``alpha = softplus(rho)``); ``None``: ``-3``.

    Shapes: moments ``(batch, in_features) -> (batch, out_features)``; ``weight`` ``(out, in)``,
    ``rho`` ``(in,)``.

    >>> layer = MNLinear(3, 2)
    >>> out = layer(Moments(torch.randn(5, 3), None))
    >>> out.mean.shape, out.var.shape, layer(torch.randn(5, 3)).shape
    (torch.Size([5, 2]), torch.Size([5, 2]), torch.Size([5, 2]))
    """

    def weight_distribution(self) -> Distribution:
        return MultiplicativeNormal(self.weight, self.alpha, noise_dim=-1)

    def _propagate(self, mean: Tensor, var: Tensor | None) -> Moments:
        return multiplicative_linear_moments(mean, var, self.weight, self.alpha, self.bias)


class MNConv2d(_MultiplicativeMixin, _MomentConv2d):
    r"""2-d convolution whose weight posterior is induced by multiplicative noise per input channel.

    .. math::

        w_{oikl}\sim\mathcal N(m_{oikl}, \alpha_i m_{oikl}^2),\quad
        \mathbb E[z] = M * x + b,\quad \mathbb V[z] = (M\circ M) * \big((1+\alpha) v + \alpha x^2\big).

    A :class:`torch.nn.Conv2d` (same arguments, initialisation and ``state_dict`` keys; ``padding_mode``
    must be ``"zeros"``) plus ``rho`` of shape ``(in_channels,)``, initialised to ``rho_init`` (``None``: ``-3``).

    >>> conv = MNConv2d(1, 4, 3, padding=1)
    >>> conv(Moments(torch.randn(2, 1, 8, 8), None)).var.shape
    torch.Size([2, 4, 8, 8])
    """

    def _grouped_alpha(self) -> Tensor:
        # weight (out, in/groups, kh, kw): input channel i of group g sits at index i - g * in/groups.
        per_group = self.in_channels // self.groups
        out_per_group = self.out_channels // self.groups
        alpha = self.alpha.reshape(self.groups, 1, per_group).expand(self.groups, out_per_group, per_group)
        return alpha.reshape(self.out_channels, per_group, 1, 1)

    def weight_distribution(self) -> Distribution:
        if self.groups == 1:
            return MultiplicativeNormal(self.weight, self.alpha, noise_dim=-3)
        return MultiplicativeNormal(self.weight, self._grouped_alpha(), noise_dim=None)

    def _propagate(self, mean: Tensor, var: Tensor | None) -> Moments:
        return multiplicative_conv2d_moments(mean, var, self.weight, self.alpha, self.bias, *self._conv_args())
