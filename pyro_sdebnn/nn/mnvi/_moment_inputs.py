# SPDX-License-Identifier: Apache-2.0
"""Private helpers shared by the moment-propagating layers."""

from __future__ import annotations

from pyro.infer.util import is_validation_enabled
from torch import Tensor

from pyro_sdebnn.ops.moments import Moments, check_moments


def as_moments(input: object, name: str = "input") -> Moments | None:
    """Return ``input`` as validated :class:`Moments`, or ``None`` if it is a plain tensor.

    A plain tensor selects the ordinary (deterministic / sampled-weight) forward pass. Types and shapes are
    always checked, ``var >= 0`` under Pyro validation (a pass over the tensor; ``pyro.enable_validation(False)``
    skips it, as it skips the argument checks of Pyro's distributions).
    """
    if isinstance(input, Moments):
        check_moments(input.mean, input.var, name, check_values=is_validation_enabled())
        return input
    if isinstance(input, Tensor):
        return None
    raise TypeError(f"{name} must be a torch.Tensor or a Moments(mean, var) pair, got {type(input).__name__}")


def check_features(mean: Tensor, expected: int, dim: int, name: str, what: str) -> None:
    """Raise ``ValueError`` unless ``mean.shape[dim] == expected``."""
    if mean.dim() < (dim if dim >= 0 else -dim) or mean.shape[dim] != expected:
        raise ValueError(f"{name} must have {expected} {what} in dimension {dim}, got shape {tuple(mean.shape)}")
