# SPDX-License-Identifier: Apache-2.0
"""Stochastic-gradient MCMC kernels for :class:`pyro.infer.MCMC`: SGLD, SGHMC, fSGLD and fSGHMC.

The kernels subclass :class:`pyro.infer.mcmc.mcmc_kernel.MCMCKernel` and run a minibatched Pyro model under
Pyro's own ``MCMC`` runner (progress bar, chains, ``initial_params``, ``hook_fn``, ``save_params``), with
``Predictive`` and ArviZ downstream. The minibatch size is a kernel setting applied to the model's data plate::

    kernel = SGHMC(model, step_size=1e-2, friction=1.0, num_steps=10, subsample_size=32)
    mcmc = MCMC(kernel, num_samples=100, warmup_steps=200)
    mcmc.run(x, y)                                   # the full data: the kernel draws the minibatches
    idata = to_inference_data(mcmc)                  # posterior, divergences, full-data log-likelihood
    az.summary(idata); az.loo(idata)

The modules, in reading order: :mod:`~pyro_sdebnn.infer.mcmc.sgld` (the kernel as a user sees it),
:mod:`~pyro_sdebnn.infer.mcmc.kernel` (the base class and its one step function),
:mod:`~pyro_sdebnn.infer.mcmc.potential` (model to potential, minibatches), :mod:`~pyro_sdebnn.infer.mcmc.sghmc`,
:mod:`~pyro_sdebnn.infer.mcmc.functional` (fSGLD, fSGHMC), :mod:`~pyro_sdebnn.infer.mcmc.diagnostics`,
:mod:`~pyro_sdebnn.infer.mcmc.schedules`, :mod:`~pyro_sdebnn.infer.mcmc.arviz` (ArviZ, predictions, samples on
disk), :mod:`~pyro_sdebnn.infer.mcmc.checkpoint` and :mod:`~pyro_sdebnn.infer.mcmc.models` (an example model).
The pure update rules live in :mod:`pyro_sdebnn.ops.sgmcmc`.

>>> from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
>>> from pyro_sdebnn.infer.mcmc import SGHMC
>>> issubclass(SGHMC, MCMCKernel)
True
"""

from pyro_sdebnn.infer.mcmc.arviz import to_inference_data
from pyro_sdebnn.infer.mcmc.checkpoint import resume_run, save_run
from pyro_sdebnn.infer.mcmc.functional import FSGHMC, FSGLD
from pyro_sdebnn.infer.mcmc.models import BayesianMLP
from pyro_sdebnn.infer.mcmc.schedules import CyclicalStepSize, PolynomialDecay
from pyro_sdebnn.infer.mcmc.sghmc import SGHMC
from pyro_sdebnn.infer.mcmc.sgld import SGLD

__all__ = [
    "BayesianMLP",
    "CyclicalStepSize",
    "FSGHMC",
    "FSGLD",
    "PolynomialDecay",
    "SGHMC",
    "SGLD",
    "resume_run",
    "save_run",
    "to_inference_data",
]
