# SPDX-License-Identifier: Apache-2.0
r"""SVI over tensors or a :class:`~torch.utils.data.DataLoader`, with checkpoints that resume bitwise.

:func:`train_svi` runs the epochs of an existing :class:`pyro.infer.SVI` object (any model, guide, Pyro optimiser and
ELBO) over a loader (any iterable of batches whose ``dataset`` has a length; a batch goes to the model as
``svi.step(*batch)``, ``svi.step(**batch)`` or ``svi.step(batch)``) or over tensors ``(x, y)``. A model with a
``num_data`` parameter is given :math:`N`, the size of the whole data set, so that a model written the Pyro way,
``pyro.plate("data", num_data, subsample=torch.arange(len(x)))``, turns a minibatch :math:`B` of size :math:`b`
into an unbiased estimate of the full-data ELBO:

.. math::

    \widehat{\mathcal L} = \frac{N}{b} \sum_{i \in B} \mathbb E_q[\log p(y_i \mid x_i, w)]
    - \mathrm{KL}(q \,\|\, p).

``checkpoint=path`` writes a checkpoint of kind ``"svi"`` (:mod:`pyro_sdebnn.infer.checkpoint`) after every epoch;
``resume=path`` continues from it, bit for bit on the CPU. Under ``torchrun`` with a sharded loader the loop is
data-parallel: :class:`AveragedGradients` averages the gradients of the Pyro param store across the ranks before
every update, as Pyro's Horovod example (``examples/svi_horovod.py``) does. :doc:`/training` explains the data
forms, the options, the checkpoints and the data-parallel estimate.

>>> import pyro, torch
>>> from pyro.infer import SVI, Trace_ELBO
>>> from pyro.infer.autoguide import AutoNormal
>>> from torch.utils.data import DataLoader, TensorDataset
>>> def model(x, y=None, num_data=None):
...     w = pyro.sample("w", pyro.distributions.Normal(0.0, 1.0))
...     with pyro.plate("data", num_data or len(x), subsample=torch.arange(len(x))):
...         pyro.sample("obs", pyro.distributions.Normal(w * x, 0.1), obs=y)
>>> pyro.clear_param_store()
>>> x = torch.randn(20)
>>> loader = DataLoader(TensorDataset(x, 2 * x), batch_size=8, shuffle=True)
>>> svi = SVI(model, AutoNormal(model), pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
>>> losses = train_svi(svi, loader, num_epochs=3)
>>> len(losses)
3
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import pyro
import torch
from pyro import poutine
from pyro.infer.util import torch_item
from pyro.poutine.trace_struct import Trace
from torch import Tensor, nn
from tqdm.auto import trange

from pyro_sdebnn._comm import (
    all_gather_objects,
    average_gradients_,
    broadcast_,
    check_joined,
    gather_objects,
    is_main,
    rank,
    running_stats,
    world_size,
)
from pyro_sdebnn.data.loaders import (
    check_finite_batch,
    dataset_size,
    is_loader,
    batch_length,
    iter_model_batches,
    loader_generators,
    minibatch_indices,
    module_device_dtype,
    move_batch,
    rng_state,
    set_rng_state,
)
from pyro_sdebnn.infer._baseline_data import _data_parallel_sampler
from pyro_sdebnn.infer._training import SchedulerStepper, check_clip, svi_update
from pyro_sdebnn.infer.checkpoint import load_checkpoint, save_checkpoint

__all__ = ["train_svi"]


# ---------------------------------------------------------------------------------------------- checkpoints
def _buffers(modules: Sequence[nn.Module]) -> list[dict]:
    return [{name: b.detach().clone() for name, b in m.named_buffers()} for m in modules]


def _checkpoint_state(svi, names: Iterable[str], modules, epoch: int, losses: list[float], rngs: list[dict],
                      num_data: int) -> dict:
    params = dict(pyro.get_param_store().named_parameters())  # name -> unconstrained value
    return {
        "epoch": int(epoch),
        "num_data": int(num_data),  # N of the objective: resuming on another data set is an error
        "losses": [float(v) for v in losses],
        "params": {name: params[name].detach().clone() for name in sorted(names)},
        "buffers": _buffers(modules),
        "optim": svi.optim.get_state(),
        "world_size": len(rngs),  # the ranks of the run: the one process, or the data-parallel ranks
        "rng": rngs,  # rng_state of every rank, in rank order
    }


def _rank_rng(state: dict, path, ranks: int, this_rank: int) -> dict:
    """This rank's random state in a checkpoint: ``state["rng"][this_rank]`` of a run of ``ranks`` ranks.

    A checkpoint of an earlier version holds one random state (a dict, the state of the process that wrote it,
    rank 0 when data-parallel): it is restored on every rank, as that version did.
    """
    rngs = state["rng"]
    if isinstance(rngs, dict):
        return rngs
    saved = state.get("world_size")
    if not isinstance(rngs, list) or not rngs or (saved is not None and saved != len(rngs)):
        raise ValueError(f"resume: {str(path)!r}: the random states are not a list of one state per rank (of "
                         f"world_size={saved!r})")
    if len(rngs) != ranks:
        raise ValueError(f"resume: {str(path)!r} was written by a run of {len(rngs)} rank(s) and holds their random "
                         f"states, this run has {ranks} (data-parallel ranks, or 1): resume on {len(rngs)} rank(s) "
                         "to continue the run exactly, or start a new run")
    return rngs[this_rank]


def _restore(svi, path, args, kwargs, modules, loader, num_data: int, ranks: int = 1,
             this_rank: int = 0) -> tuple[int, list[float]]:
    """Load ``path`` into the param store, optimiser, modules and RNGs (``this_rank``'s of ``ranks``); all checks
    before any change."""
    state = load_checkpoint(path, "svi", map_location="cpu")
    keys = {"epoch", "losses", "params", "buffers", "optim", "rng"}
    if not keys <= set(state):
        raise ValueError(f"resume: {str(path)!r} is an incomplete checkpoint (it lacks {sorted(keys - set(state))})")
    rng = _rank_rng(state, path, ranks, this_rank)
    saved_n = state.get("num_data")  # absent from the checkpoints of earlier versions
    if saved_n is not None and int(saved_n) != num_data:
        raise ValueError(f"resume: {str(path)!r} was trained on a data set of N={int(saved_n)} points, this run's has "
                         f"N={num_data} (num_data, else the size of the data): resume on the same data, or start a "
                         "new run")
    store = pyro.get_param_store()
    before = set(store.keys())
    # The parameters of model and guide are created on their first call: trace them once (blocked from
    # every outer handler); the caller puts the random state back if anything fails.
    with poutine.block(), poutine.trace(param_only=True) as capture, torch.no_grad():
        svi.guide(*args, **kwargs)
        svi.model(*args, **kwargs)
    names = {str(site["name"]) for site in capture.trace.nodes.values()}
    params = dict(store.named_parameters())  # name -> unconstrained value (the tensors themselves)
    try:
        saved = state["params"]
        if set(saved) != names:
            missing, extra = sorted(names - set(saved)), sorted(set(saved) - names)
            raise ValueError(f"resume: {str(path)!r} is a checkpoint of another model: parameters missing from it "
                             f"{missing[:5]}, parameters this model does not have {extra[:5]} (the names include the "
                             "name= of the network and guide: build them as for the checkpointed run)")
        for name in sorted(names):
            current = params[name]
            value = saved[name]
            if not isinstance(value, Tensor) or value.shape != current.shape or value.dtype != current.dtype:
                raise ValueError(f"resume: {str(path)!r} is a checkpoint of another model: parameter {name!r} is "
                                 f"{tuple(getattr(value, 'shape', ()))} {getattr(value, 'dtype', type(value))}, "
                                 f"in this model {tuple(current.shape)} {current.dtype}")
        buffers = state["buffers"]
        if not isinstance(buffers, list) or len(buffers) != len(modules):
            raise ValueError(f"resume: {str(path)!r} holds the buffers of {len(buffers)} modules, "
                             f"expected {len(modules)}")
        for module, saved_buffers in zip(modules, buffers):
            own = dict(module.named_buffers())
            if set(own) != set(saved_buffers) or any(own[k].shape != saved_buffers[k].shape for k in own):
                raise ValueError(f"resume: {str(path)!r} is a checkpoint of another model: the buffers of "
                                 f"{type(module).__name__} differ")
        if not isinstance(state["optim"], dict) or not set(state["optim"]) <= names:
            raise ValueError(f"resume: {str(path)!r}: the optimiser state names parameters this model does not have")
        rng_keys = {"torch", "cuda", "numpy", "random", "loader"}
        if not isinstance(rng, dict) or not rng_keys <= set(rng):
            raise ValueError(f"resume: {str(path)!r}: the random state is incomplete (expected {sorted(rng_keys)})")
        generators = loader_generators(loader) if loader is not None else []
        if len(rng["loader"]) != len(generators):
            raise ValueError(f"resume: {str(path)!r} holds {len(rng['loader'])} loader generator "
                             f"states (DataLoader(generator=...), its sampler's), the data given have "
                             f"{len(generators)}: resume on data given as the interrupted run's were (the same "
                             "kind of loader, or tensors)")
    except BaseException:
        for name in set(store.keys()) - before:  # leave the param store as it was
            del store[name]
        raise
    with torch.no_grad():
        for name in names:
            params[name].copy_(saved[name])
        for module, saved_buffers in zip(modules, buffers):
            for name, b in module.named_buffers():
                b.copy_(saved_buffers[name])
    svi.optim.set_state(state["optim"])
    set_rng_state(rng, loader)
    return int(state["epoch"]), list(state["losses"])


# ---------------------------------------------------------------------------------------------- data-parallel
def _site_names(trace: Trace) -> set[str]:
    """The names of the sites of a trace (every site has one; Pyro types it as optional)."""
    return {site["name"] for site in trace.nodes.values() if site["name"] is not None}


class AveragedGradients:
    """An ELBO's ``loss_and_grads`` followed by the averaging of the gradients and of the loss across the ranks.

    Used as ``SVI(model, guide, optim, loss=elbo.loss, loss_and_grads=AveragedGradients(elbo).loss_and_grads)``: after
    ``elbo.loss_and_grads`` has filled the ``.grad`` of the unconstrained parameters it touched, their gradients (in
    the order of the parameter names), the loss and the batch-norm running statistics of ``modules`` are averaged by
    one all-reduce (``average_gradients_``). A parameter without a gradient on a rank
    counts as a zero gradient. The loss returned is the mean over the ranks, so that a non-finite loss on one rank is
    non-finite on all of them and every rank raises.

    On its first call it creates the parameters (one evaluation of the loss without gradients, after which the
    buffers of ``modules`` are put back as they were) and copies the parameters and the buffers of ``modules`` other
    than the running statistics from rank 0 to the other ranks.

    :param elbo: a :class:`pyro.infer.ELBO` (any object with ``loss`` and ``loss_and_grads(model, guide, *args,
        **kwargs)`` methods).
    :param modules: the ``nn.Module`` objects whose batch-norm statistics are averaged (see
        :mod:`pyro_sdebnn.distributed`); default: the model and the guide when they are modules or
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
        existing, rng = set(pyro.get_param_store().keys()), rng_state()
        with torch.no_grad(), poutine.trace(param_only=True) as capture:
            self.elbo.loss(model, guide, *args, **kwargs)  # creates the parameters
        with torch.no_grad():  # a step of one process would not have run this forward pass
            for b, value in zip(buffers, saved):
                b.copy_(value)
        if set(pyro.get_param_store().keys()) <= existing:
            # no parameter created (a resumed run, a second call): nor are its draws, so that the run continues with
            # the random numbers of the run that was never stopped (a first call keeps the draws that initialised)
            set_rng_state(rng)
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


# ---------------------------------------------------------------------------------------------- training
def _accepts_num_data(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "num_data" in params and params["num_data"].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                                   inspect.Parameter.KEYWORD_ONLY)


def _find_modules(model, guide) -> list[nn.Module]:
    """The modules that are (or whose methods are) the model and the guide."""
    found: list[nn.Module] = []
    for fn in (model, guide):
        obj = fn if isinstance(fn, nn.Module) else getattr(fn, "__self__", None)
        if isinstance(obj, nn.Module) and all(obj is not m for m in found):
            found.append(obj)
    return found


def _tensor_batches(x: Tensor, y: Tensor, batch_size: int, shuffle: bool, device, dtype):
    for idx in minibatch_indices(x.shape[0], batch_size, x.device, shuffle=shuffle):
        yield move_batch(x[idx], device, dtype), move_batch(y[idx], device, dtype)


def _check_data(data, batch_size):
    if isinstance(data, (tuple, list)):
        if len(data) != 2 or not all(isinstance(t, Tensor) for t in data):
            raise TypeError("data must be a loader or a pair (x, y) of tensors, got a "
                            f"{type(data).__name__} of {[type(t).__name__ for t in data]}")
        x, y = data
        if x.dim() == 0 or x.shape[0] == 0 or y.shape[:1] != x.shape[:1]:
            raise ValueError(f"data: x and y must have the same, non-zero first dimension, got {tuple(x.shape)} "
                             f"and {tuple(y.shape)}")
        check_finite_batch(x, y, what="x")  # once, whole: the minibatches are slices of these tensors
        if batch_size is None:
            batch_size = x.shape[0]
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        return False, int(x.shape[0]), batch_size
    if not is_loader(data):  # raises TypeError for anything else
        raise TypeError(f"data must be a loader or a pair (x, y) of tensors, got {type(data).__name__}")
    if batch_size is not None:
        raise ValueError("batch_size is for tensor data; a loader has its own batch size (got batch_size="
                         f"{batch_size!r})")
    return True, dataset_size(data), None


def svi_epochs(
    step: Callable[[tuple, dict, str], float],
    batches: Callable[[], Iterable[tuple[tuple, dict, float]]],
    *,
    start: int,
    num_epochs: int,
    stepper: SchedulerStepper,
    sampler=None,
    progress: bool = False,
    desc: str = "train_svi",
    what: str = "data",
    before_epoch: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, float, float]]:
    """The epoch loop of :func:`train_svi` (the one SVI training loop of the package).

    For every epoch from ``start`` to ``num_epochs``: ``before_epoch(epoch)``, the sampler's ``set_epoch(epoch)``
    (data-parallel), then ``step(args, kwargs, where)`` on every ``(args, kwargs, weight)`` of ``batches()``, with
    ``stepper.after_step(loss)`` after each step. Yields ``(epoch, total, count)`` after each epoch: the weighted sum
    of the step losses and the sum of the weights; the caller steps the scheduler after the epoch
    (``stepper.after_epoch``) with the loss it reports.

    :raises ValueError: if an epoch has no batch (naming the argument ``what``).
    """
    for epoch in trange(start, num_epochs, disable=not progress, desc=desc, leave=False):
        if before_epoch is not None:
            before_epoch(epoch)
        if sampler is not None:
            sampler.set_epoch(epoch)  # the ranks' shards of a new shared permutation
        total, count = 0.0, 0.0
        for i, (args, kwargs, weight) in enumerate(batches()):
            loss = step(args, kwargs, f"epoch {epoch}, batch {i} of {desc}")
            total += loss * weight
            count += weight
            stepper.after_step(loss)
        if count == 0:
            raise ValueError(f"{what}: the loader yielded no batch in an epoch")
        yield epoch, total, count


