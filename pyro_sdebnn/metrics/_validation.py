# SPDX-License-Identifier: Apache-2.0
"""Input checks shared by the metrics: every error names the argument and what was expected."""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from torch import Tensor

from pyro_sdebnn import predictive


def _is_prediction(value, class_name: str) -> bool:
    """Whether ``value`` is the :mod:`pyro_sdebnn.predictive` container named ``class_name``."""
    return isinstance(value, getattr(predictive, class_name))


def _as_tensor(name: str, value) -> Tensor:
    """Accept a tensor, a numpy array or a (nested) sequence of numbers."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, (list, tuple, int, float, np.integer, np.floating)) and not isinstance(value, bool):
        try:
            return torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be a tensor or an array of numbers ({err})") from None
    raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(value).__name__}")


def _real_number(value) -> float | None:
    """``value`` as a Python float if it is one real number: a Python or NumPy scalar, or a one-element real tensor
    or array (``y.std()``, ``np.std(y)``); else ``None``. Booleans are not numbers here."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Tensor) and value.numel() == 1 and not (value.dtype == torch.bool or value.is_complex()):
        return float(value.item())
    if isinstance(value, np.ndarray) and value.size == 1 and np.issubdtype(value.dtype, np.number):
        if not np.iscomplexobj(value):
            return float(value.item())
    return None


