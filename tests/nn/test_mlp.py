# SPDX-License-Identifier: Apache-2.0
"""The MLP factory shared by the baselines."""

import pytest
import torch
from torch import nn

from pyro_sdebnn.nn._mlp import ACTIVATIONS, make_mlp


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_layers_and_shapes(activation):
    net = make_mlp([3, 5, 4, 2], activation, dropout=0.2)
    kinds = [type(m) for m in net]
    assert kinds[0] is nn.Linear and kinds[-1] is nn.Linear  # no activation after the output layer
    assert kinds.count(nn.Linear) == 3 and kinds.count(nn.Dropout) == 2
    assert isinstance(net[1], ACTIVATIONS[activation])
    assert net(torch.zeros(6, 3)).shape == (6, 2)


def test_dtype_device_and_custom_activation():
    net = make_mlp([2, 4, 1], nn.Hardtanh, dtype=torch.float64, bias=False)
    assert all(p.dtype == torch.float64 for p in net.parameters())
    assert isinstance(net[1], nn.Hardtanh) and net[0].bias is None


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(sizes=[3]), ValueError, "at least two"),
        (dict(sizes=[3, 0, 1]), ValueError, "positive integers"),
        (dict(sizes=[3, 2.5, 1]), ValueError, "positive integers"),
        (dict(sizes=[3, 1], activation="swoosh"), ValueError, "activation"),
        (dict(sizes=[3, 1], activation=3), TypeError, "activation"),
        (dict(sizes=[3, 1], dropout=1.0), ValueError, "dropout"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        make_mlp(**kwargs)
