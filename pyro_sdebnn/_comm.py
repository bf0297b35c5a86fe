# SPDX-License-Identifier: Apache-2.0
r"""The bottom layer of distributed runs: process group, ranks, collectives, sharded loaders, gradient averaging.

Everything here depends on :mod:`torch.distributed` only (nothing of :mod:`pyro_sdebnn.infer`), so that the training
loops of :mod:`pyro_sdebnn.infer` import it, and the distributed wrappers of :mod:`pyro_sdebnn.distributed` build on
both. The module is private: :mod:`pyro_sdebnn.distributed` exports what a training script calls (:func:`init`,
:func:`distributed_loader`, :class:`DistributedError`); the rank helpers, the collectives and the gradient averaging
here are the package's own plumbing. The user's guide, :doc:`/distributed`, explains all of it.

:func:`init` joins the process group that ``torchrun`` describes (NCCL with a GPU, gloo otherwise), seeds the
generators and gives every collective a timeout; without ``torchrun`` it starts nothing and every collective is the
identity. The collectives move their tensors to the device the backend needs and back, and turn a failed or
timed-out collective into a :class:`DistributedError` that names it.

A run is *data-parallel* when a process group of more than one rank runs **and** the data is a loader whose sampler
is a :class:`~torch.utils.data.distributed.DistributedSampler`. The training loops then check the set-up
(:func:`data_parallel_sampler`), copy rank 0's parameters to the others (:func:`broadcast_module_`), and average the
gradients and the batch-norm running statistics (:func:`running_stats`) over the ranks in one all-reduce before every
optimiser step (:func:`average_gradients_`). With :math:`W` ranks of equal local batches :math:`B_r` of size
:math:`b/W`, the mean of the ranks' gradients of the mean loss is the gradient of one process on the combined batch:

.. math::

    \frac1W \sum_{r=1}^W \nabla \frac{W}{b} \sum_{i \in B_r} \ell_i(w) = \nabla \frac1b \sum_{i \in B} \ell_i(w),
    \qquad B = \cup_r B_r.

>>> device = init(seed=0)  # no torchrun: nothing to set up
>>> world_size(), rank(), is_main()
(1, 0, True)
>>> all_reduce_mean(torch.tensor([1.0, 2.0]))
tensor([1., 2.])
>>> shutdown()
"""

from __future__ import annotations

import datetime
import math
import os
from typing import Any, Callable, Iterable, Optional

import pyro
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


#: Seconds a collective waits for the other ranks by default before it raises.
DEFAULT_TIMEOUT = 300.0
#: The longest timeout, in seconds (about 31 years): a much longer one overflows ``datetime.timedelta``.
MAX_TIMEOUT = 1e9

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class DistributedError(RuntimeError):
    """A collective failed: another rank died, raised before reaching it, or did not arrive within the timeout."""


def is_initialized() -> bool:
    """Whether a process group is running (set up by :func:`init` or by the user)."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """The number of processes (1 without a process group)."""
    return dist.get_world_size() if is_initialized() else 1


def rank() -> int:
    """The global rank of this process, ``0 <= rank < world_size`` (0 without a process group)."""
    return dist.get_rank() if is_initialized() else 0


def local_rank() -> int:
    """The rank of this process on its machine (``LOCAL_RANK`` set by ``torchrun``; 0 without it)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """``True`` on rank 0, the process that writes checkpoints and outputs."""
    return rank() == 0


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"the environment variable {name} must be an integer (as torchrun sets it), "
                         f"got {value!r}") from None


def _check_timeout(timeout) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
        math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT
    ):
        raise ValueError(f"timeout must be a positive finite number of seconds, at most {MAX_TIMEOUT:g}, got "
                         f"{timeout!r}")
    return float(timeout)


