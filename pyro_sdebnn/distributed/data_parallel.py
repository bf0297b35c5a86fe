# SPDX-License-Identifier: Apache-2.0
r"""Data-parallel ``fit``: what the training loops of the package do when a run is data-parallel.

A run is *data-parallel* when a process group with more than one rank is running (``torchrun`` and
:func:`~pyro_sdebnn.distributed.init`) **and** the training data is a loader whose sampler is a
:class:`~torch.utils.data.distributed.DistributedSampler` (e.g. :func:`~pyro_sdebnn.distributed.distributed_loader`):
each rank then reads only its shard, and training on it alone would be wrong. In that case, and only then, the loops
of :func:`pyro_sdebnn.infer.train_svi` (hence :meth:`~pyro_sdebnn.nn.mnvi.SamplingFreeBNN.fit`),
``SVIBaseline.fit`` (:class:`~pyro_sdebnn.infer.MAPEstimate`,
:class:`~pyro_sdebnn.infer.MeanFieldVI`), :func:`~pyro_sdebnn.infer.map_training.train_network` and
:meth:`~pyro_sdebnn.infer.MCDropout.fit`

- check the set-up with :func:`data_parallel_sampler` (the sampler is for this rank of this world, and every rank
  takes the same number of steps per epoch over a data set of the same size);
- copy the parameters of rank 0 to the other ranks before the first step (:func:`broadcast_module_` for
  ``nn.Module`` parameters, :class:`~pyro_sdebnn.distributed.AveragedGradients` for the Pyro param store);
- average the gradients over the ranks before every optimiser step (:func:`average_gradients_`, which
  :class:`~pyro_sdebnn.distributed.AveragedGradients` calls for the Pyro param store), before gradient clipping, so
  that every rank applies the same update and holds the same parameters, and average the batch-norm running
  statistics in the same all-reduce (below);
- call ``loader.sampler.set_epoch(e)`` at the start of epoch ``e`` (a new shared permutation every epoch);
- report the epoch loss over all the ranks, and write checkpoints (``save``, ``checkpoint=``) on rank 0 only.

With :math:`W` ranks of equal local batches :math:`B_r` of size :math:`b/W` (a ``DistributedSampler`` gives every
rank the same number of points), the mean of the ranks' gradients of the mean loss is

.. math::

    \frac1W \sum_{r=1}^W \nabla \frac{W}{b} \sum_{i \in B_r} \ell_i(w) = \nabla \frac1b \sum_{i \in B} \ell_i(w),
    \qquad B = \cup_r B_r,

the gradient of one process on the combined batch; for an ELBO scaled by the global :math:`N` the same holds (see
:mod:`pyro_sdebnn.distributed.svi`). A deterministic loss therefore gives the parameters of the single-process run on
the combined batches, up to rounding.

**Batch-norm statistics.** The running statistics of the normalisation layers (:func:`running_stats`: the
``running_mean`` and ``running_var`` buffers of ``BatchNorm`` layers) are *averaged* over the ranks after every step,
in the all-reduce of the gradients, in the PyTorch loops and in the SVI loops alike. A layer in training mode
updates them from its local batch, :math:`\mu \leftarrow (1 - m)\mu + m\,\bar x_{B_r}`, an affine map of the batch
mean, so with equal local batches the average over the ranks is the update by the mean of the combined batch: the
running mean of a layer on the inputs is that of one process on the combined batches, and every rank ends with the
same statistics. The running variance becomes the mean of the ranks' unbiased batch variances: an unbiased estimate
of the same variance as that of the combined batch, but not equal to it (it leaves out the spread of the ranks' batch
means). Averaging was chosen over copying rank 0's buffers
before every step (the default of :class:`~torch.nn.parallel.DistributedDataParallel`) because the latter keeps the
statistics of rank 0's shard only and leaves every rank with its own last update at the end of training, and it
costs no collective of its own. The forward pass in training mode still normalises by the local batch's statistics,
as under ``DistributedDataParallel`` without :class:`~torch.nn.SyncBatchNorm`; a network with batch norm therefore
follows the single-process run only approximately.

On one process, or with tensor data or a loader without a ``DistributedSampler``, nothing of this happens: the
loops run exactly as they do without :mod:`torch.distributed` (with several ranks, each rank then trains on the data
it is given on its own, as the members of a deep ensemble split over the ranks do).

>>> from torch.utils.data import DataLoader, TensorDataset
>>> data_parallel_sampler(DataLoader(TensorDataset(torch.zeros(4, 1), torch.zeros(4)), batch_size=2)) is None
True
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data.distributed import DistributedSampler

from pyro_sdebnn.distributed.comm import all_gather_objects, all_reduce_mean, broadcast_, rank, world_size

__all__ = ["average_gradients_", "broadcast_module_", "data_parallel_sampler", "is_sharded", "running_stats"]


def is_sharded(data) -> bool:
    """Whether ``data`` is a loader sharded by a ``DistributedSampler`` in a running group of more than one rank.

    No collective: cheap, and ``False`` on one process whatever ``data`` is.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return False
    return isinstance(getattr(data, "sampler", None), DistributedSampler)


