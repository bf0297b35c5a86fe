# SPDX-License-Identifier: Apache-2.0
"""A plain multi-layer perceptron factory (private): the networks of the experiments, benchmarks and tests.

.. math::

    f(x) = W_L\\,\\phi(\\cdots \\phi(W_1 x + b_1) \\cdots) + b_L

with an elementwise activation :math:`\\phi` after every hidden layer and optional (inverted)
dropout after each hidden activation, so that the same network serves as a point estimate, an
MC-dropout network, a deep-ensemble member or the mean function of a Laplace approximation.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

#: Activation names accepted by :func:`make_mlp`.
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "leaky_relu": nn.LeakyReLU,
    "relu": nn.ReLU,
    "sigmoid": nn.Sigmoid,
    "silu": nn.SiLU,
    "softplus": nn.Softplus,
    "swish": nn.SiLU,
    "tanh": nn.Tanh,
}


def make_mlp(
    sizes: Sequence[int],
    activation: str | Callable[[], nn.Module] = "relu",
    dropout: float = 0.0,
    *,
    bias: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Sequential:
    """Build ``Linear -> activation [-> Dropout] -> ... -> Linear`` as an :class:`torch.nn.Sequential`.

    The output layer has no activation (it returns logits or, for heteroscedastic regression, a
    mean and a log-variance column). Dropout, when ``dropout > 0``, follows every hidden
    activation, as in Gal & Ghahramani [1].

    :param sizes: layer widths ``(in_dim, hidden_1, ..., out_dim)``; at least two entries.
    :param activation: a name from :data:`ACTIVATIONS` or a zero-argument module factory.
    :param float dropout: drop probability :math:`1-\\rho` in ``[0, 1)``.
    :param bool bias: whether the linear layers have biases.
    :param device: device of the parameters.
    :param dtype: dtype of the parameters.
    :returns: the network.

    **References**

    1. Y. Gal, Z. Ghahramani (2016), *Dropout as a Bayesian approximation: representing model
       uncertainty in deep learning*, ICML.

    >>> net = make_mlp([2, 50, 50, 2], activation="tanh", dropout=0.1)
    >>> net(torch.zeros(7, 2)).shape
    torch.Size([7, 2])
    >>> [type(m).__name__ for m in make_mlp([1, 8, 1])]
    ['Linear', 'ReLU', 'Linear']
    """
    sizes = list(sizes)
    if len(sizes) < 2:
        raise ValueError(f"sizes must have at least two entries (in_dim, out_dim), got {sizes}")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"sizes must be positive integers, got {sizes}")
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or a module factory, got {activation!r}")
        activation_factory = ACTIVATIONS[activation]
    elif callable(activation):
        activation_factory = activation
    else:
        raise TypeError(f"activation must be a string or a callable, got {type(activation).__name__}")
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")

    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(fan_in, fan_out, bias=bias, device=device, dtype=dtype))
        if i < len(sizes) - 2:
            layers.append(activation_factory())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)
