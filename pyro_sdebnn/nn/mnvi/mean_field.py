# SPDX-License-Identifier: Apache-2.0
r"""Sampling-free mean-field Gaussian layers, the MFVI baseline of seed 002 (Table 2).

Every weight has its own variance, :math:`q(w_{ij}) = \mathcal N(m_{ij}, s_{ij})` with
:math:`s_{ij} = \operatorname{softplus}(\rho_{ij})`, so the layer has twice the parameters of its
deterministic twin and the variance path needs two extra matrix products (seed 002 eq. (8); [2]):

.. math::

    \mathbb E[z] = Mx + b, \qquad \mathbb V[z] = S(v + x\circ x) + (M\circ M)\,v .

The interface matches :class:`~pyro_sdebnn.nn.mnvi.MNLinear` / :class:`~pyro_sdebnn.nn.mnvi.MNConv2d`
(tensor input: deterministic layer; :class:`Moments` input: moment propagation), so the same
containers, :class:`~pyro_sdebnn.nn.mnvi.SamplingFreeBNN` and
:class:`~pyro_sdebnn.infer.SamplingFree_ELBO` apply. The bias is a point estimate.

**References**

1. J. Schmitt, S. Roth (2021). Sampling-free Variational Inference of Bayesian Neural Networks by
   Variance Backpropagation with Multiplicative Activation Noise. arXiv:2103.08497.
2. A. Wu et al. (2019). Deterministic Variational Inference for Robust Bayesian Neural Networks.
   ICLR. arXiv:1810.03958.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pyro.distributions import Normal
from torch import Tensor, nn
from torch.distributions import Distribution

from pyro_sdebnn.nn.mnvi._util import as_moments, check_features
from pyro_sdebnn.nn.mnvi.layers import BayesianLayer, MNConv2d, MNLinear
from pyro_sdebnn.ops.moments import Moments, mean_field_conv2d_moments, mean_field_linear_moments

__all__ = ["MFConv2d", "MFLinear"]

#: Default initial ``rho`` of the per-weight variances (seed 002 Table 4, LeNet: -10).
MF_RHO_INIT = -10.0


class _MeanFieldMixin:
    weight: nn.Parameter
    weight_rho: nn.Parameter

    @property
    def weight_var(self) -> Tensor:
        r"""Per-weight variances :math:`S = \operatorname{softplus}(\rho)`."""
        return F.softplus(self.weight_rho)

    @property
    def num_noise_parameters(self) -> int:
        return self.weight_rho.numel()

    def weight_distribution(self) -> Distribution:
        return Normal(self.weight, self.weight_var.sqrt())


class MFLinear(_MeanFieldMixin, BayesianLayer):
    r"""Dense layer with a mean-field Gaussian weight posterior and moment propagation.

    .. math::

        \mathbb E[z] = Mx + b, \qquad \mathbb V[z] = S(v + x\circ x) + (M\circ M)\,v .

    :param int in_features: input size.
    :param int out_features: output size.
    :param bool bias: whether to learn a (point-estimated) bias.
    :param float rho_init: initial per-weight ``rho`` (variance ``softplus(rho)``), default ``-10``.

    >>> layer = MFLinear(3, 2)
    >>> layer(Moments(torch.randn(5, 3), torch.ones(5, 3))).var.shape
    torch.Size([5, 2])
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        rho_init: float = MF_RHO_INIT,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        template = MNLinear(in_features, out_features, bias, device=device, dtype=dtype)
        self.in_features = in_features
        self.out_features = out_features
        self.weight = template.weight
        self.bias = template.bias
        self.weight_rho = nn.Parameter(torch.full_like(self.weight, float(rho_init)))

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        moments = as_moments(input)
        if moments is None:
            return F.linear(input, self.weight, self.bias)
        check_features(moments.mean, self.in_features, -1, "input.mean", "features")
        return mean_field_linear_moments(moments.mean, moments.var, self.weight, self.weight_var, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class MFConv2d(_MeanFieldMixin, BayesianLayer):
    r"""2-d convolution with a mean-field Gaussian weight posterior: :math:`\mathbb V[z] = S*(v+x^2) + (M\circ M)*v`.

    Arguments as :class:`torch.nn.Conv2d` (zero padding only), plus ``rho_init`` (default ``-10``).

    >>> conv = MFConv2d(1, 2, 3)
    >>> conv(Moments(torch.randn(1, 1, 5, 5), None)).var.shape
    torch.Size([1, 2, 3, 3])
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
        rho_init: float = MF_RHO_INIT,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        template = MNConv2d(
            in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, device=device, dtype=dtype
        )
        for name in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups"):
            setattr(self, name, getattr(template, name))
        self.weight = template.weight
        self.bias = template.bias
        self.weight_rho = nn.Parameter(torch.full_like(self.weight, float(rho_init)))

    def _conv_args(self) -> tuple:
        return (self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        moments = as_moments(input)
        if moments is None:
            return F.conv2d(input, self.weight, self.bias, *self._conv_args())
        check_features(moments.mean, self.in_channels, -3, "input.mean", "channels")
        return mean_field_conv2d_moments(
            moments.mean, moments.var, self.weight, self.weight_var, self.bias, *self._conv_args()
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, groups={self.groups}, bias={self.bias is not None}"
        )
