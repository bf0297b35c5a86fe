# SPDX-License-Identifier: Apache-2.0
"""Proper scores, accuracy and entropy-based uncertainty of a classification predictive.

Conventions shared by every classification metric of :mod:`pyro_sdebnn.metrics`:

- ``probs``: predictive class probabilities of shape ``(N, C)`` (rows summing to 1), or ``(N,)``
  positive-class probabilities of a binary problem, or a
  :class:`~pyro_sdebnn.predictive.ClassificationPrediction` (its ``mean_probs`` are used).
- ``labels``: integer class indices of shape ``(N,)`` in ``0..C-1``.
- Results are 0-dim tensors (or ``(N,)`` per-point tensors) on the device of ``probs``, in its dtype for
  float32/float64 input and in float32 for float16/bfloat16 input: half-precision values are widened exactly to
  float32 before anything is summed, since a half-precision sum stops counting at 256 (bfloat16) or 2048
  (float16) and its averages drift by about :math:`N u`.
- Binary ``(N,)`` input is the probability of class 1; it is read as the two-class ``(N, 2)`` input
  ``[1 - p, p]`` except where a docstring says otherwise (the binary Brier score, and the calibration
  metrics, which bin :math:`p` against the frequency of label 1 as torchmetrics' ``BinaryCalibrationError`` does).
- Rows of ``(N, C)`` input must sum to 1 within :math:`\\sqrt{\\epsilon}` of the precision the values were
  produced in (the narrowest of bfloat16, float16, float32 holding them exactly, else their dtype), so a float32
  softmax cast to float64 is judged at float32's :math:`3.5 \\cdot 10^{-4}`, not float64's :math:`1.5 \\cdot 10^{-8}`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._validation import _check_labels, _check_probs, _check_sample_probs

__all__ = [
    "accuracy",
    "brier_score",
    "negative_log_likelihood",
    "predictive_entropy",
    "uncertainty_decomposition",
]


def _probs_and_labels(probs, labels) -> tuple[Tensor, Tensor, bool]:
    probs, binary = _check_probs(probs)
    labels = _check_labels(labels, probs.shape[0], probs.shape[1], probs.device)
    return probs, labels, binary


def accuracy(probs, labels) -> Tensor:
    """Fraction of points whose most probable class is the label.

    .. math:: \\mathrm{acc} = \\frac1N \\sum_{i=1}^N \\mathbb 1[\\arg\\max_c \\hat p_{ic} = y_i]

    Ties go to the lowest class index (a binary probability of exactly 0.5 predicts class 0).

    :param probs: ``(N, C)`` class probabilities or ``(N,)`` positive-class probabilities.
    :param labels: ``(N,)`` integer labels.
    :return: 0-dim tensor in :math:`[0, 1]`.

    >>> accuracy(torch.tensor([[0.9, 0.1], [0.4, 0.6], [0.7, 0.3]]), torch.tensor([0, 1, 1]))
    tensor(0.6667)
    """
    probs, labels, _ = _probs_and_labels(probs, labels)
    return (probs.argmax(-1) == labels).to(probs.dtype).mean()


def negative_log_likelihood(probs, labels) -> Tensor:
    """Mean negative log predictive probability of the labels, in nats.

    .. math:: \\mathrm{NLL} = -\\frac1N \\sum_{i=1}^N \\log \\hat p_{i, y_i}

    A probability of exactly 0 for the true class is clamped to the smallest positive normal number
    of the accumulation dtype (float32 for half-precision input), so one such point adds
    :math:`\\approx 87/N` nats in float32 instead of infinity.

    :param probs: ``(N, C)`` class probabilities or ``(N,)`` positive-class probabilities.
    :param labels: ``(N,)`` integer labels.
    :return: 0-dim tensor, non-negative.

    >>> negative_log_likelihood(torch.tensor([[0.5, 0.5], [0.25, 0.75]]), torch.tensor([0, 1]))
    tensor(0.4904)
    """
    probs, labels, _ = _probs_and_labels(probs, labels)
    picked = probs.gather(-1, labels[:, None]).squeeze(-1)
    return -picked.clamp_min(torch.finfo(probs.dtype).tiny).log().mean()


def brier_score(probs, labels) -> Tensor:
    """The Brier score: mean squared distance between the predictive and the one-hot label.

    .. math:: \\mathrm{BS} = \\frac1N \\sum_{i=1}^N \\sum_{c=1}^C (\\hat p_{ic} - \\mathbb 1[y_i = c])^2

    For binary ``(N,)`` positive-class probabilities the binary form
    :math:`\\frac1N\\sum_i (\\hat p_i - y_i)^2` is used (half the two-class sum above), so the score
    lies in :math:`[0, 1]`; for ``(N, C)`` input it lies in :math:`[0, 2]`.

    :param probs: ``(N, C)`` class probabilities or ``(N,)`` positive-class probabilities.
    :param labels: ``(N,)`` integer labels.
    :return: 0-dim tensor.

    **References**

    [1] G. W. Brier (1950), "Verification of forecasts expressed in terms of probability",
    Monthly Weather Review 78(1).

    >>> brier_score(torch.tensor([[1.0, 0.0], [0.5, 0.5]]), torch.tensor([0, 1]))
    tensor(0.2500)
    >>> brier_score(torch.tensor([1.0, 0.5]), torch.tensor([1, 1]))
    tensor(0.1250)
    """
    probs, labels, binary = _probs_and_labels(probs, labels)
    one_hot = torch.nn.functional.one_hot(labels, probs.shape[-1]).to(probs.dtype)
    squared = (probs - one_hot).pow(2)
    if binary:
        return squared[:, 1].mean()
    return squared.sum(-1).mean()


def _entropy(probs: Tensor) -> Tensor:
    # xlogy gives 0 log 0 = 0; ``0 - x`` (not ``-x``) keeps certain predictions at +0.0, not -0.0.
    return 0.0 - torch.special.xlogy(probs, probs).sum(-1)


def predictive_entropy(probs) -> Tensor:
    """Entropy of the predictive distribution of every point, in nats (with :math:`0 \\log 0 = 0`).

    .. math:: \\mathbb H[\\hat p_i] = -\\sum_{c=1}^C \\hat p_{ic} \\log \\hat p_{ic}

    :param probs: ``(N, C)`` class probabilities or ``(N,)`` positive-class probabilities.
    :return: ``(N,)`` tensor with values in :math:`[0, \\log C]`.

    >>> predictive_entropy(torch.tensor([[0.5, 0.5], [1.0, 0.0]]))
    tensor([0.6931, 0.0000])
    """
    probs, _ = _check_probs(probs)
    return _entropy(probs)


class UncertaintyDecomposition(NamedTuple):
    """``(total, aleatoric, epistemic)``, each of shape ``(N,)``; ``total = aleatoric + epistemic``."""

    total: Tensor
    aleatoric: Tensor
    epistemic: Tensor


def uncertainty_decomposition(sample_probs) -> UncertaintyDecomposition:
    """Split the predictive entropy into aleatoric (expected entropy) and epistemic (mutual information).

    With :math:`S` posterior samples :math:`p_s(y|x)` and predictive :math:`\\bar p = \\frac1S\\sum_s p_s`:

    .. math::

        \\underbrace{\\mathbb H[\\bar p]}_{\\text{total}}
        = \\underbrace{\\frac1S\\sum_s \\mathbb H[p_s]}_{\\text{aleatoric}}
        + \\underbrace{\\mathbb I[y; w \\mid x]}_{\\text{epistemic}}.

    The mutual information is non-negative by Jensen's inequality; round-off below zero is clamped to 0.
    For regression use :func:`~pyro_sdebnn.metrics.regression_variance_decomposition`.

    :param sample_probs: ``(S, N, C)`` per-sample class probabilities, ``(S, N)`` per-sample
        positive-class probabilities, or a :class:`~pyro_sdebnn.predictive.ClassificationPrediction`.
    :return: :class:`UncertaintyDecomposition` ``(total, aleatoric, epistemic)``, each ``(N,)``, in nats.

    **References**

    [1] S. Depeweg, J. M. Hernández-Lobato, F. Doshi-Velez, S. Udluft (2018), "Decomposition of
    uncertainty in Bayesian deep learning for efficient and risk-sensitive learning", ICML.

    >>> total, aleatoric, epistemic = uncertainty_decomposition(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]))
    >>> total, aleatoric, epistemic
    (tensor([0.6931]), tensor([0.]), tensor([0.6931]))
    """
    sample_probs = _check_sample_probs(sample_probs)
    total = _entropy(sample_probs.mean(0))
    aleatoric = _entropy(sample_probs).mean(0)
    epistemic = (total - aleatoric).clamp_min(0)
    return UncertaintyDecomposition(total, aleatoric, epistemic)
