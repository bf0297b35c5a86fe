# SPDX-License-Identifier: Apache-2.0
"""Metrics of predictive distributions: calibration, proper scores, selective prediction, OOD, regression.

Classification metrics take ``probs`` of shape ``(N, C)`` (or ``(N,)`` positive-class probabilities,
or a :class:`~pyro_sdebnn.predictive.ClassificationPrediction`) and integer ``labels`` ``(N,)``;
regression metrics take an equal-weight Gaussian mixture ``loc``/``scale`` of shape ``(S, N)``
(the :class:`~pyro_sdebnn.predictive.RegressionPrediction` convention). Inputs are validated:
wrong shapes, probabilities outside [0, 1] or not summing to 1, labels out of range and empty inputs
raise ``ValueError`` naming the argument. Every function states its equation and its reference in its
docstring.
"""

from .calibration import (
    brier_decomposition,
    calibration_bins,
    expected_calibration_error,
)
from .classification import (
    accuracy,
    brier_score,
    negative_log_likelihood,
    predictive_entropy,
    uncertainty_decomposition,
)
from .ood import ood_auroc
from .regression import (
    gaussian_mixture_log_likelihood,
    interval_coverage,
    regression_variance_decomposition,
    rmse,
)
from .rejection import aumrc, misclassification_at_rejection, misclassification_rejection_curve
from .reliability import reliability_diagram
from .temperature import fit_temperature, temperature_scale

__all__ = [
    "accuracy",
    "aumrc",
    "brier_decomposition",
    "brier_score",
    "calibration_bins",
    "expected_calibration_error",
    "fit_temperature",
    "gaussian_mixture_log_likelihood",
    "interval_coverage",
    "misclassification_at_rejection",
    "misclassification_rejection_curve",
    "negative_log_likelihood",
    "ood_auroc",
    "predictive_entropy",
    "regression_variance_decomposition",
    "reliability_diagram",
    "rmse",
    "temperature_scale",
    "uncertainty_decomposition",
]
