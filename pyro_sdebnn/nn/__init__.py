# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.nn"""

__all__: list[str] = []

from pyro_sdebnn.nn.mlp import ACTIVATIONS, make_mlp  # noqa: E402

__all__ += ["ACTIVATIONS", "make_mlp"]
from pyro_sdebnn.nn.sde_drift import ConvField, DriftMLP, TimeMLPField  # noqa: E402
__all__ += ["ConvField", "DriftMLP", "TimeMLPField"]
from pyro_sdebnn.nn.sdebnn import LIKELIHOODS, SDEBNN, MultiScaleSDEBNN  # noqa: E402
__all__ += ["LIKELIHOODS", "MultiScaleSDEBNN", "SDEBNN"]
from pyro_sdebnn.nn.ode_net import ODENet, ResNet  # noqa: E402
__all__ += ["ODENet", "ResNet"]
from pyro_sdebnn.nn import mnvi  # noqa: E402
from pyro_sdebnn.nn.mnvi import (  # noqa: E402
    MFConv2d, MFLinear, MNConv2d, MNLinear, MNReLU, MNResidualBlock, MNSequential, Moments, SamplingFreeBNN, to_mnvi)
__all__ += ["MFConv2d", "MFLinear", "MNConv2d", "MNLinear", "MNReLU", "MNResidualBlock", "MNSequential", "Moments",
            "SamplingFreeBNN", "mnvi", "to_mnvi"]
__all__[:] = sorted(set(__all__))
