# SPDX-License-Identifier: Apache-2.0
"""The :class:`DataSplit` container returned by every tensor loader, and the split helpers."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__: list[str] = []


class DataSplit(NamedTuple):
    """A train/test split of one data set, as tensors.

    Shapes: features ``x`` are float ``(N, D)`` (images ``(N, channels, height, width)``); regression
    targets ``y`` are float ``(N,)``; classification labels ``y`` are ``torch.int64`` ``(N,)``.

    Regression targets may be standardised; ``y_loc`` and ``y_scale`` (Python floats) map them back to
    the original units:

    .. math:: y_\\text{original} = y \\cdot \\texttt{y\\_scale} + \\texttt{y\\_loc}.

    They are ``0.0`` and ``1.0`` when the targets are not standardised (always for classification).

    >>> split = DataSplit(torch.zeros(3, 2), torch.zeros(3), torch.zeros(1, 2), torch.zeros(1), 0.0, 1.0)
    >>> split.x_train.shape, split.y_scale
    (torch.Size([3, 2]), 1.0)
    """

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    y_loc: float = 0.0
    y_scale: float = 1.0

    def to_original_units(self, y: Tensor) -> Tensor:
        """Map standardised targets (or predictive means) back to the original units.

        >>> split = DataSplit(torch.zeros(1, 1), torch.zeros(1), torch.zeros(1, 1), torch.zeros(1), 10.0, 2.0)
        >>> split.to_original_units(torch.tensor([0.0, 1.0]))
        tensor([10., 12.])
        """
        return y * self.y_scale + self.y_loc


def _check_dtype(dtype: torch.dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    return dtype


def _check_positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_fraction(name: str, value: float) -> float:
    if not (isinstance(value, (float, int)) and 0.0 < float(value) < 1.0):
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    return float(value)


def _child_seeds(seed: int, count: int) -> list[int]:
    """``count`` independent 32-bit seeds derived from ``seed`` (numpy ``SeedSequence.spawn``)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return [int(child.generate_state(1)[0]) for child in np.random.SeedSequence(int(seed)).spawn(count)]


def _standardize_columns(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Standardise with the training mean and standard deviation (population, ddof=0).

    Returns ``(train_std, test_std, loc, scale)``; constant training columns get scale 1.
    """
    loc = train.mean(axis=0)
    scale = train.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    return (train - loc) / scale, (test - loc) / scale, loc, scale


def _to_split(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    dtype: torch.dtype,
    classification: bool,
    y_loc: float = 0.0,
    y_scale: float = 1.0,
) -> DataSplit:
    """Fresh tensors (never views of cached arrays) in the requested dtype."""
    label_dtype = torch.int64 if classification else dtype
    return DataSplit(
        torch.tensor(x_train, dtype=dtype),
        torch.tensor(y_train, dtype=label_dtype),
        torch.tensor(x_test, dtype=dtype),
        torch.tensor(y_test, dtype=label_dtype),
        float(y_loc),
        float(y_scale),
    )
