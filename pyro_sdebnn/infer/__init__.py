# SPDX-License-Identifier: Apache-2.0
"""Inference for Bayesian neural networks: guides, ELBOs, baselines and SG-MCMC kernels (``infer.mcmc``)."""

from pyro_sdebnn.infer.predictive import ClassificationPrediction, RegressionPrediction
from pyro_sdebnn.infer.methods import METHODS, BaselineMethod  # noqa: E402
from pyro_sdebnn.infer.mc_dropout import MCDropout  # noqa: E402
from pyro_sdebnn.infer.deep_ensemble import DeepEnsemble  # noqa: E402
from pyro_sdebnn.infer.pyro_bnn import PyroBNN  # noqa: E402
from pyro_sdebnn.infer.map_estimate import MAPEstimate  # noqa: E402
from pyro_sdebnn.infer.mean_field_vi import MeanFieldVI  # noqa: E402
from pyro_sdebnn.infer.laplace import Laplace  # noqa: E402
from pyro_sdebnn.infer.neural_sde_guide import NeuralSDEGuide, NeuralSDEPath  # noqa: E402
from pyro_sdebnn.infer.trace_path_kl_elbo import TracePathKL_ELBO  # noqa: E402
from pyro_sdebnn.infer.sampling_free_elbo import (  # noqa: E402
    ConstantKLSchedule, LinearKLWarmup, PiecewiseKLSchedule, SamplingFree_ELBO)

__all__ = [
    "ClassificationPrediction",
    "RegressionPrediction",
    "METHODS",
    "BaselineMethod",
    "MCDropout",
    "DeepEnsemble",
    "PyroBNN",
    "MAPEstimate",
    "MeanFieldVI",
    "Laplace",
    "NeuralSDEGuide",
    "NeuralSDEPath",
    "TracePathKL_ELBO",
    "ConstantKLSchedule", "LinearKLWarmup", "PiecewiseKLSchedule", "SamplingFree_ELBO",
]
__all__[:] = sorted(set(__all__))
