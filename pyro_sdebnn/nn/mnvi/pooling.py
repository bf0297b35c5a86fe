# SPDX-License-Identifier: Apache-2.0
r"""Pooling and reshaping layers for moment propagation ([1], Sec. 3.3.3).

- ``MNMaxPool2d``: the maximum of the *means* is taken and that entry's variance is carried
  along (the max of several Gaussians has no closed form; this keeps the sparsity of max-pooling).
- ``MNAvgPool2d`` / ``MNAdaptiveAvgPool2d``: averages of independent entries,
  :math:`v' = \frac{1}{k^2}\operatorname{avg}(v)` for a window of :math:`k` entries.
- ``MNFlatten``, ``MNDropout`` (a no-op: the multiplicative noise replaces dropout),
  ``MNIdentity``.

**References**

1. Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.
   arXiv:2103.08497.
"""

from __future__ import annotations

import math
from typing import cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from pyro_sdebnn.nn.mnvi._moment_inputs import as_moments
from pyro_sdebnn.ops.moments import Moments

__all__: list[str] = []


class MNMaxPool2d(nn.MaxPool2d):
    r"""Max-pooling of the means; the variance of the arg-max entry is carried.

    .. math::

        x' = x_{j^*},\quad v' = v_{j^*},\qquad j^* = \arg\max_{j\in\text{window}} x_j .

    Arguments as :class:`torch.nn.MaxPool2d` (``return_indices`` must be ``False``). The arg-max indices of
    :func:`torch.nn.functional.max_pool2d` gather the variance (a tied maximum carries the variance of the entry
    whose index ``max_pool2d`` returns, the first one on the CPU). The common 2x2 window of stride 2 without autograd
    on the CPU (prediction), run eagerly, takes the same entries by two branch-free halvings instead, which is
    faster there.

    >>> pool = MNMaxPool2d(2)
    >>> out = pool(Moments(torch.arange(4.0).reshape(1, 1, 2, 2), torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])))
    >>> out.mean.flatten(), out.var.flatten()
    (tensor([3.]), tensor([4.]))
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.return_indices:
            raise ValueError("MNMaxPool2d does not support return_indices=True")

    @overload
    def forward(self, input: Tensor) -> Tensor: ...

    @overload
    def forward(self, input: Moments) -> Moments: ...

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        moments = as_moments(input)
        if moments is None:  # as_moments returns None for a plain tensor only
            return super().forward(cast(Tensor, input))
        if moments.var is None:
            return Moments(super().forward(moments.mean), None)
        if (moments.mean.device.type == "cpu" and self._halves() and not torch.compiler.is_compiling()
                and not (torch.is_grad_enabled() and (moments.mean.requires_grad or moments.var.requires_grad))):
            return _max_pool_halves(moments.mean, moments.var)
        out, index = F.max_pool2d(
            moments.mean, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode, True
        )
        var = moments.var.flatten(-2).gather(-1, index.flatten(-2)).view_as(out)
        return Moments(out, var)

    def _halves(self) -> bool:
        """Whether the pooling is the common 2x2 window with stride 2 (no padding or dilation, floor mode)."""
        return (_pair(self.kernel_size) == (2, 2) and _pair(self.stride or self.kernel_size) == (2, 2)
                and _pair(self.padding) == (0, 0) and _pair(self.dilation) == (1, 1) and not self.ceil_mode)


def _max_pool_halves(mean: Tensor, var: Tensor) -> Moments:
    """2x2 / stride-2 :class:`MNMaxPool2d` as two branch-free halvings, first along the width, then the height.

    Each halving compares the two halves' means and takes mean and variance of the larger one (the first on a
    tie) with ``lerp`` by a 0/1 weight, which returns either input exactly. Width first, then height, gives the
    arg-max entry of :func:`torch.nn.functional.max_pool2d`, the first in row-major order on a tie, so the values
    are the same. On the CPU it takes a fraction of the time of ``max_pool2d``, whose compare-and-branch loop is
    slow on inputs without ties, such as the means of a moment pass.
    """
    height, width = mean.shape[-2] // 2 * 2, mean.shape[-1] // 2 * 2
    for dim, size in ((-1, width), (-2, height)):
        first, second = mean.narrow(dim, 0, size).unflatten(dim, (-1, 2)).unbind(dim)
        var_first, var_second = var.narrow(dim, 0, size).unflatten(dim, (-1, 2)).unbind(dim)
        take_first = (first >= second).to(mean.dtype)
        mean, var = torch.lerp(second, first, take_first), torch.lerp(var_second, var_first, take_first)
    return Moments(mean, var)


class MNAvgPool2d(nn.AvgPool2d):
    r"""Average pooling: :math:`x' = \operatorname{avg}(x)`, :math:`v' = \operatorname{avg}(v)/k` for windows of
    :math:`k` independent entries.

    Arguments as :class:`torch.nn.AvgPool2d`; ``count_include_pad`` must be ``False`` when padding is used
    and ``divisor_override`` is not supported.

    >>> pool = MNAvgPool2d(2)
    >>> pool(Moments(torch.zeros(1, 1, 2, 2), torch.ones(1, 1, 2, 2))).var.flatten()
    tensor([0.2500])
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.divisor_override is not None:
            raise ValueError("MNAvgPool2d does not support divisor_override")

    @overload
    def forward(self, input: Tensor) -> Tensor: ...

    @overload
    def forward(self, input: Moments) -> Moments: ...

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        moments = as_moments(input)
        if moments is None:  # as_moments returns None for a plain tensor only
            return super().forward(cast(Tensor, input))
        mean = super().forward(moments.mean)
        if moments.var is None:
            return Moments(mean, None)
        # the mean divides a window sum by d; for independent entries Var = sum(v) / d^2 = avg(v) / d.
        divisor: float | Tensor
        if self.count_include_pad:
            divisor = float(math.prod(_pair(self.kernel_size)))
        else:
            ones = moments.var.new_ones(1, 1, *moments.var.shape[-2:])
            divisor = F.avg_pool2d(ones, self.kernel_size, self.stride, self.padding, self.ceil_mode, True, 1)
        return Moments(mean, super().forward(moments.var) / divisor)


class MNAdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    r"""Global average pooling (``output_size=1``) over independent entries: :math:`v' = \operatorname{mean}(v)/(HW)`.

    >>> pool = MNAdaptiveAvgPool2d(1)
    >>> pool(Moments(torch.zeros(2, 3, 4, 4), torch.ones(2, 3, 4, 4))).var.shape
    torch.Size([2, 3, 1, 1])
    """

    def __init__(self, output_size: int | tuple[int, int] = 1) -> None:
        super().__init__(output_size)
        if output_size not in (1, (1, 1)):
            raise ValueError(f"MNAdaptiveAvgPool2d supports output_size=1 only, got {output_size!r}")

    @overload
    def forward(self, input: Tensor) -> Tensor: ...

    @overload
    def forward(self, input: Moments) -> Moments: ...

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        moments = as_moments(input)
        if moments is None:  # as_moments returns None for a plain tensor only
            return super().forward(cast(Tensor, input))
        mean = moments.mean.mean(dim=(-2, -1), keepdim=True)
        if moments.var is None:
            return Moments(mean, None)
        count = moments.var.shape[-2] * moments.var.shape[-1]
        return Moments(mean, moments.var.mean(dim=(-2, -1), keepdim=True) / count)


class MNFlatten(nn.Flatten):
    """:class:`torch.nn.Flatten` applied to mean and variance.

    >>> MNFlatten()(Moments(torch.zeros(2, 3, 4, 4), torch.ones(2, 3, 4, 4))).var.shape
    torch.Size([2, 48])
    """

    @overload
    def forward(self, input: Tensor) -> Tensor: ...

    @overload
    def forward(self, input: Moments) -> Moments: ...

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        moments = as_moments(input)
        if moments is None:  # as_moments returns None for a plain tensor only
            return super().forward(cast(Tensor, input))
        var = None if moments.var is None else super().forward(moments.var)
        return Moments(super().forward(moments.mean), var)


class MNIdentity(nn.Identity):
    """Passes tensors and moments through unchanged.

    >>> MNIdentity()(Moments(torch.zeros(1), None)).mean
    tensor([0.])
    """

    @overload
    def forward(self, input: Tensor) -> Tensor: ...

    @overload
    def forward(self, input: Moments) -> Moments: ...

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        as_moments(input)
        return input


class MNDropout(MNIdentity):
    """Dropout placeholder: a no-op, since the learned multiplicative noise replaces dropout (Schmitt & Roth, 2021).

    Accepts (and ignores) the arguments of :class:`torch.nn.Dropout` so that networks convert one-to-one.

    >>> MNDropout(0.5)(torch.ones(3))
    tensor([1., 1., 1.])
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        self.p = p

    def extra_repr(self) -> str:
        return f"p={self.p} (no-op)"
