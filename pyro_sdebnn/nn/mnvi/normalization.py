# SPDX-License-Identifier: Apache-2.0
r"""Batch normalisation for moment propagation ([1], Sec. 3.3.3).

The mean path is the ordinary batch-norm (batch statistics in training, running statistics in
evaluation; running statistics are updated from the means only). The variance path treats the
layer as the fixed linear map it applies to its input ([1], eq. (13)):

.. math::

    x' = \gamma\frac{x - \operatorname{mean}(x)}{\sqrt{\operatorname{var}(x)+\epsilon}} + \beta,
    \qquad v' = \frac{\gamma^2 v}{\operatorname{var}(x) + \epsilon},

where :math:`\operatorname{var}(x)` is the (biased) batch variance of the means in training and the
running variance in evaluation. ``gamma``/``beta`` are point estimates.

**References**

1. Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.
   arXiv:2103.08497.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, cast, overload

import torch.nn.functional as F
from torch import Tensor, nn

from pyro_sdebnn.nn.mnvi._moment_inputs import as_moments
from pyro_sdebnn.ops.moments import Moments

__all__: list[str] = []

_STATE = threading.local()

if TYPE_CHECKING:  # the mixin reads the batch-norm attributes of the class it is mixed into
    from torch.nn.modules.batchnorm import _BatchNorm as _BatchNormBase
else:
    _BatchNormBase = object


@contextlib.contextmanager
def frozen_running_stats():
    """Inside this context, batch-norm layers in training mode normalise with the batch statistics as usual
    but leave their running statistics (and ``num_batches_tracked``) unchanged.

    Used by :meth:`pyro_sdebnn.infer.SamplingFree_ELBO.loss`, so that evaluating the loss has no side effect.

    >>> import torch
    >>> bn = MNBatchNorm1d(2)
    >>> with frozen_running_stats():
    ...     _ = bn(torch.randn(8, 2))
    >>> bn.running_mean, int(bn.num_batches_tracked)
    (tensor([0., 0.]), 0)
    """
    previous = getattr(_STATE, "frozen", False)
    _STATE.frozen = True
    try:
        yield
    finally:
        _STATE.frozen = previous


class _MomentBatchNorm(_BatchNormBase):
    _reduce_dims: tuple[int, ...]

    def _variance_scale(self, mean: Tensor) -> Tensor:
        use_batch = self.training or not self.track_running_stats
        if use_batch:
            stat_var = mean.var(dim=self._reduce_dims, unbiased=False)
        else:
            assert self.running_var is not None  # track_running_stats=True registers the running statistics
            stat_var = self.running_var
        scale = 1.0 / (stat_var + self.eps)
        if self.affine:
            scale = self.weight.square() * scale
        shape = [1] * mean.dim()
        shape[1] = -1
        return scale.reshape(shape)

    def _normalise(self, x: Tensor) -> Tensor:
        if self.training and getattr(_STATE, "frozen", False):  # batch statistics, running statistics untouched
            return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)
        return super().forward(x)

    @overload
    def forward(self, input: Tensor) -> Tensor: ...

    @overload
    def forward(self, input: Moments) -> Moments: ...

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        moments = as_moments(input)
        if moments is None:  # as_moments returns None for a plain tensor only
            return self._normalise(cast(Tensor, input))
        out_mean = self._normalise(moments.mean)
        if moments.var is None:
            return Moments(out_mean, None)
        return Moments(out_mean, moments.var * self._variance_scale(moments.mean))


class MNBatchNorm2d(_MomentBatchNorm, nn.BatchNorm2d):
    r""":class:`torch.nn.BatchNorm2d` that also scales variances: :math:`v' = \gamma^2 v/(\mathrm{var}+\epsilon)`.

    Arguments as :class:`torch.nn.BatchNorm2d`. Input moments ``(N, C, H, W)``.

    >>> bn = MNBatchNorm2d(3)
    >>> out = bn(Moments(torch.randn(4, 3, 5, 5), torch.ones(4, 3, 5, 5)))
    >>> out.var.shape
    torch.Size([4, 3, 5, 5])
    """

    _reduce_dims = (0, 2, 3)


class MNBatchNorm1d(_MomentBatchNorm, nn.BatchNorm1d):
    r""":class:`torch.nn.BatchNorm1d` that also scales variances: :math:`v' = \gamma^2 v/(\mathrm{var}+\epsilon)`.

    Arguments as :class:`torch.nn.BatchNorm1d`. Input moments ``(N, C)``.

    >>> bn = MNBatchNorm1d(3)
    >>> bn(Moments(torch.randn(4, 3), torch.ones(4, 3))).var.shape
    torch.Size([4, 3])
    """

    _reduce_dims = (0,)

    @overload
    def forward(self, input: Tensor) -> Tensor: ...

    @overload
    def forward(self, input: Moments) -> Moments: ...

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        mean = input.mean if isinstance(input, Moments) else input
        if mean.dim() != 2:
            raise ValueError(f"MNBatchNorm1d expects input of shape (N, C), got {tuple(mean.shape)}")
        return super().forward(input)
