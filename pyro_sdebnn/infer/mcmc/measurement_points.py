# SPDX-License-Identifier: Apache-2.0
"""Measurement-point samplers for the functional SG-MCMC kernels (FSGMCMC.md, "Measurement points")."""

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
        :math:`O(M^3)` Cholesky factorisation (a deviation from seed 004, which redraws every step).
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
        if not margin >= 0:
            raise ValueError(f"margin must be non-negative, got {margin!r}")
        self.inputs = inputs
        self.num_data = min(num_data, inputs.shape[0])
        self.num_box = num_box
        self.margin = float(margin)
        self.redraw = bool(redraw)
        self.redraw_every = redraw_every
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
        x = self.inputs
        parts = []
        if self.num_data:
            idx = torch.randperm(x.shape[0], generator=self.generator, device=x.device)[: self.num_data]
            parts.append(x[idx])
        if self.num_box:
            u = torch.rand((self.num_box,) + x.shape[1:], generator=self.generator, dtype=x.dtype, device=x.device)
            parts.append(self.low + u * (self.high - self.low))
        return torch.cat(parts, 0)

    def __call__(self) -> Tensor:
        if self._fixed is not None:
            return self._fixed
        if self._current is None or self._calls % self.redraw_every == 0:
            self._current = self.draw()
        self._calls += 1
        return self._current
