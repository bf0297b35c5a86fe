# SPDX-License-Identifier: Apache-2.0
"""Step-size schedules for the SG-MCMC kernels: constant, polynomial decay and cyclical cosine.

A schedule is a callable ``t -> eta_t`` over the *inner* iteration counter ``t = 0, 1, 2, ...`` (every
gradient step, warm-up included). Kernels accept a float (constant step size) or any schedule.

**References**

[1] M. Welling, Y. W. Teh (2011). Bayesian Learning via Stochastic Gradient Langevin Dynamics. ICML.

[2] R. Zhang, C. Li, J. Zhang, C. Chen, A. G. Wilson (2020). Cyclical Stochastic Gradient MCMC for
Bayesian Deep Learning. ICLR.
"""

from __future__ import annotations

import math
from typing import Union

__all__ = ["CyclicalStepSize", "PolynomialDecay", "StepSizeSchedule"]


class StepSizeSchedule:
    """Base class: a positive step size :math:`\\eta_t` for every inner iteration :math:`t \\ge 0`.

    Subclass it and implement ``__call__(t) -> float`` to write your own schedule:

    >>> class Halving(StepSizeSchedule):
    ...     def __call__(self, t):
    ...         return 1e-2 * 0.5 ** (t // 1000)
    >>> Halving()(2500)
    0.0025
    """

    #: True when :math:`\eta_t` does not depend on ``t`` (lets kernels cache the step-size tensor).
    is_constant: bool = False

    def __call__(self, t: int) -> float:
        raise NotImplementedError


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be positive and finite, got {value}")
    return float(value)


class ConstantStepSize(StepSizeSchedule):
    """:math:`\\eta_t = \\eta`.

    :param float step_size: :math:`\\eta > 0`.

    >>> ConstantStepSize(1e-3)(10)
    0.001
    """

    is_constant = True

    def __init__(self, step_size: float) -> None:
        self.step_size = _check_positive("step_size", step_size)

    def __call__(self, t: int) -> float:
        return self.step_size

    def __repr__(self) -> str:
        return f"ConstantStepSize({self.step_size})"


class PolynomialDecay(StepSizeSchedule):
    """Polynomial decay of [1]: :math:`\\eta_t = a (b + t)^{-\\gamma}`.

    With :math:`\\gamma \\in (1/2, 1]` the schedule satisfies :math:`\\sum_t \\eta_t = \\infty`,
    :math:`\\sum_t \\eta_t^2 < \\infty`, under which SGLD is asymptotically exact.

    :param float a: scale :math:`a > 0`.
    :param float b: offset :math:`b > 0`.
    :param float gamma: exponent :math:`\\gamma`; values outside (1/2, 1] are allowed but not asymptotically exact.

    >>> round(PolynomialDecay(a=1.0, b=1.0, gamma=0.55)(0), 6)
    1.0
    """

    def __init__(self, a: float, b: float = 1.0, gamma: float = 0.55) -> None:
        self.a = _check_positive("a", a)
        self.b = _check_positive("b", b)
        self.gamma = _check_positive("gamma", gamma)

    def __call__(self, t: int) -> float:
        return self.a * (self.b + t) ** (-self.gamma)

    def __repr__(self) -> str:
        return f"PolynomialDecay(a={self.a}, b={self.b}, gamma={self.gamma})"


class CyclicalStepSize(StepSizeSchedule):
    """Cyclical cosine schedule with restarts [2]:

    .. math::

        \\eta_t = \\frac{\\eta_0}{2} \\left[\\cos\\left(\\pi \\frac{t \\bmod L}{L}\\right) + 1\\right]

    :param float initial_step_size: :math:`\\eta_0 > 0`, the step size at the start of each cycle.
    :param int cycle_length: :math:`L \\ge 1` inner iterations per cycle.
    :param float min_step_size: floor added so the step size never reaches 0 (default ``1e-3 * eta_0``).

    >>> s = CyclicalStepSize(1.0, cycle_length=4, min_step_size=0.0)
    >>> [round(s(t), 3) for t in range(5)]
    [1.0, 0.854, 0.5, 0.146, 1.0]
    """

    def __init__(self, initial_step_size: float, cycle_length: int, min_step_size: float | None = None) -> None:
        self.initial_step_size = _check_positive("initial_step_size", initial_step_size)
        if isinstance(cycle_length, bool) or not isinstance(cycle_length, int) or cycle_length < 1:
            raise ValueError(f"cycle_length must be a positive int, got {cycle_length!r}")
        self.cycle_length = cycle_length
        if min_step_size is not None and (isinstance(min_step_size, bool)
                                          or not isinstance(min_step_size, (int, float))):
            raise TypeError(f"min_step_size must be a float or None, got {type(min_step_size).__name__}")
        self.min_step_size = 1e-3 * self.initial_step_size if min_step_size is None else float(min_step_size)
        if not 0 <= self.min_step_size < math.inf:  # NaN fails the comparison too
            raise ValueError(f"min_step_size must be non-negative and finite, got {min_step_size}")

    def __call__(self, t: int) -> float:
        phase = (t % self.cycle_length) / self.cycle_length
        return max(0.5 * self.initial_step_size * (math.cos(math.pi * phase) + 1.0), self.min_step_size)

    def __repr__(self) -> str:
        return f"CyclicalStepSize({self.initial_step_size}, cycle_length={self.cycle_length})"


def as_schedule(step_size: Union[float, StepSizeSchedule]) -> StepSizeSchedule:
    """Wrap a float into ``ConstantStepSize``; pass schedules through.

    >>> as_schedule(0.1)
    ConstantStepSize(0.1)
    """
    if isinstance(step_size, StepSizeSchedule):
        return step_size
    if callable(step_size):
        raise TypeError("step_size must be a float or a StepSizeSchedule (subclass it to write your own schedule)")
    return ConstantStepSize(step_size)
