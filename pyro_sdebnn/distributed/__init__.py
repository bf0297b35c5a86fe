# SPDX-License-Identifier: Apache-2.0
"""Beyond one machine: data-parallel SVI and distributed SG-MCMC chains on :mod:`torch.distributed`.

The layers: the private module ``pyro_sdebnn._comm`` (process group, collectives, sharded loaders, gradient
averaging; it imports nothing of :mod:`pyro_sdebnn.infer`) at the bottom, imported by the training loops of
:mod:`pyro_sdebnn.infer`; the distributed wrappers of this package (:mod:`~pyro_sdebnn.distributed.chains`,
:mod:`~pyro_sdebnn.distributed.ensembles`) above both. This package exports what a training script calls.

Launch a script with ``torchrun --nproc_per_node=K script.py`` (gloo on CPUs, NCCL on GPUs); the same script run
with plain ``python`` is a world of one and behaves as without this module.

- set-up: :func:`init` (reads ``torchrun``'s environment, picks the backend and the device, seeds, sets a
  timeout on every collective); a collective that fails or times out raises :class:`DistributedError` instead of
  hanging. Once :func:`init` has joined the group, the script asks :mod:`torch.distributed` itself for the rest
  (``get_rank()``, ``get_world_size()``, ``barrier()``, ``destroy_process_group()``);
- data-parallel SVI: :func:`pyro_sdebnn.infer.train_svi` on a loader from :func:`distributed_loader` (gradients of
  the Pyro param store averaged across ranks between ``loss_and_grads`` and the optimiser step by
  :class:`AveragedGradients`, checkpoints on rank 0);
- data-parallel ``fit`` of the baselines: with a loader sharded by a ``DistributedSampler`` on several ranks,
  :func:`pyro_sdebnn.infer.train_svi`, ``MAPEstimate.fit``, ``MeanFieldVI.fit``, ``SamplingFreeBNN.fit``,
  :func:`~pyro_sdebnn.infer.map_training.train_network` and ``MCDropout.fit`` average their gradients (and batch-norm
  running statistics) across the ranks by themselves, and ``Laplace.fit`` sums its curvature over the shards;
- the benchmarks under ``torchrun``: ``pyro-sdebnn --distributed benchmark NAME`` (:mod:`pyro_sdebnn.cli`);
- SG-MCMC: :func:`gather_samples` and :func:`gather_inference_data` (every rank's chains as chains of one run),
  :class:`DataParallelSGLD` and :class:`DataParallelSGHMC` (one chain, gradients averaged across ranks);
- deep ensembles: :func:`local_members` (this rank's share of the members) and :func:`gather_prediction` (the
  members of all the ranks in one predictive).

>>> import torch.distributed as dist
>>> from pyro_sdebnn import distributed
>>> device = distributed.init()  # no torchrun: a world of one, no process group is started
>>> dist.is_initialized()
False
"""

from pyro_sdebnn._comm import DistributedError, distributed_loader, init
from pyro_sdebnn.distributed.chains import DataParallelSGHMC, DataParallelSGLD, gather_inference_data, gather_samples
from pyro_sdebnn.distributed.ensembles import gather_prediction, local_members
from pyro_sdebnn.infer.svi_training import AveragedGradients

__all__ = [
    "AveragedGradients",
    "DataParallelSGHMC",
    "DataParallelSGLD",
    "DistributedError",
    "distributed_loader",
    "gather_inference_data",
    "gather_prediction",
    "gather_samples",
    "init",
    "local_members",
]
