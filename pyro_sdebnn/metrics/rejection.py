# SPDX-License-Identifier: Apache-2.0
"""Selective prediction: the misclassification-rejection curve, its area (AUMRC) and fixed-rate points."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from ._validation import _check_labels, _check_probs, _check_vector, _real_number
from .classification import _entropy

__all__ = ["aumrc", "misclassification_at_rejection", "misclassification_rejection_curve"]


def misclassification_rejection_curve(probs, labels, uncertainty=None) -> tuple[Tensor, Tensor]:
    """The misclassification-rejection curve: reject the most uncertain points one at a time.

    Points are sorted by ``uncertainty`` (default: the predictive entropy) in descending order,
    ties kept in input order (stable sort). After rejecting the first :math:`k` points the curve
    has abscissa :math:`k/N` and ordinate the misclassification rate of the :math:`N - k` points left:

    .. math:: m_k = \\frac1{N-k} \\sum_{j > k} \\mathbb 1[\\arg\\max_c \\hat p_{(j)c} \\ne y_{(j)}],
        \\qquad k = 0, \\dots, N-1.

    :param probs: ``(N, C)`` class probabilities or ``(N,)`` positive-class probabilities.
    :param labels: ``(N,)`` integer labels.
    :param uncertainty: optional ``(N,)`` scores, higher = rejected first (default: predictive entropy).
    :return: ``(fraction_rejected, misclassification_rate)``, each of shape ``(N,)``.

    >>> probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2]])
    >>> misclassification_rejection_curve(probs, torch.tensor([0, 1, 0]))
    (tensor([0.0000, 0.3333, 0.6667]), tensor([0.3333, 0.0000, 0.0000]))
    """
    probs, _ = _check_probs(probs)
    n = probs.shape[0]
    labels = _check_labels(labels, n, probs.shape[1], probs.device)
    if uncertainty is None:
        uncertainty = _entropy(probs)
    else:
        uncertainty = _check_vector("uncertainty", uncertainty, n).to(probs.device)
    errors = (probs.argmax(-1) != labels).to(probs.dtype)
    order = torch.sort(uncertainty, descending=True, stable=True).indices
    # Number of errors among the points kept after rejecting the first k: a reversed cumulative sum.
    kept_errors = errors[order].flip(0).cumsum(0).flip(0)
    kept = torch.arange(n, 0, -1, dtype=probs.dtype, device=probs.device)
    fraction = torch.arange(n, dtype=probs.dtype, device=probs.device) / n
    return fraction, kept_errors / kept


def aumrc(probs, labels, uncertainty=None) -> Tensor:
    """Area under the misclassification-rejection curve (lower is better).

    The area under the right-continuous step function of
    :func:`misclassification_rejection_curve` on :math:`[0, 1)`:

    .. math:: \\mathrm{AUMRC} = \\frac1N \\sum_{k=0}^{N-1} m_k.

    A perfect uncertainty ranking (all errors rejected first) minimises it for a given accuracy.

    :param probs: ``(N, C)`` class probabilities or ``(N,)`` positive-class probabilities.
    :param labels: ``(N,)`` integer labels.
    :param uncertainty: optional ``(N,)`` scores, higher = rejected first (default: predictive entropy).
    :return: 0-dim tensor in :math:`[0, 1]`.

    **References**

    [1] Jannik Schmitt, Stefan Roth (2021), "Sampling-free Variational Inference for Neural Networks with
    Multiplicative Activation Noise", DAGM German Conference on Pattern Recognition (GCPR) 2021, App. D.

    [2] M. S. A. Nadeem, J.-D. Zucker, B. Hanczar (2009), "Accuracy-rejection curves (ARCs) for
    comparing classification methods with a reject option", MLSB.

    >>> aumrc(torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2]]), torch.tensor([0, 1, 0]))
    tensor(0.1111)
    """
    _, rate = misclassification_rejection_curve(probs, labels, uncertainty)
    return rate.mean()


def misclassification_at_rejection(
    probs, labels, rates: Sequence[float] = (0.1, 0.25, 0.5), uncertainty=None
) -> dict[float, Tensor]:
    """Misclassification rate on the points kept after rejecting a fixed fraction of the most uncertain.

    For a rate :math:`r`, the :math:`k = \\lfloor rN \\rfloor` most uncertain points are rejected and
    the result is :math:`m_k` of :func:`misclassification_rejection_curve`.

    :param probs: ``(N, C)`` class probabilities or ``(N,)`` positive-class probabilities.
    :param labels: ``(N,)`` integer labels.
    :param rates: rejection fractions in :math:`[0, 1)` (default 10, 25 and 50 %): numbers, or a 1-D tensor
        whose entries key the result by their ``float`` value.
    :param uncertainty: optional ``(N,)`` scores, higher = rejected first (default: predictive entropy).
    :return: ``{rate: 0-dim tensor}`` in the order of ``rates``.

    >>> probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.7, 0.3]])
    >>> misclassification_at_rejection(probs, torch.tensor([0, 1, 0, 0]), rates=(0.0, 0.25))
    {0.0: tensor(0.2500), 0.25: tensor(0.)}
    """
    if isinstance(rates, (int, float)):
        raise TypeError(f"rates must be a sequence of numbers, got a single {type(rates).__name__}")
    rates = tuple(rates)
    if not rates:
        raise ValueError("rates is empty: give at least one rejection rate")
    checked = []
    for rate in rates:
        value = _real_number(rate)
        if value is None or not 0 <= value < 1:
            raise ValueError(f"rates must lie in [0, 1), got {rate!r}")
        # a tensor element (rates=torch.tensor([...])) is keyed by its value: tensors hash by identity
        checked.append(value if isinstance(rate, torch.Tensor) else rate)
    rates = tuple(checked)
    _, curve = misclassification_rejection_curve(probs, labels, uncertainty)
    n = curve.shape[0]
    # The small offset keeps floor(r N) exact when r N is an integer up to floating-point error.
    return {rate: curve[min(math.floor(rate * n + 1e-9), n - 1)] for rate in rates}
