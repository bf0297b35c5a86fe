# SPDX-License-Identifier: Apache-2.0
"""Measurement-point samplers for the functional SG-MCMC kernels.

A set of measurement points mixes training inputs with points drawn uniformly from a box around them, so that a
functional prior evaluated there also acts away from the data, as in [1] and in functional variational BNNs [2].

**References**

[1] `Functional Stochastic Gradient MCMC for Bayesian Neural Networks`,
    Mengjing Wu, Junyu Xuan, Jie Lu. arXiv:2409.16632, 2024.

[2] `Functional Variational Bayesian Neural Networks`,
    Shengyang Sun, Guodong Zhang, Jiaxin Shi, Roger Grosse. ICLR 2019.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["MeasurementPoints"]


class MeasurementPoints:
    """Measurement points :math:`X_M`: ``num_data`` training inputs plus ``num_box`` uniform points in a box.

    The box is the coordinate-wise range of the training inputs widened by ``margin`` times that range on each
    side, so the functional prior also acts where there is no data (which is what gives the extrapolation
    uncertainty). With ``redraw=True`` (default) every call draws a fresh set; with ``redraw=False`` one set is
    drawn at construction and returned every time (the kernels then cache its Cholesky factor).

    :param Tensor inputs: training inputs ``(N,)``, ``(N, d)`` or ``(N, ...)`` (e.g. images).
    :param int num_data: training inputs per set (drawn without replacement; all of them if ``>= N``).
    :param int num_box: uniform box points per set.
    :param float margin: relative widening of the box on each side.
    :param bool redraw: draw new sets (``False``: one fixed set).
    :param int redraw_every: with ``redraw``, keep each set for this many calls (default 1: a new set every step).
        The kernels factorise the kernel matrix once per set, so ``redraw_every > 1`` amortises the
        :math:`O(M^3)` Cholesky factorisation (a deviation from Wu, Xuan and Lu (2024), who draw a new set every
        step).
    :param int prefetch: with ``redraw``, the fSGLD/fSGHMC kernels draw this many independent sets at once
        (:meth:`draw_sets`) and evaluate and factorise their kernel matrices in one batched call, then use one
        set per ``redraw_every`` steps. The sets do not depend on the chain, so this changes nothing but the
        cost: per-call overheads of the draw, the kernel evaluation and the factorisation are paid once per
        ``prefetch`` sets instead of once per step. Default ``None``: 64, fewer where the batch of
        ``M x M`` float64 factors would exceed 8 MiB (16 sets at M = 256, one at M >= 1024).
    :param torch.Generator generator: optional generator (on the inputs' device) for reproducible sets.

    >>> x = torch.linspace(-1.0, 1.0, 10)
    >>> sampler = MeasurementPoints(x, num_data=4, num_box=3, margin=0.5)
    >>> xm = sampler()
    >>> xm.shape, bool(xm.min() >= -2.0), bool(xm.max() <= 2.0)
    (torch.Size([7]), True, True)
    """

    def __init__(
        self,
        inputs: Tensor,
        num_data: int = 40,
        num_box: int = 40,
        *,
        margin: float = 0.5,
        redraw: bool = True,
        redraw_every: int = 1,
        prefetch: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
    ) -> None:
        if not isinstance(inputs, Tensor) or inputs.dim() < 1 or inputs.shape[0] < 1:
            raise ValueError("inputs must be a tensor of shape (N, ...) with N >= 1")
        for name, value in (("num_data", num_data), ("num_box", num_box)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if num_data + num_box < 1:
            raise ValueError("num_data + num_box must be at least 1")
        if isinstance(redraw_every, bool) or not isinstance(redraw_every, int) or redraw_every < 1:
            raise ValueError(f"redraw_every must be a positive int, got {redraw_every!r}")
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1):
            raise ValueError(f"prefetch must be a positive int or None, got {prefetch!r}")
        if not margin >= 0:
            raise ValueError(f"margin must be non-negative, got {margin!r}")
        self.inputs = inputs
        self.num_data = min(num_data, inputs.shape[0])
        self.num_box = num_box
        self.margin = float(margin)
        self.redraw = bool(redraw)
        self.redraw_every = redraw_every
        self.prefetch = prefetch if prefetch is not None else max(1, min(64, 2**20 // self.num_points**2))
        self.generator = generator
        self._calls = 0
        self._current: Optional[Tensor] = None
        low, high = inputs.min(0).values, inputs.max(0).values
        width = high - low
        self.low, self.high = low - self.margin * width, high + self.margin * width
        self._fixed = None if self.redraw else self.draw()

    @property
    def num_points(self) -> int:
        """:math:`M`, the number of points per set."""
        return self.num_data + self.num_box

    def draw(self) -> Tensor:
        """A fresh set of measurement points ``(M, ...)``."""
        return self.draw_sets(1)[0]

    def draw_sets(self, count: int, generator: Optional[torch.Generator] = None) -> Tensor:
        """``count`` independent fresh sets ``(count, M, ...)`` (training inputs drawn without replacement
        within each set), from ``generator`` (default: the sampler's).

        >>> MeasurementPoints(torch.arange(10.0), num_data=3, num_box=2).draw_sets(4).shape
        torch.Size([4, 5])
        """
        return self.sets_from_uniforms(*self.draw_uniforms(count, generator))

    def draw_uniforms(self, count: int, generator: Optional[torch.Generator] = None) -> tuple[Tensor, Tensor]:
        """The random numbers behind :meth:`draw_sets`: ``count x N`` keys (each set takes the training inputs
        with the ``num_data`` largest keys: a uniform draw without replacement) and ``(count, num_box, ...)``
        uniforms for the box points (empty tensors for a part that is not used)."""
        x, generator = self.inputs, self.generator if generator is None else generator
        num_keys = x.shape[0] if self.num_data else 0
        keys = torch.rand(count, num_keys, generator=generator, device=x.device) if num_keys else x.new_empty(count, 0)
        shape = (count, self.num_box) + x.shape[1:]
        if self.num_box:
            box = torch.rand(shape, generator=generator, dtype=x.dtype, device=x.device)
        else:
            box = x.new_empty(shape)
        return keys, box

    def sets_from_uniforms(self, keys: Tensor, box: Tensor) -> Tensor:
        """Sets ``(count, M, ...)`` from the output of :meth:`draw_uniforms` (deterministic, traceable)."""
        parts = []
        if self.num_data:
            parts.append(self.inputs[keys.topk(self.num_data, dim=1, sorted=False).indices])
        if self.num_box:
            parts.append(self.low + box * (self.high - self.low))
        return torch.cat(parts, 1)

    def __call__(self) -> Tensor:
        if self._fixed is not None:
            return self._fixed
        if self._current is None or self._calls % self.redraw_every == 0:
            self._current = self.draw()
        self._calls += 1
        return self._current