def data_parallel_sampler(data) -> Optional[DistributedSampler]:
    """The ``DistributedSampler`` of ``data`` if training on it is data-parallel (see the module), else ``None``.

    Every rank must call it (it compares the ranks' loaders with one small all-gather) when :func:`is_sharded`.

    :param data: the training data of a ``fit``: a loader, or anything else (tensors: ``None``).
    :raises ValueError: if the sampler is for another rank or world size, or the ranks' loaders differ in their
        number of steps per epoch or their data set size.
    """
    if not is_sharded(data):
        return None
    sampler = data.sampler
    if sampler.num_replicas != world_size() or sampler.rank != rank():
        raise ValueError(f"loader: its DistributedSampler is for rank {sampler.rank} of {sampler.num_replicas}, this "
                         f"process is rank {rank()} of {world_size()}")
    try:
        mine = (len(data), len(data.dataset))
    except TypeError:
        raise ValueError("loader: a data-parallel loader must have a length (steps per epoch) and a sized "
                         "dataset") from None
    everyone = all_gather_objects(mine)
    if len(set(everyone)) != 1:
        raise ValueError(f"loader: the ranks' loaders differ in (steps per epoch, data set size): {everyone}; every "
                         "rank must take the same number of steps over the same data set (a DistributedSampler over "
                         "the same data set and the same local batch size on every rank, see "
                         "pyro_sdebnn.distributed.distributed_loader)")
    return sampler


def broadcast_module_(module: nn.Module) -> None:
    """Copy the parameters and buffers of ``module`` on rank 0 to every rank, in place (no-op on one process).

    :raises ValueError: if the ranks' modules differ in parameter or buffer names, shapes or dtypes.
    """
    if world_size() == 1:
        return
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    layout = [(name, tuple(t.shape), str(t.dtype)) for name, t in tensors]
    for r, other in enumerate(all_gather_objects(layout)):
        if other != layout:
            raise ValueError(f"the network of rank {r} differs from that of rank {rank()} (parameter or buffer names, "
                             "shapes or dtypes): every rank must build the same network")
    for _, t in tensors:
        broadcast_(t.data, src=0)


def running_stats(modules: Iterable[nn.Module]) -> list[Tensor]:
    """The running statistics of the normalisation layers of ``modules``: the floating ``running_mean`` and
    ``running_var`` buffers of every ``BatchNorm`` (and ``InstanceNorm`` with ``track_running_stats``), each once."""
    stats: dict[int, Tensor] = {}
    for module in modules:
        for m in module.modules():
            for name in ("running_mean", "running_var"):
                t = getattr(m, name, None)
                if isinstance(t, Tensor) and t.is_floating_point():
                    stats.setdefault(id(t), t)
    return list(stats.values())


def average_gradients_(params: Iterable[Tensor], *values: Tensor, buffers: Iterable[Tensor] = ()) -> Tensor:
    """Average the ``.grad`` of ``params`` over the ranks, in place, with ``values`` and ``buffers`` in the same
    all-reduce (the one gradient averaging of the package: the PyTorch loops and
    :class:`~pyro_sdebnn.distributed.AveragedGradients` both call it).

    A parameter without a gradient on a rank counts as a zero gradient there; it gets the average if another rank
    has a gradient for it, and keeps no gradient if no rank has one (an optimiser then skips it, as on one process).
    Every rank must pass the same parameters and buffers, in the same order.

    :param params: the parameters whose gradients are averaged.
    :param values: scalars (e.g. the step's loss) averaged in the same collective.
    :param buffers: floating tensors replaced in place by their mean over the ranks (the running statistics of
        the normalisation layers, :func:`running_stats`).
    :returns: the averaged ``values`` as one 1-D tensor (empty if none), on the device of the first parameter.
    :raises ValueError: if ``params`` is empty.
    """
    params, buffers = list(params), list(buffers)
    if not params:
        raise ValueError("params: no parameter to average the gradients of")
    ref = params[0]
    flat = [p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in params]
    has_grad = ref.new_tensor([float(p.grad is not None) for p in params])
    extra = [v.detach().reshape(-1).to(ref) for v in values]
    stats = [b.detach().reshape(-1).to(ref) for b in buffers]
    buf = all_reduce_mean(torch.cat(flat + [has_grad] + extra + stats))
    offset = sum(p.numel() for p in params)
    # only a rank that lacks a gradient reads the flags (a host sync)
    flags = buf[offset:offset + len(params)].tolist() if any(p.grad is None for p in params) else [1.0] * len(params)
    offset = 0
    with torch.no_grad():
        for p, flag in zip(params, flags):
            mean = buf[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
            if p.grad is not None:
                p.grad.copy_(mean)
            elif flag > 0:
                p.grad = mean.clone()
        offset += len(params)
        num_values = sum(e.numel() for e in extra)
        averaged = buf[offset:offset + num_values]
        offset += num_values
        for b in buffers:
            b.copy_(buf[offset:offset + b.numel()].view_as(b))
            offset += b.numel()
    return averaged
