# SPDX-License-Identifier: Apache-2.0
"""Network building blocks: the continuous-depth SDE-BNN and its baselines, MNVI layers, MLPs.

- :class:`SDEBNN`, :class:`MultiScaleSDEBNN` -- hidden units follow an ODE driven by an SDE weight path.
- :class:`ODENet`, :class:`ResNet` -- the same network with constant / per-block weights (the baselines of
  Table 1 in Xu et al. (2022) [1]).
- :mod:`~pyro_sdebnn.nn.mnvi` -- moment-propagating layers for sampling-free VI (``MNLinear``, ``to_mnvi``, ...).
- :func:`make_mlp` -- a plain MLP factory used by the baselines.

**References**

1. Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural
   Networks with Stochastic Differential Equations". AISTATS 2022, PMLR 151. arXiv:2102.06559.
"""

from pyro_sdebnn.nn.mlp import ACTIVATIONS, make_mlp
from pyro_sdebnn.nn.sde_drift import ConvField, DriftMLP, TimeMLPField
from pyro_sdebnn.nn.continuous_depth import ContinuousDepthNet
from pyro_sdebnn.nn.sdebnn import LIKELIHOODS, SDEBNN, MultiScaleSDEBNN
from pyro_sdebnn.nn.ode_net import ODENet, ResNet
from pyro_sdebnn.nn import mnvi
from pyro_sdebnn.nn.mnvi import (
    MFConv2d,
    MFLinear,
    MNConv2d,
    MNLinear,
    MNReLU,
    MNResidualBlock,
    MNSequential,
    Moments,
    SamplingFreeBNN,
    to_mnvi,
)

__all__ = [
    "ACTIVATIONS",
    "ContinuousDepthNet",
    "ConvField",
    "DriftMLP",
    "LIKELIHOODS",
    "MFConv2d",
    "MFLinear",
    "MNConv2d",
    "MNLinear",
    "MNReLU",
    "MNResidualBlock",
    "MNSequential",
    "Moments",
    "MultiScaleSDEBNN",
    "ODENet",
    "ResNet",
    "SDEBNN",
    "SamplingFreeBNN",
    "TimeMLPField",
    "make_mlp",
    "mnvi",
    "to_mnvi",
]
