# SPDX-License-Identifier: Apache-2.0
"""Metrics of a Gaussian-mixture regression predictive (the ``RegressionPrediction`` convention).

The predictive of every method is an equally weighted mixture of :math:`S` Gaussians,
``loc`` and ``scale`` of shape ``(S, N)`` (``(N,)`` is read as :math:`S = 1`):
:math:`p(y_i|x_i) = \\frac1S \\sum_s \\mathcal N(y_i; \\mu_{si}, \\sigma_{si}^2)`.

Targets are usually standardised (:class:`~pyro_sdebnn.data.split.DataSplit` with ``y_loc``, ``y_scale``).
The metrics take the predictive and ``y`` in the *same* (standardised) units and a ``y_scale``
keyword that converts the result to the original units: :math:`y_\\text{orig} = y \\cdot s + m`
multiplies errors by :math:`s` and divides densities by :math:`s`, so the RMSE is multiplied by
:math:`s` and :math:`\\log s` is subtracted from the log-likelihood. Coverage is unit-free.

Results are in the dtype of ``loc`` (``mean`` for :func:`rmse`), except float16/bfloat16 inputs, which are
widened exactly to float32 and computed and returned in float32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from pyro_sdebnn.predictive import RegressionPrediction

from ._validation import _check_vector, _float_tensor, _is_prediction, _real_number

__all__ = [
    "gaussian_mixture_log_likelihood",
    "interval_coverage",
    "regression_variance_decomposition",
    "rmse",
]


def _check_y_scale(y_scale: float) -> float:
    value = _real_number(y_scale)  # a Python or NumPy number, or a one-element tensor such as y_train.std()
    if value is None or not (math.isfinite(value) and value > 0):
        raise ValueError(f"y_scale must be a positive finite number, got {y_scale!r}")
    return value


def _check_mixture(loc, scale, *, strictly_positive: bool) -> tuple[Tensor, Tensor]:
    """Validate ``loc``/``scale`` of shape ``(S, N)`` or ``(N,)``; return both as ``(S, N)``."""
    if _is_prediction(loc, "RegressionPrediction"):
        if scale is not None:
            raise ValueError("scale must be None when loc is a RegressionPrediction")
        loc, scale = loc.loc, loc.scale
    loc, scale = _float_tensor("loc", loc), _float_tensor("scale", scale)
    for name, value in (("loc", loc), ("scale", scale)):
        if value.dim() not in (1, 2):
            raise ValueError(f"{name} must have shape (S, N) or (N,), got {tuple(value.shape)}")
        if value.numel() == 0:
            raise ValueError(f"{name} is empty: need at least one component and one point, got {tuple(value.shape)}")
        if not torch.isfinite(value).all():
            raise ValueError(f"{name} must be finite, got NaN or infinite values")
    if loc.shape != scale.shape:
        raise ValueError(f"loc and scale must have the same shape, got {tuple(loc.shape)} and {tuple(scale.shape)}")
    if strictly_positive and (scale <= 0).any():
        raise ValueError(f"scale must be positive, got a minimum of {float(scale.min()):.4g}")
    if (scale < 0).any():
        raise ValueError(f"scale must be non-negative, got a minimum of {float(scale.min()):.4g}")
    if loc.dim() == 1:
        loc, scale = loc[None], scale[None]
    return loc, scale


def rmse(mean, y, *, y_scale: float = 1.0) -> Tensor:
    """Root mean squared error of the predictive mean, in the original units.

    .. math:: \\mathrm{RMSE} = s \\sqrt{\\frac1N \\sum_{i=1}^N (\\hat\\mu_i - y_i)^2}

    :param mean: ``(N,)`` predictive means (e.g. ``RegressionPrediction.mean``), or a
        :class:`~pyro_sdebnn.predictive.RegressionPrediction`.
    :param y: ``(N,)`` targets in the same units as ``mean``.
    :param float y_scale: :math:`s`, the factor back to the original units (``DataSplit.y_scale``; a NumPy
        scalar or a one-element tensor such as ``y_train.std()`` is read as its number).
    :return: 0-dim tensor.

    >>> rmse(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0]))
    tensor(1.4142)
    >>> rmse(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0]), y_scale=10.0)
    tensor(14.1421)
    """
    if _is_prediction(mean, "RegressionPrediction"):
        mean = mean.mean
    mean = _check_vector("mean", mean)
    y = _check_vector("y", y, mean.shape[0]).to(mean)
    return (mean - y).pow(2).mean().sqrt() * _check_y_scale(y_scale)


def gaussian_mixture_log_likelihood(loc, scale, y, *, y_scale: float = 1.0) -> Tensor:
    """Mean test log-likelihood of an equally weighted Gaussian mixture, in the original units.

    .. math::

        \\mathrm{LL} = \\frac1N \\sum_{i=1}^N \\log \\frac1S \\sum_{s=1}^S
        \\mathcal N(y_i; \\mu_{si}, \\sigma_{si}^2) \\; - \\; \\log s

    (the :math:`-\\log s` term is the Jacobian of :math:`y_\\text{orig} = y s + m`; it vanishes for
    ``y_scale=1``). Computed with ``logsumexp``, so it stays finite far in the tails.

    :param loc: ``(S, N)`` component means (``(N,)`` for a single Gaussian), or a
        :class:`~pyro_sdebnn.predictive.RegressionPrediction` (then ``scale=None``).
    :param scale: ``(S, N)`` component standard deviations, positive.
    :param y: ``(N,)`` targets in the same units as ``loc``.
    :param float y_scale: :math:`s`, the factor back to the original units (``DataSplit.y_scale``).
    :return: 0-dim tensor (higher is better).

    >>> gaussian_mixture_log_likelihood(torch.zeros(1), torch.ones(1), torch.zeros(1))
    tensor(-0.9189)
    >>> gaussian_mixture_log_likelihood(torch.tensor([[-1.0], [1.0]]), torch.ones(2, 1), torch.tensor([1.0]))
    tensor(-1.4852)
    """
    loc, scale = _check_mixture(loc, scale, strictly_positive=True)
    y = _check_vector("y", y, loc.shape[1]).to(loc)
    log_prob = torch.distributions.Normal(loc, scale, validate_args=False).log_prob(y)
    log_mix = torch.logsumexp(log_prob, dim=0) - math.log(loc.shape[0])
    return log_mix.mean() - math.log(_check_y_scale(y_scale))


def interval_coverage(loc, scale, y, level: float = 0.95) -> Tensor:
    """Fraction of targets inside the central ``level`` interval of the mixture predictive.

    The central interval :math:`[F^{-1}(\\frac{1-\\ell}2), F^{-1}(\\frac{1+\\ell}2)]` of the mixture
    CDF :math:`F_i(y) = \\frac1S\\sum_s \\Phi((y - \\mu_{si})/\\sigma_{si})` contains :math:`y_i`
    exactly when :math:`\\frac{1-\\ell}2 \\le F_i(y_i) \\le \\frac{1+\\ell}2`, so no quantile needs
    to be inverted:

    .. math:: \\mathrm{cov}_\\ell = \\frac1N \\sum_i \\mathbb 1\\bigl[|2 F_i(y_i) - 1| \\le \\ell\\bigr].

    A calibrated predictive has coverage :math:`\\approx \\ell`. Unit-free (no ``y_scale`` needed).

    :param loc: ``(S, N)`` component means (``(N,)`` for a single Gaussian), or a
        :class:`~pyro_sdebnn.predictive.RegressionPrediction` (then ``scale=None``).
    :param scale: ``(S, N)`` component standard deviations, positive.
    :param y: ``(N,)`` targets.
    :param float level: the interval's probability :math:`\\ell \\in (0, 1)`.
    :return: 0-dim tensor in :math:`[0, 1]`.

    >>> interval_coverage(torch.zeros(3), torch.ones(3), torch.tensor([0.5, -1.9, 2.0]), level=0.95)
    tensor(0.6667)
    """
    value = _real_number(level)
    if value is None or not 0 < value < 1:
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    level = value
    loc, scale = _check_mixture(loc, scale, strictly_positive=True)
    y = _check_vector("y", y, loc.shape[1]).to(loc)
    cdf = torch.special.ndtr((y - loc) / scale).mean(0)
    return ((2 * cdf - 1).abs() <= level).to(loc.dtype).mean()


class VarianceDecomposition(NamedTuple):
    """``(total, aleatoric, epistemic)`` predictive variances, each of shape ``(N,)``."""

    total: Tensor
    aleatoric: Tensor
    epistemic: Tensor


def regression_variance_decomposition(loc, scale=None) -> VarianceDecomposition:
    """Law of total variance of the mixture predictive: aleatoric + epistemic.

    .. math::

        \\underbrace{\\mathrm{Var}[y]}_{\\text{total}}
        = \\underbrace{\\mathbb E_s[\\sigma_s^2]}_{\\text{aleatoric}}
        + \\underbrace{\\mathrm{Var}_s[\\mu_s]}_{\\text{epistemic}}

    (population variance over the :math:`S` components). Delegates to
    :class:`~pyro_sdebnn.predictive.RegressionPrediction`.

    :param loc: ``(S, N)`` component means, or a ``RegressionPrediction`` (then ``scale=None``).
    :param scale: ``(S, N)`` component standard deviations, non-negative.
    :return: :class:`VarianceDecomposition` ``(total, aleatoric, epistemic)``, each ``(N,)``.

    >>> regression_variance_decomposition(torch.tensor([[0.0], [2.0]]), torch.ones(2, 1))
    VarianceDecomposition(total=tensor([2.]), aleatoric=tensor([1.]), epistemic=tensor([1.]))
    """
    loc, scale = _check_mixture(loc, scale, strictly_positive=False)
    prediction = RegressionPrediction(loc, scale)
    return VarianceDecomposition(prediction.variance, prediction.aleatoric_variance, prediction.epistemic_variance)
