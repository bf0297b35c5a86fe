# SPDX-License-Identifier: Apache-2.0
r"""Element-wise activations acting on :class:`~pyro_sdebnn.ops.Moments`.

- :class:`MNReLU`: exact Gaussian moments of the rectifier ([1], eq. (11); [2]).
- :class:`MNActivation`: any element-wise function by first-order Taylor expansion,
  :math:`\mathbb E\approx f(\mu)`, :math:`\mathbb V\approx f'(\mu)^2 s^2` ([1], eq. (12)).

On a plain tensor both act as the ordinary activation.

**References**

1. Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.
   arXiv:2103.08497.
2. Brendan J. Frey, Geoffrey E. Hinton (1999). "Variational Learning in Nonlinear Gaussian Belief
   Networks". Neural Computation 11(1).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pyro_sdebnn.nn.mnvi._moment_inputs import as_moments
from pyro_sdebnn.ops.moments import RELU_MIN_VAR, Moments, relu_moments, taylor_moments

__all__ = ["MNActivation", "MNReLU"]


class MNReLU(nn.Module):
    r"""Rectifier with exact moments for a Gaussian input :math:`\mathcal N(\mu, s^2)`.

    .. math::

        \mathbb E = \mu\Phi(\mu/s) + s\varphi(\mu/s), \qquad
        \mathbb V = (\mu^2+s^2)\Phi(\mu/s) + \mu s\varphi(\mu/s) - \mathbb E^2 .

    :param float min_var: floor on :math:`s^2` (default ``1e-5``, as in Schmitt & Roth (2021), App. A).
    :param bool compile: evaluate :func:`~pyro_sdebnn.ops.relu_moments` as one :func:`torch.compile`-fused kernel
        (one pass over memory instead of about seventeen element-wise operations; the first call compiles, which
        takes seconds and needs a C++ compiler). The default ``False`` runs the same function eagerly, and in training
        its hand-written backward pass, which is as fast as the compiled one. Stored as the attribute ``use_compile``.

    >>> relu = MNReLU()
    >>> out = relu(Moments(torch.tensor([-1.0, 0.0, 1.0]), torch.ones(3)))
    >>> out.mean
    tensor([0.0833, 0.3989, 1.0833])
    """

    def __init__(self, min_var: float = RELU_MIN_VAR, *, compile: bool = False) -> None:
        super().__init__()
        given: object = min_var  # checked as any object: numbers.Real also admits NumPy numbers
        if isinstance(given, bool) or not isinstance(given, numbers.Real):
            raise TypeError(f"min_var must be a real number, got {type(min_var).__name__}")
        if not (min_var > 0 and math.isfinite(min_var)):
            raise ValueError(f"min_var must be positive and finite, got {min_var!r}")
        self.min_var = float(min_var)
        # not ``self.compile``: that would shadow the method ``nn.Module.compile``
        self.use_compile = bool(compile)

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        """The moments above for :class:`Moments`, ``relu`` of a plain tensor (a deterministic input stays one)."""
        moments = as_moments(input)
        if moments is None:  # as_moments returns None for a plain tensor only
            return F.relu(cast(Tensor, input))
        if moments.var is None:
            return Moments(F.relu(moments.mean), None)
        fn = _compiled_relu_moments() if self.use_compile else relu_moments
        return fn(moments.mean, moments.var, self.min_var)

    def extra_repr(self) -> str:
        return f"min_var={self.min_var}" + (", compile=True" if self.use_compile else "")


@functools.cache
def _compiled_relu_moments():
    return torch.compile(relu_moments, dynamic=True)


class MNActivation(nn.Module):
    r"""Any element-wise activation, with moments by first-order Taylor expansion.

    .. math::

        \mathbb E[f(Z)] \approx f(\mu), \qquad \mathbb V[f(Z)] \approx f'(\mu)^2\, s^2 .

    :param callable fn: an element-wise, differentiable ``Tensor -> Tensor`` function such as
        :func:`torch.tanh` or :func:`torch.nn.functional.gelu` (an ``nn.Module`` works too).

    >>> act = MNActivation(torch.tanh)
    >>> act(Moments(torch.zeros(2), torch.ones(2))).var
    tensor([1., 1.])
    """

    def __init__(self, fn: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self.fn = fn

    def forward(self, input: Tensor | Moments) -> Tensor | Moments:
        """The Taylor moments above for :class:`Moments`, ``fn`` of a plain tensor."""
        moments = as_moments(input)
        if moments is None:  # as_moments returns None for a plain tensor only
            return self.fn(cast(Tensor, input))
        return taylor_moments(self.fn, moments.mean, moments.var)

    def extra_repr(self) -> str:
        return f"fn={getattr(self.fn, '__name__', type(self.fn).__name__)}"


