# SPDX-License-Identifier: Apache-2.0
r"""Sampling-free mean-field Gaussian layers, the MFVI baseline of [1] (Table 2).

Every weight has its own variance, :math:`q(w_{ij}) = \mathcal N(m_{ij}, s_{ij})` with
:math:`s_{ij} = \operatorname{softplus}(\rho_{ij})`, so the layer has twice the parameters of its
deterministic twin and the variance path needs two extra matrix products ([1], eq. (8); [2]):

.. math::

    \mathbb E[z] = Mx + b, \qquad \mathbb V[z] = S(v + x\circ x) + (M\circ M)\,v .

The interface matches :class:`~pyro_sdebnn.nn.mnvi.MNLinear` / :class:`~pyro_sdebnn.nn.mnvi.MNConv2d`
(tensor input: deterministic layer; :class:`Moments` input: moment propagation), so the same
containers, :class:`~pyro_sdebnn.infer.SamplingFreeBNN` and
:class:`~pyro_sdebnn.infer.SamplingFree_ELBO` apply. The bias is a point estimate.

**References**

1. Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.
   arXiv:2103.08497.
2. Anqi Wu, Sebastian Nowozin, Edward Meeds, Richard E. Turner, José Miguel Hernández-Lobato,
   Alexander L. Gaunt (2019). "Deterministic Variational Inference for Robust Bayesian Neural Networks".
   ICLR 2019. arXiv:1810.03958.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pyro.distributions import Normal
from torch import Tensor, nn
from torch.distributions import Distribution

from pyro_sdebnn.nn.mnvi.layers import _MomentConv2d, _MomentLinear
from pyro_sdebnn.ops.moments import Moments, mean_field_conv2d_moments, mean_field_linear_moments

__all__ = ["MFConv2d", "MFLinear"]

#: Default initial ``rho`` of the per-weight variances (Schmitt & Roth (2021), Table 4, LeNet: -10).
MF_RHO_INIT = -10.0


class _MeanFieldMixin:
    weight: Tensor
    weight_rho: nn.Parameter
    _rho_init = MF_RHO_INIT

    def _init_noise(self, rho_init: float) -> None:
        self.weight_rho = nn.Parameter(torch.full_like(self.weight, rho_init))

    @property
    def weight_var(self) -> Tensor:
        r"""Per-weight variances :math:`S = \operatorname{softplus}(\rho)`."""
        return F.softplus(self.weight_rho)

    @property
    def num_noise_parameters(self) -> int:
        return self.weight_rho.numel()

    def weight_distribution(self) -> Distribution:
        return Normal(self.weight, self.weight_var.sqrt())


class MFLinear(_MeanFieldMixin, _MomentLinear):
    r"""Dense layer with a mean-field Gaussian weight posterior and moment propagation.

    .. math::

        \mathbb E[z] = Mx + b, \qquad \mathbb V[z] = S(v + x\circ x) + (M\circ M)\,v .

    A :class:`torch.nn.Linear` (same arguments, initialisation and ``state_dict`` keys) plus ``weight_rho``.

    :param int in_features: input size.
    :param int out_features: output size.
    :param bool bias: whether to learn a (point-estimated) bias.
    :param float rho_init: initial per-weight ``rho`` (variance ``softplus(rho)``); ``None``: ``-10``.

    >>> layer = MFLinear(3, 2)
    >>> layer(Moments(torch.randn(5, 3), torch.ones(5, 3))).var.shape
    torch.Size([5, 2])
    """

    def _propagate(self, mean: Tensor, var: Tensor | None) -> Moments:
        return mean_field_linear_moments(mean, var, self.weight, self.weight_var, self.bias)


class MFConv2d(_MeanFieldMixin, _MomentConv2d):
    r"""2-d convolution with a mean-field Gaussian weight posterior: :math:`\mathbb V[z] = S*(v+x^2) + (M\circ M)*v`.

    A :class:`torch.nn.Conv2d` (same arguments, initialisation and ``state_dict`` keys; ``padding_mode``
    must be ``"zeros"``) plus ``weight_rho``, initialised to ``rho_init`` (``None``: ``-10``).

    >>> conv = MFConv2d(1, 2, 3)
    >>> conv(Moments(torch.randn(1, 1, 5, 5), None)).var.shape
    torch.Size([1, 2, 3, 3])
    """

    def _propagate(self, mean: Tensor, var: Tensor | None) -> Moments:
        return mean_field_conv2d_moments(mean, var, self.weight, self.weight_var, self.bias, *self._conv_args())
