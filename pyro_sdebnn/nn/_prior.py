# SPDX-License-Identifier: Apache-2.0
"""A zero-mean Gaussian weight prior for :class:`~pyro.nn.PyroSample` that follows its module's device and dtype."""

from __future__ import annotations

from typing import Sequence

import pyro.distributions as dist
from torch import nn


class ZeroMeanNormalPrior:
    """The prior :math:`\\mathcal N(0, \\text{scale}^2)` on a tensor of ``shape``, for a :class:`~pyro.nn.PyroSample`.

    Pyro calls it with the module that holds the sample site and it builds the distribution there, on the device and
    dtype of the module's ``_prior_zero`` buffer (a scalar zero, registered with ``persistent=False`` so that it stays
    out of ``state_dict``). A distribution made once keeps the tensors of the device it was made on, so after
    ``model.to("cuda")`` its draws would stay on the CPU; this one follows the module.
    """

    def __init__(self, scale: float, shape: Sequence[int]) -> None:
        self.scale = float(scale)
        self.shape = tuple(shape)

    def __call__(self, module: nn.Module) -> dist.TorchDistribution:
        zero = module.get_buffer("_prior_zero")
        return dist.Normal(zero, self.scale).expand(self.shape).to_event(len(self.shape))
