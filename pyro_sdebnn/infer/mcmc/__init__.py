# SPDX-License-Identifier: Apache-2.0
"""Stochastic-gradient MCMC kernels for :class:`pyro.infer.MCMC`: SGLD, SGHMC, fSGLD and fSGHMC.

The kernels subclass :class:`pyro.infer.mcmc.mcmc_kernel.MCMCKernel` and run a minibatched Pyro model under
Pyro's own ``MCMC`` runner (progress bar, chains, ``initial_params``, ``hook_fn``, ``save_params``), with
``Predictive`` and ArviZ downstream. The minibatch size is a kernel setting applied to the model's data plate::

    kernel = SGHMC(model, step_size=1e-2, friction=1.0, num_steps=10, subsample_size=32)
    mcmc = MCMC(kernel, num_samples=100, warmup_steps=200)
    mcmc.run(x, y)                                   # the full data: the kernel draws the minibatches
    idata = from_pyro(mcmc)                          # posterior, divergences, full-data log-likelihood
    az.summary(idata); az.loo(idata)

With ``vectorized_chains=K`` the kernel runs ``K`` chains at once and ``MCMC`` stores them as ``K`` chains:
``mcmc.get_samples()`` holds ``K * num_samples`` draws (chain after chain) for ``Predictive``, ``mcmc.summary()``
gives R-hat over the ``K`` chains, and :func:`from_pyro` puts each divergence on the chain that diverged.

- kernels: :class:`SGLD` (optionally RMSprop-preconditioned), :class:`SGHMC`, :class:`FSGLD`, :class:`FSGHMC`;
- step sizes: :class:`ConstantStepSize`, :class:`PolynomialDecay`, :class:`CyclicalStepSize`;
- warm-up: a diagonal mass matrix adapted in windows and frozen for sampling
  (:mod:`~pyro_sdebnn.infer.mcmc.adaptation`);
  at the end of a run, one :class:`SamplerWarning` per problem found (:mod:`~pyro_sdebnn.infer.mcmc.run_checks`);
- analysis: :func:`get_samples`, :func:`from_pyro`, :func:`pointwise_log_likelihood`,
  :func:`posterior_prediction` (a ``ClassificationPrediction`` / ``RegressionPrediction``),
  :func:`function_space_diagnostics` (ESS / R-hat of the predictions);
- building blocks: :class:`MinibatchPotential`, :class:`FunctionalPotential`, :class:`MeasurementPoints`,
  :class:`SampleWriter` / :func:`load_samples` (stream samples to disk), :class:`BayesianMLP` (an example model);
- data: tensors (``mcmc.run(x, y)``) or a loader (``mcmc.run(loader)``), for plain models as written for NUTS;
- checkpoints: :func:`save_run`, :func:`resume_run`, :class:`CheckpointHook` (read a file with
  :func:`pyro_sdebnn.infer.checkpoint.load_checkpoint`).

The pure update rules live in :mod:`pyro_sdebnn.ops.sgmcmc`.

>>> from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
>>> from pyro_sdebnn.infer.mcmc import SGHMC
>>> issubclass(SGHMC, MCMCKernel)
True
"""

from pyro_sdebnn.infer.mcmc.arviz_utils import (
    from_pyro,
    function_space_diagnostics,
    get_samples,
    pointwise_log_likelihood,
    posterior_prediction,
)
from pyro_sdebnn.infer.mcmc.base import MinibatchPotential, SamplerDivergenceError, SGMCMCKernel
from pyro_sdebnn.infer.mcmc.run_checks import SamplerWarning
from pyro_sdebnn.infer.mcmc.checkpoint import CheckpointHook, resume_run, save_run
from pyro_sdebnn.infer.mcmc.fsghmc import FSGHMC
from pyro_sdebnn.infer.mcmc.fsgld import FSGLD
from pyro_sdebnn.infer.mcmc.functional import FunctionalPotential
from pyro_sdebnn.infer.mcmc.initialization import init_to_robust
from pyro_sdebnn.infer.mcmc.measurement_points import MeasurementPoints
from pyro_sdebnn.infer.mcmc.models import BayesianMLP
from pyro_sdebnn.infer.mcmc.schedules import (
    ConstantStepSize,
    CyclicalStepSize,
    PolynomialDecay,
    StepSizeSchedule,
    as_schedule,
)
from pyro_sdebnn.infer.mcmc.sghmc import SGHMC
from pyro_sdebnn.infer.mcmc.sgld import SGLD
from pyro_sdebnn.infer.mcmc.streaming import SampleWriter, load_samples
from pyro_sdebnn.predictive import ClassificationPrediction, RegressionPrediction

__all__ = [
    "BayesianMLP",
    "CheckpointHook",
    "ClassificationPrediction",
    "ConstantStepSize",
    "CyclicalStepSize",
    "FSGHMC",
    "FSGLD",
    "FunctionalPotential",
    "MeasurementPoints",
    "MinibatchPotential",
    "PolynomialDecay",
    "RegressionPrediction",
    "SGHMC",
    "SGLD",
    "SGMCMCKernel",
    "SampleWriter",
    "SamplerDivergenceError",
    "SamplerWarning",
    "StepSizeSchedule",
    "as_schedule",
    "from_pyro",
    "function_space_diagnostics",
    "get_samples",
    "init_to_robust",
    "load_samples",
    "resume_run",
    "save_run",
    "pointwise_log_likelihood",
    "posterior_prediction",
]
__all__[:] = sorted(set(__all__))