def init(
    backend: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    seed: int | None = None,
    seed_per_rank: bool = True,
) -> torch.device:
    """Join the process group that ``torchrun`` prepared, or do nothing on a single process.

    With ``WORLD_SIZE`` in the environment (``torchrun --nproc_per_node=K script.py``) this calls
    :func:`torch.distributed.init_process_group` with ``init_method="env://"``; without it (a plain ``python
    script.py``) no group is started and the run is a world of one. Calling it again once a group runs (or after the
    user started one) only seeds and returns the device.

    :param str backend: ``"gloo"`` (CPU tensors) or ``"nccl"`` (GPU tensors); default NCCL when CUDA is available
        and NCCL built in, gloo otherwise.
    :param float timeout: seconds every collective waits for the other ranks before raising a
        :class:`DistributedError` (default 300); keep it short in tests so that a dead rank cannot hang them.
    :param int seed: if given, seed PyTorch, NumPy and Python (:func:`pyro.set_rng_seed`) with ``seed + rank()``
        (``seed_per_rank=True``: independent chains, guide samples and dropout masks on every rank) or with ``seed``
        on every rank (``seed_per_rank=False``: the same random numbers everywhere, as a data-parallel chain needs).
    :param bool seed_per_rank: see ``seed``.
    :returns: the device of this rank: ``cuda:LOCAL_RANK`` (made the current CUDA device) with NCCL, else the CPU.
    :raises ValueError: for an unknown backend, a bad timeout, or an incomplete ``torchrun`` environment
        (``WORLD_SIZE`` without ``RANK``, ``MASTER_ADDR`` or ``MASTER_PORT``).
    :raises TypeError: if ``seed`` is not an int.
    """
    timeout = _check_timeout(timeout)
    if backend is not None and backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None (automatic), got {backend!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
    if not is_initialized() and "WORLD_SIZE" in os.environ:
        missing = [name for name in _TORCHRUN_VARS if name not in os.environ]
        if missing:
            raise ValueError(f"WORLD_SIZE is set but not {missing}: launch the script with torchrun (or set "
                             f"{', '.join(_TORCHRUN_VARS)} yourself)")
        size, rank_ = _env_int("WORLD_SIZE"), _env_int("RANK")
        if size < 1 or not 0 <= rank_ < size:
            raise ValueError(f"RANK={rank_} and WORLD_SIZE={size} do not satisfy 0 <= RANK < WORLD_SIZE")
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise ValueError("backend='nccl' needs a GPU; use backend='gloo' on the CPU")
            torch.cuda.set_device(local_rank())
        dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout))
    if seed is not None:
        pyro.set_rng_seed(seed + rank() if seed_per_rank else seed)
    return _device()


def check_joined(what: str) -> None:
    """Refuse to go on when ``torchrun`` launched several processes (``WORLD_SIZE > 1``) but this one has not joined
    their process group (no :func:`init`): each would silently run alone, as a world of one, on all the data.

    :raises RuntimeError: naming ``what`` and the missing :func:`init`.
    """
    launched = os.environ.get("WORLD_SIZE", "").strip()
    if not is_initialized() and launched.isdigit() and int(launched) > 1:
        raise RuntimeError(f"{what}: this process is one of WORLD_SIZE={launched} launched by torchrun, but no process "
                           "group is running, so it would run alone as a world of one; call "
                           "pyro_sdebnn.distributed.init() first")


def _device() -> torch.device:
    """The device of this rank: the current GPU with NCCL (or with CUDA and no group), else the CPU."""
    if is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if not is_initialized() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _comm_device() -> torch.device:
    """Where the tensors of a collective must be: the GPU for NCCL, the CPU for gloo."""
    return _device() if dist.get_backend() == "nccl" else torch.device("cpu")


def _fail(what: str, err: BaseException) -> DistributedError:
    return DistributedError(
        f"pyro_sdebnn.distributed: {what} failed on rank {rank()} of {world_size()}: another rank died, raised before "
        f"reaching it, or did not arrive within the timeout given to init(). Cause: {type(err).__name__}: {err}"
    )


def barrier() -> None:
    """Wait until every rank arrives here (no-op without a process group).

    :raises DistributedError: if a rank dies or does not arrive within the timeout.
    """
    if world_size() == 1:
        return
    try:
        # a barrier as a tiny all-reduce: gloo's and NCCL's own barrier ignore the group's timeout in some versions
        dist.all_reduce(torch.zeros(1, device=_comm_device()))
    except (RuntimeError, ValueError) as err:
        raise _fail("barrier", err) from err


