# SPDX-License-Identifier: Apache-2.0
"""Inference for Bayesian neural networks: guides, ELBOs, baselines and SG-MCMC kernels (:mod:`.mcmc`).

- SDE-BNN: :class:`NeuralSDEGuide` (neural-SDE posterior over ``OUPath`` sites) and :class:`TracePathKL_ELBO`.
- MNVI: :class:`SamplingFreeBNN` (the Pyro model/guide pair around a network of :mod:`pyro_sdebnn.nn.mnvi` layers,
  with ``fit`` and a one-pass predictive) and :class:`SamplingFree_ELBO` with KL schedules; the layers, the
  ``sampling_free`` handler and the expected-likelihood distributions are in :mod:`pyro_sdebnn.nn.mnvi`.
- Baselines sharing one ``fit`` / ``predict`` interface (:class:`BaselineMethod`): :class:`MAPEstimate`,
  :class:`MeanFieldVI`, :class:`Laplace`, :class:`MCDropout`, :class:`DeepEnsemble`, on any ``torch.nn`` network.
- Every method predicts a :class:`ClassificationPrediction` or a :class:`RegressionPrediction`.
"""

from pyro_sdebnn.predictive import ClassificationPrediction, RegressionPrediction
from pyro_sdebnn.infer.methods import BaselineMethod
from pyro_sdebnn.infer.mc_dropout import MCDropout
from pyro_sdebnn.infer.deep_ensemble import DeepEnsemble
from pyro_sdebnn.infer.map_estimate import MAPEstimate
from pyro_sdebnn.infer.mean_field_vi import MeanFieldVI
from pyro_sdebnn.infer.laplace import Laplace
from pyro_sdebnn.infer.neural_sde_guide import NeuralSDEGuide, NeuralSDEPath
from pyro_sdebnn.infer.trace_path_kl_elbo import TracePathKL_ELBO
from pyro_sdebnn.infer.svi_training import train_svi
from pyro_sdebnn.infer.sampling_free_elbo import LinearKLWarmup, PiecewiseKLSchedule, SamplingFree_ELBO
from pyro_sdebnn.infer.mnvi import SamplingFreeBNN

__all__ = [
    "BaselineMethod",
    "ClassificationPrediction",
    "DeepEnsemble",
    "Laplace",
    "LinearKLWarmup",
    "MAPEstimate",
    "MCDropout",
    "MeanFieldVI",
    "NeuralSDEGuide",
    "NeuralSDEPath",
    "PiecewiseKLSchedule",
    "RegressionPrediction",
    "SamplingFreeBNN",
    "SamplingFree_ELBO",
    "TracePathKL_ELBO",
    "train_svi",
]
