# SPDX-License-Identifier: Apache-2.0
"""Inference for Bayesian neural networks: guides, ELBOs, baselines and SG-MCMC kernels (``infer.mcmc``)."""

from pyro_sdebnn.infer.predictive import ClassificationPrediction, RegressionPrediction

__all__ = [
    "ClassificationPrediction",
    "RegressionPrediction",
]
__all__[:] = sorted(set(__all__))