def train_svi(
    svi: pyro.infer.SVI,
    data,
    *,
    num_epochs: int,
    batch_size: int | None = None,
    shuffle: bool = True,
    num_data: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    scheduler_step: str = "epoch",
    clip_norm: float | None = None,
    clip_inf_norm: float | None = None,
    kl_schedule: Callable[[int], float] | None = None,
    progress: bool = False,
    callback: Callable[[int, float], None] | None = None,
    checkpoint: str | os.PathLike | None = None,
    resume: str | os.PathLike | None = None,
    modules: Iterable[nn.Module] | None = None,
    require_sharded: bool = False,
    subsample_size: int | None = None,
    model_kwargs: dict | None = None,
    loss_per_datum: bool = False,
    first_epoch: int = 0,
) -> list[float]:
    r"""Run ``num_epochs`` epochs of :meth:`pyro.infer.SVI.step` over a loader or tensors; return the epoch losses.

    Every option is explained in :doc:`/training`; the data-parallel behaviour under ``torchrun`` in the module.

    :param svi: a :class:`pyro.infer.SVI` (model, guide, Pyro optimiser or :class:`~pyro.optim.PyroLRScheduler`, ELBO).
    :param data: a loader (an iterable of batches whose ``dataset`` has a length, e.g. a
        :class:`~torch.utils.data.DataLoader`) or a pair ``(x, y)`` of tensors.
    :param int num_epochs: the epoch to train up to (with ``resume``, the epochs already done count).
    :param int batch_size: minibatch size for tensor data (default: the whole data set); not with a loader.
    :param bool shuffle: tensor data: a new random order every epoch; else in order.
    :param int num_data: :math:`N` passed as ``num_data=`` to a model that has that parameter (default: data set size).
    :param device: where each batch goes (default: the device of the first parameter of ``modules``).
    :param dtype: floating dtype of the inputs (default: that of the same parameter); integer labels keep theirs.
    :param str scheduler_step: ``"epoch"`` or ``"step"``: when a :class:`~pyro.optim.PyroLRScheduler` is stepped.
    :param clip_norm: clip the whole gradient by its :math:`L_2` norm, :math:`g \leftarrow g \min(1, c/\|g\|_2)`.
    :param clip_inf_norm: clip the whole gradient by its :math:`L_\infty` norm (after ``clip_norm``).
    :param kl_schedule: ``epoch -> kappa`` assigned to the ELBO's ``kl_scale`` at the start of each epoch.
    :param bool progress: show a progress bar over epochs.
    :param callback: ``callback(epoch, loss)`` after every epoch (after its checkpoint is written).
    :param checkpoint: write a checkpoint to this path after every epoch.
    :param resume: continue from this checkpoint (the same path as ``checkpoint`` is fine).
    :param modules: the ``nn.Module`` objects whose buffers go into the checkpoint and whose first parameter gives
        the default device; default: the modules whose methods are the model and guide (or which they are).
    :param bool require_sharded: with several ranks, require a loader sharded by a ``DistributedSampler``.
    :param int subsample_size: tensor data only, instead of ``batch_size``: every step gets the whole ``(x, y)`` and
        ``subsample_size=b``, and the model's subsampled plate draws the minibatch.
    :param dict model_kwargs: keyword arguments passed to the model and guide at every step, besides ``num_data``.
    :param bool loss_per_datum: report the plain mean of the step losses divided by :math:`N`.
    :param int first_epoch: the epochs already run on these parameters and optimiser; not with ``resume``.
    :returns: the loss of every epoch (including those before ``resume``, excluding those before ``first_epoch``):
        the mean of the step losses weighted by the batch sizes (see ``loss_per_datum``).
    :raises FloatingPointError: if a step's loss is NaN or infinite (the parameters keep their last finite values).
    :raises FileNotFoundError: if the ``resume`` file does not exist.
    :raises TypeError: if ``num_data`` is given to a model without that parameter.
    :raises ValueError: for a bad ``resume`` file (also one written by a run of another number of data-parallel
        ranks), bad arguments, data holding a NaN or an infinity (naming the batch and the index), or, when
        data-parallel, ranks whose loaders take different numbers of steps per epoch.
    """
    if not isinstance(svi, pyro.infer.SVI):
        raise TypeError(f"svi must be a pyro.infer.SVI, got {type(svi).__name__}")
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
        raise ValueError(f"num_epochs must be a positive int, got {num_epochs!r}")
    if isinstance(first_epoch, bool) or not isinstance(first_epoch, int) or not 0 <= first_epoch < num_epochs:
        raise ValueError(f"first_epoch must be an int in [0, num_epochs={num_epochs}), got {first_epoch!r}")
    if first_epoch and resume is not None:
        raise ValueError("give either first_epoch or resume (which takes the epoch from the checkpoint)")
    if subsample_size is not None and batch_size is not None:
        raise ValueError("give either batch_size (train_svi cuts the minibatches) or subsample_size (the model's "
                         "plate draws them)")
    loader, n, batch_size = _check_data(data, batch_size)
    if subsample_size is not None:
        if loader:
            raise ValueError("subsample_size is for tensor data; a loader yields its own minibatches")
        if isinstance(subsample_size, bool) or not isinstance(subsample_size, int) or not 1 <= subsample_size <= n:
            raise ValueError(f"subsample_size must be an int in [1, {n}] (the data size), got {subsample_size!r}")
    accepts = _accepts_num_data(svi.model)
    if num_data is not None:
        if isinstance(num_data, bool) or not isinstance(num_data, int) or num_data < 1:
            raise ValueError(f"num_data must be a positive int or None, got {num_data!r}")
        if not accepts:
            raise TypeError("num_data was given but the model has no `num_data` parameter to receive it")
    if not isinstance(loss_per_datum, bool):
        raise TypeError(f"loss_per_datum must be True or False, got {loss_per_datum!r}")
    kwargs = {"num_data": n if num_data is None else num_data} if accepts else {}
    if model_kwargs is not None:
        if not isinstance(model_kwargs, dict) or not all(isinstance(k, str) for k in model_kwargs):
            raise TypeError(f"model_kwargs must be a dict of keyword arguments, got {model_kwargs!r}")
        taken = ({"num_data"} if accepts else set()) | ({"subsample_size"} if subsample_size is not None else set())
        if taken & set(model_kwargs):
            raise ValueError(f"model_kwargs must not set {sorted(taken & set(model_kwargs))}: train_svi passes them")
        kwargs.update(model_kwargs)
    if subsample_size is not None:
        kwargs["subsample_size"] = subsample_size
    data_size = n if num_data is None else num_data  # N of loss_per_datum
    elbo = getattr(svi.loss_and_grads, "__self__", None)  # SVI keeps the ELBO's bound methods
    if kl_schedule is not None and not hasattr(elbo, "kl_scale"):
        raise TypeError(f"kl_schedule needs an ELBO with a kl_scale attribute, got {type(elbo).__name__}")
    clip_norm, clip_inf_norm = check_clip(clip_norm, clip_inf_norm)
    stepper = SchedulerStepper(svi.optim, scheduler_step)
    modules = _find_modules(svi.model, svi.guide) if modules is None else list(modules)
    if not all(isinstance(m, nn.Module) for m in modules):
        raise TypeError("modules must be nn.Module objects")
    if device is None and dtype is None:
        device, dtype = module_device_dtype(*modules)
    loader_obj = data if loader else None  # whose own generators are part of the random state
    if require_sharded:
        check_joined("train_svi(require_sharded=True)")
    sampler = _data_parallel_sampler(loader_obj)
    if require_sharded and sampler is None and world_size() > 1:
        raise ValueError("data: with several ranks and require_sharded=True the data must be a loader sharded by a "
                         "torch.utils.data.distributed.DistributedSampler (see pyro_sdebnn.distributed."
                         f"distributed_loader), otherwise every rank trains on its own data; got "
                         f"{type(getattr(data, 'sampler', data)).__name__}")
    if sampler is not None:  # several ranks, a sharded loader: gradients averaged, checkpoints on rank 0
        if not isinstance(elbo, pyro.infer.ELBO):
            raise TypeError("svi: data-parallel training needs an SVI built with a pyro.infer.ELBO as its loss, got "
                            f"{type(elbo).__name__}")
        svi = pyro.infer.SVI(svi.model, svi.guide, svi.optim, loss=elbo.loss,  # type: ignore[attr-defined]
                             loss_and_grads=AveragedGradients(elbo, modules).loss_and_grads)
    # every rank saves its own random state: the data-parallel ranks send theirs to rank 0, which writes them all
    ranks, this_rank = (world_size(), rank()) if sampler is not None else (1, 0)
    gather_rng = sampler is not None and checkpoint is not None
    if sampler is not None and not is_main():
        checkpoint, progress = None, False
    checkpoint = None if checkpoint is None else Path(checkpoint)

    if subsample_size is not None:  # the whole data in every step, moved once; the model's plate subsamples
        whole = (move_batch(data[0], device, dtype), move_batch(data[1], device, dtype))
        steps_per_epoch = -(-n // subsample_size)

    def batches():  # (args, kwargs) of every step
        if subsample_size is not None:
            return ((whole, kwargs) for _ in range(steps_per_epoch))
        if loader:  # every batch checked for NaN / Inf: one reduction and one host sync, as the loss already costs
            return iter_model_batches(data, device, dtype, kwargs=kwargs, model=svi.model, check_finite=True)
        return ((xy, kwargs) for xy in _tensor_batches(data[0], data[1], batch_size, shuffle, device, dtype))

    def weighted():  # (args, kwargs, weight) of every step; the weight of its loss in the epoch's mean
        for args, kw in batches():
            yield args, kw, 1 if loss_per_datum else (subsample_size or batch_length(args, kw))

    start, history = first_epoch, list[float]()
    if resume is not None:
        rng = rng_state(loader_obj)
        try:
            first = next(iter(batches()), None)
            if first is None:
                raise ValueError("data: the loader yields no batch")
            start, history = _restore(svi, resume, first[0], first[1], modules, loader_obj, data_size, ranks,
                                      this_rank)
        except BaseException:
            set_rng_state(rng, loader_obj)
            raise
        if start > num_epochs:
            raise ValueError(f"resume: the checkpoint is at epoch {start}, past num_epochs={num_epochs}")
    names: set[str] = set()

    def step(args, kw, where):
        loss, seen = svi_update(svi, args, kw, clip_norm=clip_norm, clip_inf_norm=clip_inf_norm, where=where)
        names.update(seen)
        return loss

    def set_kl_scale(epoch):
        if kl_schedule is not None and elbo is not None:  # (an ELBO with a kl_scale: checked above)
            elbo.kl_scale = float(kl_schedule(epoch))

    for epoch, total, count in svi_epochs(
        step, weighted, start=start, num_epochs=num_epochs,
        stepper=stepper, sampler=sampler, progress=progress, before_epoch=set_kl_scale,
    ):
        epoch_loss = total / (count * data_size) if loss_per_datum else total / count
        history.append(epoch_loss)
        stepper.after_epoch(epoch_loss)
        rngs = gather_objects(rng_state(loader_obj)) if gather_rng else None  # on rank 0; None elsewhere
        if checkpoint is not None:
            rngs = rngs or [rng_state(loader_obj)]
            state = _checkpoint_state(svi, names, modules, epoch + 1, history, rngs, data_size)
            save_checkpoint("svi", state, checkpoint)
        if callback is not None:
            callback(epoch, epoch_loss)
    return history
