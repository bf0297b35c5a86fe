# SPDX-License-Identifier: Apache-2.0
"""Binned calibration: the expected calibration error and Murphy's decomposition of the Brier score.

Bins are ``num_bins`` equal-width intervals of :math:`[0, 1]`, closed on the right:
:math:`(0, \\frac1B], (\\frac1B, \\frac2B], \\dots, (\\frac{B-1}B, 1]`, with 0 in the first bin.

What is binned depends on the shape of ``probs``: for ``(N, C)`` input the top-label confidence
:math:`\\max_c \\hat p_{ic}` against whether the top label is right; for binary ``(N,)`` input the
positive-class probability :math:`\\hat p_i` against the positive-label frequency (the convention of
torchmetrics' ``BinaryCalibrationError``), which is the calibration of :math:`\\hat p_i` itself.
Bin counts are exact integers (``torch.bincount``) and per-bin sums are accumulated in float32 or wider
whatever the input dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._validation import _check_labels, _check_num_bins, _check_probs

__all__ = [
    "brier_decomposition",
    "calibration_bins",
    "expected_calibration_error",
]


def _bin_index(values: Tensor, num_bins: int) -> Tensor:
    """Index of the right-closed equal-width bin of every value in [0, 1]."""
    inner_edges = torch.linspace(0, 1, num_bins + 1, dtype=values.dtype, device=values.device)[1:-1]
    return torch.bucketize(values.contiguous(), inner_edges, right=False)


def _bin_counts(index: Tensor, num_bins: int, dtype: torch.dtype) -> Tensor:
    """Exact per-bin counts (integer ``bincount``), returned in ``dtype``."""
    return torch.bincount(index.reshape(-1), minlength=num_bins).to(dtype)


def _bin_sums(index: Tensor, num_bins: int, *values: Tensor) -> list[Tensor]:
    """Per-bin sums of each tensor in ``values`` (all shaped like ``index``), flattened over extra dims."""
    out = []
    for value in values:
        sums = torch.zeros(num_bins, dtype=value.dtype, device=value.device)
        out.append(sums.index_add_(0, index.reshape(-1), value.reshape(-1)))
    return out


class CalibrationBins(NamedTuple):
    """Per-bin statistics, each of shape ``(num_bins,)``: the number of points, their mean confidence and
    their accuracy (top-label for ``(N, C)`` input, positive-label frequency for binary ``(N,)`` input).

    ``edges`` has shape ``(num_bins + 1,)``; ``confidence`` and ``accuracy`` are NaN in empty bins.
    """

    edges: Tensor
    # the field shadows tuple.count (a method) by design: bins.count is the per-bin count tensor
    count: Tensor  # type: ignore[assignment]
    confidence: Tensor
    accuracy: Tensor


def calibration_bins(probs, labels, num_bins: int = 10) -> CalibrationBins:
    """Bin the confidences and average confidence and accuracy per bin.

    For ``(N, C)`` input the confidence is the top-label probability :math:`\\max_c \\hat p_{ic}` and the
    accuracy is :math:`\\mathbb 1[\\arg\\max_c \\hat p_{ic} = y_i]`. For binary ``(N,)`` input the confidence
    is the positive-class probability :math:`\\hat p_i` itself and the "accuracy" is the positive label
    :math:`\\mathbb 1[y_i = 1]`, so each bin compares the mean forecast with the observed frequency of class 1
    (torchmetrics' ``BinaryCalibrationError`` convention). Pass ``(N, 2)`` probabilities to get the top-label
    version of a binary problem.

    :param probs: ``(N, C)`` class probabilities or ``(N,)`` positive-class probabilities.
    :param labels: ``(N,)`` integer labels.
    :param int num_bins: number of equal-width bins on :math:`[0, 1]`.
    :return: :class:`CalibrationBins` ``(edges, count, confidence, accuracy)`` in the dtype of ``probs``
        (float32 for float16/bfloat16 input); ``count`` holds exact integers.

    >>> bins = calibration_bins(torch.tensor([[0.9, 0.1], [0.3, 0.7]]), torch.tensor([0, 0]), num_bins=5)
    >>> bins.count, bins.accuracy[3:]
    (tensor([0., 0., 0., 1., 1.]), tensor([0., 1.]))
    >>> calibration_bins(torch.tensor([0.1, 0.3]), torch.tensor([0, 1]), num_bins=5).accuracy[:2]
    tensor([0., 1.])
    """
    probs, binary = _check_probs(probs)
    labels = _check_labels(labels, probs.shape[0], probs.shape[1], probs.device)
    num_bins = _check_num_bins(num_bins)
    if binary:
        confidence, correct = probs[:, 1], (labels == 1).to(probs.dtype)
    else:
        confidence, predicted = probs.max(-1)
        correct = (predicted == labels).to(probs.dtype)
    index = _bin_index(confidence, num_bins)
    count = _bin_counts(index, num_bins, probs.dtype)
    conf_sum, correct_sum = _bin_sums(index, num_bins, confidence, correct)
    edges = torch.linspace(0, 1, num_bins + 1, dtype=probs.dtype, device=probs.device)
    return CalibrationBins(edges, count, conf_sum / count, correct_sum / count)


def expected_calibration_error(probs, labels, num_bins: int = 10) -> Tensor:
    """Expected calibration error with ``num_bins`` equal-width bins.

    .. math::

        \\mathrm{ECE} = \\sum_{b=1}^B \\frac{|I_b|}N \\,\\bigl|\\mathrm{acc}(I_b) - \\mathrm{conf}(I_b)\\bigr|,

    where :math:`I_b` holds the points whose confidence falls in bin :math:`b`, :math:`\\mathrm{acc}` is
    their accuracy and :math:`\\mathrm{conf}` their mean confidence. Empty bins contribute 0. For
    ``(N, C)`` input the confidence is the top-label probability :math:`\\max_c \\hat p_{ic}` (top-label
    ECE); for binary ``(N,)`` input it is the positive-class probability :math:`\\hat p_i` and the accuracy
    the frequency of label 1 (torchmetrics' ``BinaryCalibrationError``), see :func:`calibration_bins`.
    A calibrated predictor has ECE :math:`O(\\sqrt{B/N})` from sampling error alone (the estimator is biased
    upwards).

    :param probs: ``(N, C)`` class probabilities or ``(N,)`` positive-class probabilities.
    :param labels: ``(N,)`` integer labels.
    :param int num_bins: number of bins :math:`B` (10, 15 and 20 are the usual choices).
    :return: 0-dim tensor in :math:`[0, 1]`, in the dtype of ``probs`` (float32 for float16/bfloat16 input).

    **References**

    [1] M. P. Naeini, G. Cooper, M. Hauskrecht (2015), "Obtaining well calibrated probabilities
    using Bayesian binning", AAAI.

    [2] C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger (2017), "On calibration of modern neural
    networks", ICML.

    >>> probs = torch.tensor([[0.85, 0.15], [0.85, 0.15], [0.65, 0.35], [0.35, 0.65]])
    >>> expected_calibration_error(probs, torch.tensor([0, 1, 0, 1]), num_bins=10)
    tensor(0.3500)
    """
    return _ece_from_bins(calibration_bins(probs, labels, num_bins))


def _ece_from_bins(bins: CalibrationBins) -> Tensor:
    """The ECE of already binned confidences (empty bins contribute 0)."""
    weight = bins.count / bins.count.sum()
    gap = (bins.accuracy - bins.confidence).abs()
    return torch.where(bins.count > 0, weight * gap, torch.zeros_like(gap)).sum()


class BrierDecomposition(NamedTuple):
    """Murphy's decomposition ``(reliability, resolution, uncertainty)``; Brier ≈ rel − res + unc."""

    reliability: Tensor
    resolution: Tensor
    uncertainty: Tensor


def brier_decomposition(probs, labels, num_bins: int = 10) -> BrierDecomposition:
    """Murphy's decomposition of the Brier score into reliability, resolution and uncertainty.

    Each class :math:`c` is treated as a binary forecast :math:`f_i = \\hat p_{ic}` of the event
    :math:`o_i = \\mathbb 1[y_i = c]`. Forecasts are grouped into ``num_bins`` equal-width bins
    :math:`I_b` with mean forecast :math:`\\bar f_b`, event frequency :math:`\\bar o_b` and overall
    frequency :math:`\\bar o`:

    .. math::

        \\mathrm{REL} = \\sum_c \\sum_b \\frac{|I_b|}N (\\bar f_b - \\bar o_b)^2, \\quad
        \\mathrm{RES} = \\sum_c \\sum_b \\frac{|I_b|}N (\\bar o_b - \\bar o)^2, \\quad
        \\mathrm{UNC} = \\sum_c \\bar o (1 - \\bar o),

    and :math:`\\mathrm{BS} = \\mathrm{REL} - \\mathrm{RES} + \\mathrm{UNC}` **exactly when all forecasts
    within a bin are equal** (e.g. forecasts taking at most one value per bin). Otherwise the
    identity is off by the within-bin terms
    :math:`\\frac1N\\sum_c\\sum_b\\sum_{i\\in I_b}[(f_i - \\bar f_b)^2 - 2 (f_i - \\bar f_b)(o_i - \\bar o_b)]`,
    whose absolute value is at most :math:`C(w^2/4 + w/2)` for bin width :math:`w = 1/B`.
    For binary ``(N,)`` input only the positive class is summed, matching the binary
    :func:`~pyro_sdebnn.metrics.brier_score`; for ``(N, C)`` input all ``C`` classes are.

    :param probs: ``(N, C)`` class probabilities or ``(N,)`` positive-class probabilities.
    :param labels: ``(N,)`` integer labels.
    :param int num_bins: number of equal-width forecast bins.
    :return: :class:`BrierDecomposition` ``(reliability, resolution, uncertainty)`` of 0-dim tensors.

    **References**

    [1] A. H. Murphy (1973), "A new vector partition of the probability score", Journal of Applied
    Meteorology 12(4).

    >>> from pyro_sdebnn.metrics import brier_score
    >>> probs, labels = torch.tensor([0.8, 0.8, 0.2, 0.2]), torch.tensor([1, 0, 0, 0])
    >>> rel, res, unc = brier_decomposition(probs, labels)
    >>> rel - res + unc, brier_score(probs, labels)
    (tensor(0.1900), tensor(0.1900))
    """
    probs, binary = _check_probs(probs)
    num_classes = probs.shape[1]
    labels = _check_labels(labels, probs.shape[0], num_classes, probs.device)
    num_bins = _check_num_bins(num_bins)
    if binary:
        probs, labels = probs[:, 1:], labels[:, None].to(probs.dtype)
    else:
        labels = torch.nn.functional.one_hot(labels, num_classes).to(probs.dtype)
    n, k = probs.shape
    # Flat bin index (class, bin) so one index_add handles every class.
    index = _bin_index(probs, num_bins) + num_bins * torch.arange(k, device=probs.device)
    count = _bin_counts(index, k * num_bins, probs.dtype)
    forecast_sum, event_sum = _bin_sums(index, k * num_bins, probs, labels)
    count, forecast_sum, event_sum = (t.reshape(k, num_bins) for t in (count, forecast_sum, event_sum))
    safe = count.clamp_min(1)
    base_rate = labels.mean(0)  # (k,)
    reliability = (count * (forecast_sum / safe - event_sum / safe).pow(2)).sum() / n
    resolution = (count * (event_sum / safe - base_rate[:, None]).pow(2)).sum() / n
    uncertainty = (base_rate * (1 - base_rate)).sum()
    return BrierDecomposition(reliability, resolution, uncertainty)
