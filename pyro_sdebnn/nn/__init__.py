# SPDX-License-Identifier: Apache-2.0
"""Network building blocks: the continuous-depth SDE-BNN, its ODE-Net / ResNet baselines and drift networks.

- :class:`SDEBNN`, :class:`MultiScaleSDEBNN` -- hidden units follow an ODE driven by an SDE weight path.
- :class:`ODENet`, :class:`ResNet` -- the same network with constant / per-block weights (the baselines of
  Table 1 in Xu et al. (2022) [1]); their shared base (model, guide, predict) is
  :class:`~pyro_sdebnn.nn.continuous_depth.ContinuousDepthNet`.
- :class:`~pyro_sdebnn.nn.sde_drift.DriftMLP`, ``TimeMLPField``, ``ConvField`` -- the drift networks of the weight
  SDE and the hidden-state fields that these networks and :class:`~pyro_sdebnn.infer.NeuralSDEGuide` build.
- :mod:`pyro_sdebnn.nn.mnvi` -- moment-propagating layers for sampling-free VI (``MNLinear``, ``to_mnvi``, ...).

**References**

1. Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural
   Networks with Stochastic Differential Equations". AISTATS 2022, PMLR 151. arXiv:2102.06559.
"""

from pyro_sdebnn.nn.sdebnn import SDEBNN, MultiScaleSDEBNN
from pyro_sdebnn.nn.ode_net import ODENet, ResNet

__all__ = [
    "MultiScaleSDEBNN",
    "ODENet",
    "ResNet",
    "SDEBNN",
]
