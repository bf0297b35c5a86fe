# SPDX-License-Identifier: Apache-2.0
"""Private helpers shared by the moment-propagating layers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from pyro.infer.util import is_validation_enabled
from torch import Tensor

from pyro_sdebnn.ops.moments import Moments, check_moments

# True while a network entry point (a container's forward, SamplingFreeBNN.moments) runs its layers: it has
# checked the values of the variance it was given, and every layer maps non-negative variances to non-negative
# variances, so the layers inside skip the value check (a full pass over the tensor and a device synchronisation).
_INSIDE_CHECKED_NETWORK: ContextVar[bool] = ContextVar("_INSIDE_CHECKED_NETWORK", default=False)


def as_moments(input: object, name: str = "input") -> Moments | None:
    """Return ``input`` as validated :class:`Moments`, or ``None`` if it is a plain tensor.

    A plain tensor selects the ordinary (deterministic / sampled-weight) forward pass. Types and shapes are
    always checked; ``var >= 0`` only under Pyro validation and only where the moments enter a network (a layer
    called on its own, or the outermost container), not again in every layer inside it.
    """
    if isinstance(input, Moments):
        check_values = is_validation_enabled() and not _INSIDE_CHECKED_NETWORK.get()
        check_moments(input.mean, input.var, name, check_values=check_values)
        return input
    if isinstance(input, Tensor):
        return None
    raise TypeError(f"{name} must be a torch.Tensor or a Moments(mean, var) pair, got {type(input).__name__}")


def check_features(mean: Tensor, expected: int, dim: int, name: str, what: str) -> None:
    """Raise ``ValueError`` unless ``mean.shape[dim] == expected``."""
    if mean.dim() < (dim if dim >= 0 else -dim) or mean.shape[dim] != expected:
        raise ValueError(f"{name} must have {expected} {what} in dimension {dim}, got shape {tuple(mean.shape)}")


@contextmanager
def checked_network() -> Iterator[None]:
    """Context in which layers skip the ``var >= 0`` check: their input comes from an entry point that checked it."""
    token = _INSIDE_CHECKED_NETWORK.set(True)
    try:
        yield
    finally:
        _INSIDE_CHECKED_NETWORK.reset(token)
