# SPDX-License-Identifier: Apache-2.0
"""The plain-PyTorch training loop of the network baselines (``infer.map_training.train_network``)."""

import pytest
import torch

from pyro_sdebnn.infer.map_training import train_network
from pyro_sdebnn.nn._mlp import make_mlp


def _blobs(n=64):
    torch.manual_seed(0)
    y = torch.arange(n) % 2
    x = torch.randn(n, 2) * 0.3 + (2.0 * y - 1.0).unsqueeze(-1)
    return x, y


def test_training_detects_nan():
    x, y = _blobs()
    net = make_mlp([2, 4, 2])
    with torch.no_grad():
        net[0].weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="loss"):
        train_network(net, x, y, "categorical", num_epochs=1)