#: Floating dtypes too narrow to accumulate in: their values are widened (exactly) to float32 first.
_HALF_DTYPES = (torch.float16, torch.bfloat16)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype every metric computes and returns in: float32 for float16/bfloat16 input, else ``dtype``.

    A half-precision sum stops counting at :math:`2^{11}` (float16) or :math:`2^8` (bfloat16) and averages with
    errors of the order of the unit round-off times :math:`N`, so half inputs are widened to float32 (an exact
    conversion) before anything is accumulated.
    """
    return torch.float32 if dtype in _HALF_DTYPES else dtype


def _float_tensor(name: str, value) -> Tensor:
    """A floating tensor in the accumulation dtype (integers to the default dtype, halves to float32)."""
    tensor = _as_tensor(name, value)
    if not tensor.is_floating_point():
        tensor = tensor.to(torch.get_default_dtype())
    return tensor.to(accumulation_dtype(tensor.dtype))


def _value_precision(values: Tensor) -> torch.dtype:
    """The precision the values were produced in: the narrowest of bfloat16, float16 and float32 (in that
    order) that represents every value exactly, else the tensor's own dtype.

    A float32 softmax cast with ``.double()`` is float32-exact, so its rows are judged with float32's round-off,
    not float64's. Values exactly representable in bfloat16 and float16 are judged as bfloat16 (the looser
    of the two), so data a bfloat16 model produced are never rejected.
    """
    own_eps = torch.finfo(values.dtype).eps
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        if torch.finfo(dtype).eps > own_eps and torch.equal(values.to(dtype).to(values.dtype), values):
            return dtype
    return values.dtype


def _sum_tolerance(precision: torch.dtype) -> float:
    r"""Rows must sum to 1 within :math:`\sqrt{\epsilon}` of the values' precision.

    Rounding each probability of an exactly normalised row to a precision with unit round-off :math:`u`
    moves the row sum by at most :math:`u \sum_c p_c = u`, and a softmax over :math:`C` classes adds at most
    about :math:`C u`; :math:`\sqrt{\epsilon} = \sqrt{2u}` covers both up to :math:`C \approx 1/\sqrt{\epsilon}`
    (2900 classes in float32) while rejecting every unnormalised row (logits, a forgotten softmax, the wrong
    axis), whose sums are off by O(1). Values: 0.088 (bfloat16), 0.031 (float16), 3.5e-4 (float32),
    1.5e-8 (float64).
    """
    return math.sqrt(torch.finfo(precision).eps)


def _check_probabilities(name: str, probs: Tensor) -> None:
    """Finite values in [0, 1]; row sums are checked separately (:func:`_check_rows_sum_to_one`)."""
    if not torch.isfinite(probs).all():
        raise ValueError(f"{name} must be finite probabilities, got NaN or infinite values")
    if (probs < 0).any() or (probs > 1).any():
        raise ValueError(
            f"{name} must be probabilities in [0, 1], "
            f"got values in [{float(probs.min()):.4g}, {float(probs.max()):.4g}]"
        )


def _check_class_probs(probs, name: str, lead: str) -> tuple[Tensor, bool]:
    """Validate class probabilities of shape ``(*lead, C)`` (or binary ``(*lead,)``), ``lead`` being ``"N"`` or
    ``"S, N"``; return them with a class dimension and whether the input was binary."""
    num_lead = lead.count(",") + 1
    if _is_prediction(probs, "ClassificationPrediction"):
        probs = probs.mean_probs if num_lead == 1 else probs.probs
    probs = _float_tensor(name, probs)
    binary = probs.dim() == num_lead
    if not binary and not (probs.dim() == num_lead + 1 and probs.shape[-1] >= 2):
        raise ValueError(
            f"{name} must have shape ({lead}, C) with C >= 2 classes, or ({lead},) positive-class probabilities, "
            f"got {tuple(probs.shape)}"
        )
    if 0 in probs.shape[:num_lead]:
        what = "one sample and one prediction" if num_lead == 2 else "one prediction"
        raise ValueError(f"{name} is empty: need at least {what}, got {tuple(probs.shape)}")
    _check_probabilities(name, probs)
    if binary:
        return torch.stack([1 - probs, probs], dim=-1), True
    _check_rows_sum_to_one(name, probs)
    return probs, False


def _check_probs(probs, name: str = "probs") -> tuple[Tensor, bool]:
    """Validate predictive probabilities; return them as ``(N, C)`` and whether the input was binary ``(N,)``."""
    return _check_class_probs(probs, name, "N")


def _check_sample_probs(sample_probs, name: str = "sample_probs") -> Tensor:
    """Validate per-sample probabilities ``(S, N, C)`` (or binary ``(S, N)``); return ``(S, N, C)``."""
    return _check_class_probs(sample_probs, name, "S, N")[0]


def _check_rows_sum_to_one(name: str, probs: Tensor) -> None:
    precision = _value_precision(probs)
    tol = _sum_tolerance(precision)
    error = (probs.sum(-1) - 1).abs()
    if (error > tol).any():
        raise ValueError(
            f"{name} rows must sum to 1 over the last (class) dimension within {tol:.2g} "
            f"(sqrt of the machine epsilon of {precision}, the precision of the values), "
            f"got a deviation of {float(error.max()):.4g}"
        )


def _check_labels(labels, num_items: int, num_classes: int, device: torch.device, name: str = "labels") -> Tensor:
    """Integer class indices of shape ``(N,)`` in ``0..num_classes-1``; returned as int64 on ``device``."""
    labels = _as_tensor(name, labels)
    if labels.dim() != 1 or labels.shape[0] != num_items:
        raise ValueError(f"{name} must have shape ({num_items},) to match the predictions, got {tuple(labels.shape)}")
    if labels.is_floating_point() or labels.is_complex():
        if labels.is_complex() or not torch.equal(labels, labels.round()):
            raise ValueError(f"{name} must be integer class indices, got non-integer values of dtype {labels.dtype}")
    labels = labels.to(device=device, dtype=torch.int64)
    if num_items and ((labels < 0).any() or (labels >= num_classes).any()):
        raise ValueError(
            f"{name} must be class indices in [0, {num_classes - 1}], "
            f"got values in [{int(labels.min())}, {int(labels.max())}]"
        )
    return labels


def _check_num_bins(num_bins: int, name: str = "num_bins") -> int:
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise ValueError(f"{name} must be a positive integer, got {num_bins!r}")
    return int(num_bins)


def _check_vector(name: str, value, num_items: int | None = None) -> Tensor:
    """A non-empty finite float vector ``(N,)``, optionally of a given length."""
    tensor = _float_tensor(name, value)
    if tensor.dim() != 1:
        raise ValueError(f"{name} must have shape (N,), got {tuple(tensor.shape)}")
    if tensor.shape[0] == 0:
        raise ValueError(f"{name} is empty: need at least one value")
    if num_items is not None and tensor.shape[0] != num_items:
        raise ValueError(f"{name} must have shape ({num_items},) to match the predictions, got {tuple(tensor.shape)}")
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name} must be finite, got NaN or infinite values")
    return tensor
