# SPDX-License-Identifier: Apache-2.0
"""Private helpers shared by the moment-propagating layers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from pyro.infer.util import is_validation_enabled
from torch import Tensor, nn

from pyro_sdebnn.ops.moments import Moments, check_moments

#: The moments a container has checked (or that a module of this package produced) and passes to a child.
_CHECKED: ContextVar[object] = ContextVar("pyro_sdebnn_mnvi_checked", default=None)


def as_moments(input: object, name: str = "input") -> Moments | None:
    """Return ``input`` as validated :class:`Moments`, or ``None`` if it is a plain tensor.

    A plain tensor selects the ordinary (deterministic / sampled-weight) forward pass. Types and shapes are
    always checked, ``var >= 0`` under Pyro validation (a pass over the tensor; ``pyro.enable_validation(False)``
    skips it, as it skips the argument checks of Pyro's distributions), unless ``input`` is the very object a
    container passes on under :func:`checked`.
    """
    if isinstance(input, Moments):
        check_moments(input.mean, input.var, name,
                      check_values=is_validation_enabled() and input is not _CHECKED.get())
        return input
    if isinstance(input, Tensor):
        return None
    raise TypeError(f"{name} must be a torch.Tensor or a Moments(mean, var) pair, got {type(input).__name__}")


def vouching() -> bool:
    """Whether containers vouch for the moments they pass on: only under Pyro validation (without it no layer checks
    values), and not while ``torch.compile`` traces (the vouching would add graph breaks)."""
    return is_validation_enabled() and not torch.compiler.is_compiling()


@contextlib.contextmanager
def checked(input: object) -> Iterator[None]:
    """Within, :func:`as_moments` does not check ``var >= 0`` again for ``input`` (that object only; ``None``:
    nothing vouched for).

    A container checks its own input once and vouches, while it calls a child, for the input it passes: its own
    input, or the output of a child made only of this package's modules, whose variances are non-negative by
    construction. Moments that a module of the user's builds are other objects, checked where they arrive. This
    saves a pass over every activation and a device synchronisation per layer under Pyro validation.
    """
    if input is None:
        yield
        return
    token = _CHECKED.set(input)
    try:
        yield
    finally:
        _CHECKED.reset(token)


def is_own(module: nn.Module) -> bool:
    """Whether ``module`` and every module inside it are this package's."""
    return all(type(m).__module__.startswith("pyro_sdebnn.") for m in module.modules())


def check_features(mean: Tensor, expected: int, dim: int, name: str, what: str) -> None:
    """Raise ``ValueError`` unless ``mean.shape[dim] == expected``."""
    if mean.dim() < (dim if dim >= 0 else -dim) or mean.shape[dim] != expected:
        raise ValueError(f"{name} must have {expected} {what} in dimension {dim}, got shape {tuple(mean.shape)}")