def _collective(tensor: Tensor, what: str, op: Callable[[Tensor], Any]) -> Tensor:
    """``op`` run on a copy of ``tensor`` on the communication device, returned (``tensor`` itself on one rank)."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if world_size() == 1:
        return tensor
    buf = tensor.detach().to(_comm_device(), copy=True)
    try:
        op(buf)
    except (RuntimeError, ValueError) as err:
        raise _fail(f"{what} of a {tuple(tensor.shape)} tensor", err) from err
    return buf


def _all_reduce(tensor: Tensor) -> Tensor:
    """The sum of ``tensor`` over the ranks, a copy on the communication device (``tensor`` on one rank)."""
    return _collective(tensor, "all_reduce", lambda buf: dist.all_reduce(buf, op=dist.ReduceOp.SUM))


def all_reduce_mean(tensor: Tensor) -> Tensor:
    """The mean of ``tensor`` over the ranks, returned on the device and dtype of ``tensor`` (identity on one rank).

    Every rank must call it with a tensor of the same shape and dtype.

    :raises TypeError: if ``tensor`` is not a tensor.
    :raises DistributedError: if a rank dies or does not arrive within the timeout.
    """
    total = _all_reduce(tensor)
    return total if world_size() == 1 else (total / world_size()).to(tensor.device)


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """The sum of ``tensor`` over the ranks, returned on the device and dtype of ``tensor`` (identity on one rank).

    Every rank must call it with a tensor of the same shape and dtype.

    :raises TypeError: if ``tensor`` is not a tensor.
    :raises DistributedError: if a rank dies or does not arrive within the timeout.
    """
    return _all_reduce(tensor).to(tensor.device)


def _check_rank(name: str, value: Any) -> None:
    """``value`` must be an int, and a rank of the running group (any int on one process, where it is unused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (a rank), got {type(value).__name__}")
    if world_size() > 1 and not 0 <= value < world_size():
        raise ValueError(f"{name} must be a rank in [0, {world_size() - 1}] of this world of {world_size()}, "
                         f"got {value}")


def broadcast_(tensor: Tensor, src: int = 0) -> Tensor:
    """Overwrite ``tensor`` in place with its value on rank ``src``; returns it (no-op on one rank).

    :raises ValueError: if ``src`` is not a rank of the group (a ``TypeError`` if not an int).
    :raises DistributedError: if a rank dies or does not arrive within the timeout.
    """
    _check_rank("src", src)
    buf = _collective(tensor, "broadcast", lambda buf: dist.broadcast(buf, src=src))
    if buf is not tensor:
        with torch.no_grad():
            tensor.copy_(buf)
    return tensor


def gather_objects(obj: Any, dst: int = 0) -> list | None:
    """The ``obj`` of every rank, in rank order, on rank ``dst`` (``None`` on the others; ``[obj]`` on one rank).

    The objects travel pickled (:func:`torch.distributed.gather_object`): use it for results within a run (samples,
    ArviZ data), never to read files from elsewhere.

    :raises ValueError: if ``dst`` is not a rank of the group (a ``TypeError`` if not an int).
    :raises DistributedError: if a rank dies or does not arrive within the timeout.
    """
    _check_rank("dst", dst)
    if world_size() == 1:
        return [obj]
    out = [None] * world_size() if rank() == dst else None
    try:
        dist.gather_object(obj, out, dst=dst)
    except (RuntimeError, ValueError) as err:
        raise _fail("gather_object", err) from err
    return out


def all_gather_objects(obj: Any) -> list:
    """The ``obj`` of every rank, in rank order, on every rank (small objects: shapes, names, counts)."""
    if world_size() == 1:
        return [obj]
    out: list = [None] * world_size()
    try:
        dist.all_gather_object(out, obj)
    except (RuntimeError, ValueError) as err:
        raise _fail("all_gather_object", err) from err
    return out


def shutdown(wait: bool = True) -> None:
    """Leave the process group (:func:`torch.distributed.destroy_process_group`); no-op without one.

    :param bool wait: first wait for every rank (:func:`torch.distributed.barrier`), so that no rank tears down its
        connections while another still uses them: a gloo rank whose peer left first can abort at exit ("terminate
        called without an active exception", status -6) after a run that succeeded. Pass ``False`` on an error path,
        where the other ranks may be inside another collective.
    """
    if is_initialized():
        if wait:
            try:
                dist.barrier()
            except (RuntimeError, ValueError):  # a rank died or timed out: leave anyway
                pass
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- data-parallel fit
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
        :func:`pyro_sdebnn.infer.train_svi` does).
    :param int seed: the seed of the sampler's permutations (the same on every rank).
    :param bool drop_last: drop the tail of the data set that does not divide into the ranks; otherwise the
        sampler repeats up to ``world_size() - 1`` points so that all the ranks take the same number of steps.
    :param loader_kwargs: passed to ``DataLoader`` (``num_workers``, ``pin_memory``, ``generator``, ...).
    :raises ValueError: if ``batch_size`` is not a positive multiple of the world size.
    :raises RuntimeError: under ``torchrun`` (``WORLD_SIZE > 1``) before :func:`init` joined the process group.

    >>> from torch.utils.data import TensorDataset
    >>> loader = distributed_loader(TensorDataset(torch.arange(10.0), torch.zeros(10)), 4, shuffle=False)
    >>> [x.tolist() for x, _ in loader]  # one process: the whole batch
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    """
    check_joined("distributed_loader")
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
