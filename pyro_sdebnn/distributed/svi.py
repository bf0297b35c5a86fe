# SPDX-License-Identifier: Apache-2.0
r"""Data-parallel SVI: every rank reads its shard of the data, the gradients are averaged across ranks.

:func:`pyro_sdebnn.infer.train_svi` (and every ``fit`` built on it or on
``SVIBaseline.fit``) is data-parallel by itself when it is given a loader sharded by a
:class:`~torch.utils.data.distributed.DistributedSampler` in a group of several ranks
(:mod:`pyro_sdebnn.distributed.data_parallel`); :func:`train_svi` is that function with the additional check that
the loader is sharded (on several ranks a plain loader is an error rather than independent runs). The one change
from a single-process run: between
``loss_and_grads`` and the optimiser step, the gradients of all the Pyro parameters of the step (model and guide,
``pyro.get_param_store()``, which includes the weights of ``PyroModule`` networks and of modules registered with
``pyro.module``) are averaged across the ranks by one all-reduce (:class:`AveragedGradients`). Every rank therefore
applies the same update and holds the same parameters, as with PyTorch's ``DistributedDataParallel``, but at the
level of Pyro's param store, so any model, guide and ELBO work unchanged.

With :math:`W` ranks, rank :math:`r` computes the ELBO estimate of its local batch :math:`B_r` of size :math:`b/W`
with the *global* data size :math:`N` (``len(loader.dataset)`` is the whole data set also under a
:class:`~torch.utils.data.distributed.DistributedSampler`), and the average over the ranks is

.. math::

    \frac1W \sum_{r=1}^{W} \Bigl(\frac{N}{b/W} \sum_{i \in B_r} \mathbb E_q[\log p(y_i \mid x_i, w)]
    - \mathrm{KL}(q \,\|\, p)\Bigr)
    = \frac{N}{b} \sum_{i \in B} \mathbb E_q[\log p(y_i \mid x_i, w)] - \mathrm{KL}(q \,\|\, p),

the estimate of one process on the combined batch :math:`B = \cup_r B_r`: a deterministic objective (MAP with
:class:`~pyro.infer.autoguide.AutoDelta`, the sampling-free ELBO) gives the parameters of the single-process run on
the combined batches, up to rounding; a sampled ELBO gives an estimate with :math:`W` independent guide draws (one
per rank, when the ranks are seeded with :func:`~pyro_sdebnn.distributed.init`'s ``seed_per_rank=True``).

Only rank 0 writes the ``checkpoint`` and shows the progress bar. The parameters are copied from rank 0 to the
others before the first step, so the ranks need not share a seed for the initialisation.

This follows the pattern of Pyro's Horovod example (``examples/svi_horovod.py``: gradient averaging around the
optimiser, parameters broadcast from rank 0 before training), with ``torch.distributed`` in place of Horovod and
the averaging placed *before* gradient clipping and the non-finite loss check, so that both see the global gradient.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

import pyro
import torch
from pyro import poutine
from pyro.poutine.trace_struct import Trace
from pyro.infer.util import torch_item
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from pyro_sdebnn.data.loaders import is_loader
from pyro_sdebnn.distributed.comm import all_gather_objects, broadcast_, rank, world_size
from pyro_sdebnn.distributed.data_parallel import average_gradients_, running_stats
from pyro_sdebnn.infer.svi_training import _find_modules
from pyro_sdebnn.infer.svi_training import train_svi as _train_svi

__all__ = ["AveragedGradients", "distributed_loader", "train_svi"]


def distributed_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    **loader_kwargs,
) -> DataLoader:
    """A :class:`~torch.utils.data.DataLoader` that gives this rank its share of every global batch.

    The data set is split over the ranks by a :class:`~torch.utils.data.distributed.DistributedSampler` (one
    permutation per epoch, shared by the ranks through ``seed``), and each rank reads ``batch_size // world_size()``
    points per step, so that one step of all the ranks together sees ``batch_size`` points. On one process this is
    a plain loader of ``batch_size``.

    With ``shuffle=False`` the ranks' batches ``k`` together are the points ``k * batch_size`` to
    ``(k + 1) * batch_size - 1``, the ``k``-th batch of ``DataLoader(dataset, batch_size)``.

    :param dataset: a map-style data set of ``(x, y)`` pairs.
    :param int batch_size: the global batch size :math:`b`, a multiple of the world size.
    :param bool shuffle: a new permutation every epoch (call ``loader.sampler.set_epoch(epoch)``;
        :func:`train_svi` does).
    :param int seed: the seed of the sampler's permutations (the same on every rank).
    :param bool drop_last: drop the tail of the data set that does not divide into the ranks; otherwise the
        sampler repeats up to ``world_size() - 1`` points so that all the ranks take the same number of steps.
    :param loader_kwargs: passed to ``DataLoader`` (``num_workers``, ``pin_memory``, ``generator``, ...).
    :raises ValueError: if ``batch_size`` is not a positive multiple of the world size.

    >>> from torch.utils.data import TensorDataset
    >>> loader = distributed_loader(TensorDataset(torch.arange(10.0), torch.zeros(10)), 4, shuffle=False)
    >>> [x.tolist() for x, _ in loader]  # one process: the whole batch
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    """
    size = world_size()
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if batch_size % size:
        raise ValueError(f"batch_size={batch_size} must be a multiple of the world size {size}: every rank reads "
                         f"batch_size // world_size points per step")
    if "sampler" in loader_kwargs or "batch_sampler" in loader_kwargs or "shuffle" in loader_kwargs:
        raise TypeError("distributed_loader makes its own DistributedSampler: pass shuffle=/seed= to it, not sampler=")
    if size == 1:
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, **loader_kwargs)
    sampler: DistributedSampler[Any] = DistributedSampler(dataset, num_replicas=size, rank=rank(), shuffle=shuffle,
                                                          seed=seed, drop_last=drop_last)
    return DataLoader(dataset, batch_size=batch_size // size, sampler=sampler, **loader_kwargs)


def _site_names(trace: Trace) -> set[str]:
    """The names of the sites of a trace (every site has one; Pyro types it as optional)."""
    return {site["name"] for site in trace.nodes.values() if site["name"] is not None}


class AveragedGradients:
    """An ELBO's ``loss_and_grads`` followed by the averaging of the gradients and of the loss across the ranks.

    Used as ``SVI(model, guide, optim, loss=elbo.loss, loss_and_grads=AveragedGradients(elbo).loss_and_grads)``: after
    ``elbo.loss_and_grads`` has filled the ``.grad`` of the unconstrained parameters it touched, their gradients (in
    the order of the parameter names), the loss and the batch-norm running statistics of ``modules`` are averaged by
    one all-reduce (:func:`~pyro_sdebnn.distributed.average_gradients_`). A parameter without a gradient on a rank
    counts as a zero gradient. The loss returned is the mean over the ranks, so that a non-finite loss on one rank is
    non-finite on all of them and every rank raises.

    On its first call it creates the parameters (one evaluation of the loss without gradients, after which the
    buffers of ``modules`` are put back as they were) and copies the parameters and the buffers of ``modules`` other
    than the running statistics from rank 0 to the other ranks.

    :param elbo: a :class:`pyro.infer.ELBO` (any object with ``loss`` and ``loss_and_grads(model, guide, *args,
        **kwargs)`` methods).
    :param modules: the ``nn.Module`` objects whose batch-norm statistics are averaged (see
        :mod:`pyro_sdebnn.distributed.data_parallel`); default: the model and the guide when they are modules or
        methods of modules (a ``PyroModule`` network, an autoguide), found at the first call.
    :raises ValueError: (when called) if the ranks' parameters differ in names or shapes.
    """

    def __init__(self, elbo, modules: Iterable[nn.Module] | None = None) -> None:
        if not (callable(getattr(elbo, "loss_and_grads", None)) and callable(getattr(elbo, "loss", None))):
            raise TypeError(f"elbo must be a Pyro ELBO (with loss and loss_and_grads methods), got "
                            f"{type(elbo).__name__}")
        if modules is not None:
            modules = list(modules)
            if not all(isinstance(m, nn.Module) for m in modules):
                raise TypeError("modules must be nn.Module objects")
        self.elbo = elbo
        self.modules = modules
        self._layout: list | None = None  # [(name, shape)] agreed by all ranks
        self._stats: list[Tensor] = []

    # kl_schedule in train_svi assigns the ELBO's kl_scale through the object that owns loss_and_grads
    @property
    def kl_scale(self):
        return self.elbo.kl_scale

    @kl_scale.setter
    def kl_scale(self, value) -> None:
        self.elbo.kl_scale = value

    def _agree(self, model, guide, args, kwargs) -> None:
        if self.modules is None:
            self.modules = _find_modules(model, guide)
        buffers = [b for m in self.modules for b in m.buffers()]
        saved = [b.clone() for b in buffers]
        with torch.no_grad(), poutine.trace(param_only=True) as capture:
            self.elbo.loss(model, guide, *args, **kwargs)  # creates the parameters
        with torch.no_grad():  # a step of one process would not have run this forward pass
            for b, value in zip(buffers, saved):
                b.copy_(value)
        store = dict(pyro.get_param_store().named_parameters())
        names = sorted(_site_names(capture.trace))
        self._stats = running_stats(self.modules)
        layout = [(name, tuple(store[name].shape)) for name in names]
        stats_layout = [tuple(t.shape) for t in self._stats]
        for r, other in enumerate(all_gather_objects((layout, stats_layout))):
            if other != (layout, stats_layout):
                raise ValueError(f"the Pyro parameters or batch-norm statistics of rank {r} differ from those of rank "
                                 f"{rank()} (names or shapes: {other[0][:5]} vs {layout[:5]}): every rank must build "
                                 "the same model and guide")
        for name in names:
            broadcast_(store[name], src=0)
        averaged = {id(t) for t in self._stats}  # not copied: they hold this rank's share of the first update
        for b in buffers:
            if id(b) not in averaged:
                broadcast_(b, src=0)
        self._layout = layout

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        """``elbo.loss_and_grads`` and the average of the gradients, the loss and the batch-norm statistics over
        the ranks."""
        if self._layout is None:
            self._agree(model, guide, args, kwargs)
        with poutine.trace(param_only=True) as capture:
            loss = self.elbo.loss_and_grads(model, guide, *args, **kwargs)
        seen = _site_names(capture.trace)
        assert self._layout is not None  # set by _agree
        names = [name for name, _ in self._layout]
        if not seen <= set(names):
            raise ValueError(f"parameters {sorted(seen - set(names))[:5]} appeared after the first step: data-parallel "
                             "SVI needs every parameter to exist from the first step on every rank")
        store = dict(pyro.get_param_store().named_parameters())
        params = [store[name] for name in names]
        mean_loss = average_gradients_(params, torch.tensor(torch_item(loss), dtype=torch.float64),
                                       buffers=self._stats)
        for name, p in zip(names, params):
            if name not in seen:  # not updated by this rank's step (the optimiser sees the trace's parameters)
                p.grad = None
        return float(mean_loss[0])


def train_svi(
    svi: pyro.infer.SVI,
    loader,
    *,
    num_epochs: int,
    checkpoint: str | os.PathLike | None = None,
    resume: str | os.PathLike | None = None,
    callback: Callable[[int, float], None] | None = None,
    progress: bool = False,
    **kwargs,
) -> list[float]:
    """Data-parallel :func:`pyro_sdebnn.infer.train_svi`: gradients averaged across ranks, checkpoints on rank 0.

    Launch the script with ``torchrun --nproc_per_node=W`` and call :func:`~pyro_sdebnn.distributed.init` first.
    On one process (no ``torchrun``) this is exactly :func:`pyro_sdebnn.infer.train_svi`.

    :param svi: a :class:`pyro.infer.SVI` whose loss is a :class:`pyro.infer.ELBO`; built the same way on every
        rank.
    :param loader: a loader sharded over the ranks by a
        :class:`~torch.utils.data.distributed.DistributedSampler` (e.g. :func:`distributed_loader`); its
        ``len(loader.dataset)`` is the global :math:`N` passed to the model as ``num_data``.
    :param int num_epochs: the epoch to train up to (with ``resume``, the epochs already done count).
    :param checkpoint: path of the checkpoint written after every epoch, by rank 0 only.
    :param resume: a checkpoint to continue from, read by every rank (it must be visible to all of them). Every rank
        then continues from rank 0's random state, so the ranks draw the same guide samples after a resume.
    :param callback: ``callback(epoch, loss)`` after every epoch, on every rank (test
        :func:`~pyro_sdebnn.distributed.comm.is_main` to write outputs once); ``loss`` is the mean over the ranks.
    :param bool progress: a progress bar on rank 0.
    :param kwargs: the other arguments of :func:`pyro_sdebnn.infer.train_svi` (``clip_norm``, ``kl_schedule``,
        ``device``, ``scheduler_step``, ``modules``, ...); not ``batch_size`` (the loader's) nor tensor data.
    :returns: the loss of every epoch, averaged over the ranks (the same list on every rank).
    :raises TypeError: if ``loader`` is not a loader or ``svi``'s loss is not an ELBO.
    :raises ValueError: if the loader is not sharded by a ``DistributedSampler`` of this world, or the ranks take
        different numbers of steps per epoch.
    :raises FloatingPointError: if the loss becomes non-finite on any rank (raised on every rank).
    """
    if world_size() == 1:
        return _train_svi(svi, loader, num_epochs=num_epochs, checkpoint=checkpoint, resume=resume,
                          callback=callback, progress=progress, **kwargs)
    if not isinstance(svi, pyro.infer.SVI):
        raise TypeError(f"svi must be a pyro.infer.SVI, got {type(svi).__name__}")
    if isinstance(loader, (tuple, list)) or not is_loader(loader):
        raise TypeError("loader: data-parallel training reads a loader sharded by a DistributedSampler, e.g. "
                        "pyro_sdebnn.distributed.distributed_loader(TensorDataset(x, y), batch_size)")
    sampler = getattr(loader, "sampler", None)
    if not isinstance(sampler, DistributedSampler):
        raise ValueError("loader: with several ranks the loader must shard the data with a "
                         "torch.utils.data.distributed.DistributedSampler (see distributed_loader), otherwise every "
                         f"rank reads the whole data set; got sampler {type(sampler).__name__}")
    # the data-parallel loop itself is pyro_sdebnn.infer.train_svi's: it sees the sharded loader, checks that the
    # ranks take the same number of steps, averages the gradients, sets the sampler's epoch, checkpoints on rank 0
    return _train_svi(svi, loader, num_epochs=num_epochs, checkpoint=checkpoint, resume=resume, callback=callback,
                      progress=progress, **kwargs)
