# SPDX-License-Identifier: Apache-2.0
"""Networks used inside the SDE-BNN: the hidden-state fields f_h and the posterior drift correction.

- ``TimeMLPField`` and ``ConvField`` are *functional* fields
  :math:`f_h(h, t; w)`: they own no parameters; their weights are a flat vector ``w`` of length
  ``num_weights`` (the state of the weight SDE), with arbitrary leading sample dimensions so
  that many weight paths are integrated at once.
- :class:`DriftMLP` is the posterior drift correction :math:`\\mathrm{NN}(w, t; \\phi)` in
  :math:`f_q(w, t) = -\\theta w + \\mathrm{NN}(w, t; \\phi)` [1], an ordinary ``nn.Module`` with a
  zero-initialised last layer (training starts at q = p), optionally with a bottleneck
  ``D -> b -> hidden -> b -> D`` so that its parameter count grows linearly in the number of weights D
  with a small constant.

**References**

1. Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural
   Networks with Stochastic Differential Equations". AISTATS 2022, PMLR 151. arXiv:2102.06559 (Sec. 4).
2. Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2020). "Continuous-Depth Bayesian Neural
   Networks". ICML 2020 Workshop on Uncertainty and Robustness in Deep Learning.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = []

_ACTIVATIONS = {"tanh": torch.tanh, "swish": F.silu, "relu": F.relu, "softplus": F.softplus}


def _activation(name: str):
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {name!r}")
    return _ACTIVATIONS[name]


def _uniform(fan_in: int, n: int, generator: torch.Generator | None) -> Tensor:
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(n, generator=generator) * 2 - 1) * bound


class TimeMLPField:
    """Time-conditioned two-layer MLP field whose weights are a flat vector.

    .. math::

        f_h(h, t; w) = W_2\\, a(W_1 [h; t] + b_1) + b_2 ,
        \\qquad w = \\mathrm{vec}(W_1, b_1, W_2, b_2).

    :param int state_dim: dimension of ``h`` (input features plus augmentation).
    :param int hidden: width of the hidden layer.
    :param str activation: ``"tanh"``, ``"swish"``, ``"relu"`` or ``"softplus"``.

    Shapes: ``h`` is ``(..., N, state_dim)``, ``w`` is ``(..., num_weights)`` with the same leading
    dimensions (or broadcastable), the output has the shape of ``h``.

    >>> field = TimeMLPField(3, 8)
    >>> w = field.init_weights()
    >>> field(torch.tensor(0.5), torch.randn(5, 10, 3), w.expand(5, -1)).shape
    torch.Size([5, 10, 3])
    """

    def __init__(self, state_dim: int, hidden: int, activation: str = "tanh") -> None:
        if state_dim < 1 or hidden < 1:
            raise ValueError(f"state_dim and hidden must be positive, got {state_dim}, {hidden}")
        self.state_dim, self.hidden, self.activation = int(state_dim), int(hidden), activation
        self._act = _activation(activation)
        d, m = self.state_dim, self.hidden
        self._sizes = [(d + 1) * m, m, m * d, d]
        self.num_weights = sum(self._sizes)

    def init_weights(self, generator: torch.Generator | None = None) -> Tensor:
        """PyTorch-default (uniform fan-in) initial weights, shape ``(num_weights,)``."""
        d, m = self.state_dim, self.hidden
        return torch.cat([_uniform(d + 1, (d + 1) * m, generator), _uniform(d + 1, m, generator),
                          0.1 * _uniform(m, m * d, generator), torch.zeros(d)])

    def __call__(self, t: Tensor, h: Tensor, w: Tensor) -> Tensor:
        d, m = self.state_dim, self.hidden
        lead = w.shape[:-1]
        w1, b1, w2, b2 = torch.split(w, self._sizes, -1)
        w1 = w1.reshape(lead + (d + 1, m))
        time = torch.as_tensor(t, dtype=h.dtype, device=h.device).expand(h.shape[:-1] + (1,))
        z = self._act(torch.matmul(torch.cat([h, time], -1), w1) + b1.unsqueeze(-2))
        return torch.matmul(z, w2.reshape(lead + (m, d))) + b2.unsqueeze(-2)


class ConvField:
    """Time-conditioned conv field for images: strided conv down, tanh, transposed conv up.

    .. math::

        f_h(h, t; w) = \\mathrm{ConvT}_{W_2}\\big(\\tanh(\\mathrm{Conv}^{\\rm stride\\,2}_{W_1}([h; t]))\\big)

    The time enters as an extra constant input channel. Weights for ``S`` samples are applied with
    one grouped convolution (``groups=S``).

    :param int channels: channels of ``h``.
    :param int hidden_channels: channels after the strided convolution.
    :param int kernel_size: odd kernel size (default 3); padding keeps even spatial sizes.

    Shapes: ``h`` is ``(S, N, C, H, W)`` with even ``H, W``; ``w`` is ``(S, num_weights)``.

    >>> field = ConvField(1, 4)
    >>> w = field.init_weights().expand(2, -1)
    >>> field(torch.tensor(0.0), torch.randn(2, 3, 1, 8, 8), w).shape
    torch.Size([2, 3, 1, 8, 8])
    """

    def __init__(self, channels: int, hidden_channels: int, kernel_size: int = 3) -> None:
        if kernel_size % 2 != 1:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        self.channels, self.hidden_channels, self.kernel_size = int(channels), int(hidden_channels), kernel_size
        c, m, k = self.channels, self.hidden_channels, kernel_size
        self._sizes = [m * (c + 1) * k * k, m, m * c * k * k, c]
        self.num_weights = sum(self._sizes)

    def init_weights(self, generator: torch.Generator | None = None) -> Tensor:
        """Uniform fan-in initial weights, shape ``(num_weights,)``."""
        c, m, k = self.channels, self.hidden_channels, self.kernel_size
        return torch.cat([_uniform((c + 1) * k * k, self._sizes[0], generator), torch.zeros(m),
                          0.1 * _uniform(m * k * k, self._sizes[2], generator), torch.zeros(c)])

    def __call__(self, t: Tensor, h: Tensor, w: Tensor) -> Tensor:
        c, m, k = self.channels, self.hidden_channels, self.kernel_size
        S, N = h.shape[:2]
        w = w.expand(S, w.shape[-1])
        w1, b1, w2, b2 = torch.split(w, self._sizes, -1)
        time = torch.as_tensor(t, dtype=h.dtype, device=h.device).expand(h.shape[:2] + (1,) + h.shape[3:])
        x = torch.cat([h, time], 2).transpose(0, 1).reshape(N, S * (c + 1), *h.shape[3:])
        z = torch.tanh(F.conv2d(x, w1.reshape(S * m, c + 1, k, k), b1.reshape(-1), stride=2, padding=k // 2,
                                groups=S))
        out = F.conv_transpose2d(z, w2.reshape(S * m, c, k, k), b2.reshape(-1), stride=2, padding=k // 2,
                                 output_padding=1, groups=S)
        return out.reshape(N, S, c, *h.shape[3:]).transpose(0, 1)


class DriftMLP(nn.Module):
    """Posterior drift correction :math:`\\mathrm{NN}(w, t; \\phi)` with a zero-initialised last layer.

    .. math::

        \\mathrm{NN}(w, t) = L_{\\rm out}\\big(a(\\dots a(L_1([P w; t]))\\dots)\\big), \\qquad L_{\\rm out} = 0
        \\text{ at initialisation},

    where :math:`P` is the identity, or a ``D -> bottleneck`` linear map when ``bottleneck`` is set
    (then :math:`L_{\\rm out}` maps ``hidden -> bottleneck -> D``), so the parameter count is
    :math:`O(D \\cdot \\text{bottleneck})`.

    :param int dim: D, the number of weights.
    :param int hidden: width of the hidden layers.
    :param int num_layers: number of hidden layers (default 2, as the 2x64 swish drift nets of
        Xu et al. (2020) [2]).
    :param int bottleneck: optional bottleneck width.
    :param str activation: default ``"swish"``.

    >>> net = DriftMLP(5, hidden=16)
    >>> net(torch.tensor(0.3), torch.randn(4, 5)).abs().max()
    tensor(0., grad_fn=<MaxBackward1>)
    """

    def __init__(self, dim: int, hidden: int = 64, num_layers: int = 2, bottleneck: int | None = None,
                 activation: str = "swish") -> None:
        super().__init__()
        if dim < 1 or hidden < 1 or num_layers < 1:
            raise ValueError(f"dim, hidden and num_layers must be positive, got {dim}, {hidden}, {num_layers}")
        if bottleneck is not None and bottleneck < 1:
            raise ValueError(f"bottleneck must be a positive int or None, got {bottleneck}")
        self.dim = int(dim)
        self._act = _activation(activation)
        self.encode = nn.Linear(dim, bottleneck) if bottleneck else None
        width_in = (bottleneck or dim) + 1
        layers = []
        for _ in range(num_layers):
            layers.append(nn.Linear(width_in, hidden))
            width_in = hidden
        self.layers = nn.ModuleList(layers)
        self.out: nn.Module
        if bottleneck:
            first, last = nn.Linear(hidden, bottleneck), nn.Linear(bottleneck, dim)
            self.out = nn.Sequential(first, last)
        else:
            last = nn.Linear(hidden, dim)
            self.out = last
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, t: Tensor, w: Tensor) -> Tensor:
        """:math:`\\mathrm{NN}(w, t)` for weights ``w`` of shape ``(..., D)`` at the scalar time ``t``."""
        x = self.encode(w) if self.encode is not None else w
        time = torch.as_tensor(t, dtype=w.dtype, device=w.device).expand(x.shape[:-1] + (1,))
        x = torch.cat([x, time], -1)
        for layer in self.layers:
            x = self._act(layer(x))
        return self.out(x)
