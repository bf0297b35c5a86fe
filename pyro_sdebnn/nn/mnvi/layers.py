# SPDX-License-Identifier: Apache-2.0
r"""Dense and convolutional layers with the weight posterior induced by multiplicative activation noise.

Multiplying every input activation :math:`x_j` of a layer by independent noise
:math:`\varepsilon_j\sim\mathcal N(1, \alpha_j)` is the same, in distribution, as drawing the weights
from (seed 002 eq. (5); METHODS.md §4)

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

1. J. Schmitt, S. Roth (2021). Sampling-free Variational Inference of Bayesian Neural Networks by
   Variance Backpropagation with Multiplicative Activation Noise. arXiv:2103.08497.
2. D. P. Kingma, T. Salimans, M. Welling (2015). Variational Dropout and the Local
   Reparameterization Trick. NeurIPS. arXiv:1506.02557.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributions import Distribution
from torch.nn.modules.utils import _pair

from pyro_sdebnn.nn.mnvi._util import as_moments, check_features
from pyro_sdebnn.ops.moments import Moments, multiplicative_conv2d_moments, multiplicative_linear_moments

__all__ = ["BayesianLayer", "MNConv2d", "MNLinear"]

#: Initial value of the noise parameter ``rho`` (seed 002 App. A): ``softplus(-3) ~= 0.049``.
RHO_INIT = -3.0


class BayesianLayer(nn.Module):
    """Base class of the layers whose ``weight`` has a Gaussian variational posterior.

    Subclasses implement :meth:`weight_distribution`; the bias and every other parameter are point
    estimates. :class:`~pyro_sdebnn.nn.mnvi.SamplingFreeBNN` finds these layers with
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


class _MultiplicativeMixin:
    rho: nn.Parameter
    weight: nn.Parameter

    @property
    def alpha(self) -> Tensor:
        r""":math:`\alpha = \operatorname{softplus}(\rho)`, the variance of the multiplicative noise."""
        return F.softplus(self.rho)

    @property
    def num_noise_parameters(self) -> int:
        return self.rho.numel()

    def _alpha_for_weight(self) -> Tensor:
        return self.alpha


class MNLinear(_MultiplicativeMixin, BayesianLayer):
    r"""Dense layer whose weight posterior is induced by multiplicative Gaussian input noise.

    .. math::

        w_{ij}\sim\mathcal N(m_{ij}, \alpha_j m_{ij}^2),\quad
        \mathbb E[z] = Mx + b,\quad \mathbb V[z] = (M\circ M)\big((1+\alpha)\circ v + \alpha\circ x^2\big).

    :param int in_features: input size.
    :param int out_features: output size.
    :param bool bias: whether to learn a (point-estimated) bias.
    :param float rho_init: initial ``rho`` (``alpha = softplus(rho)``), default ``-3``.

    Shapes: moments ``(batch, in_features) -> (batch, out_features)``; ``weight`` ``(out, in)``,
    ``rho`` ``(in,)``.

    >>> layer = MNLinear(3, 2)
    >>> out = layer(Moments(torch.randn(5, 3), None))
    >>> out.mean.shape, out.var.shape, layer(torch.randn(5, 3)).shape
    (torch.Size([5, 2]), torch.Size([5, 2]), torch.Size([5, 2]))
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        rho_init: float = RHO_INIT,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        factory = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.rho = nn.Parameter(torch.full((in_features,), float(rho_init), **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise ``weight`` and ``bias`` as :class:`torch.nn.Linear` does."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)

    def weight_distribution(self) -> Distribution:
        from pyro_sdebnn.distributions import MultiplicativeNormal

        return MultiplicativeNormal(self.weight, self.alpha, noise_dim=-1)

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        moments = as_moments(input)
        if moments is None:
            return F.linear(input, self.weight, self.bias)
        check_features(moments.mean, self.in_features, -1, "input.mean", "features")
        return multiplicative_linear_moments(moments.mean, moments.var, self.weight, self.alpha, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class MNConv2d(_MultiplicativeMixin, BayesianLayer):
    r"""2-d convolution whose weight posterior is induced by multiplicative noise per input channel.

    .. math::

        w_{oikl}\sim\mathcal N(m_{oikl}, \alpha_i m_{oikl}^2),\quad
        \mathbb E[z] = M * x + b,\quad \mathbb V[z] = (M\circ M) * \big((1+\alpha) v + \alpha x^2\big).

    Arguments as :class:`torch.nn.Conv2d` (zero padding only), plus ``rho_init``. ``rho`` has shape
    ``(in_channels,)``.

    >>> conv = MNConv2d(1, 4, 3, padding=1)
    >>> conv(Moments(torch.randn(2, 1, 8, 8), None)).var.shape
    torch.Size([2, 4, 8, 8])
    """

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
        *,
        rho_init: float = RHO_INIT,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels), ("groups", groups)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels and out_channels must be divisible by groups={groups}")
        factory = {"device": device, "dtype": dtype}
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.dilation = _pair(dilation)
        self.groups = groups
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size, **factory))
        self.bias = nn.Parameter(torch.empty(out_channels, **factory)) if bias else None
        self.rho = nn.Parameter(torch.full((in_channels,), float(rho_init), **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise ``weight`` and ``bias`` as :class:`torch.nn.Conv2d` does."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight[0].numel()
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(self.bias, -bound, bound)

    def _alpha_for_weight(self) -> Tensor:
        # weight (out, in/groups, kh, kw): input channel i of group g sits at index i - g * in/groups.
        alpha = self.alpha
        if self.groups == 1:
            return alpha.reshape(-1, 1, 1)
        per_group = self.in_channels // self.groups
        out_per_group = self.out_channels // self.groups
        a = alpha.reshape(self.groups, 1, per_group).expand(self.groups, out_per_group, per_group)
        return a.reshape(self.out_channels, per_group, 1, 1)

    def weight_distribution(self) -> Distribution:
        from pyro_sdebnn.distributions import MultiplicativeNormal

        if self.groups == 1:
            return MultiplicativeNormal(self.weight, self.alpha, noise_dim=-3)
        return MultiplicativeNormal(self.weight, self._alpha_for_weight(), noise_dim=None)

    def _conv_args(self) -> tuple:
        return (self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        moments = as_moments(input)
        if moments is None:
            return F.conv2d(input, self.weight, self.bias, *self._conv_args())
        check_features(moments.mean, self.in_channels, -3, "input.mean", "channels")
        return multiplicative_conv2d_moments(
            moments.mean, moments.var, self.weight, self.alpha, self.bias, *self._conv_args()
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, groups={self.groups}, bias={self.bias is not None}"
        )
