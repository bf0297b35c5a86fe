# SPDX-License-Identifier: Apache-2.0
r"""Process-group set-up for runs launched by ``torchrun``, and the few collectives the package needs.

:func:`init` hides the boilerplate of :func:`torch.distributed.init_process_group`: it reads the environment that
``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), picks the backend
(NCCL when the process has a GPU, gloo otherwise), selects the GPU ``LOCAL_RANK``, seeds the random number
generators (per rank on request) and gives every collective a timeout, so that a rank that dies or never arrives
makes the others raise instead of hanging. Run without ``torchrun`` (no ``WORLD_SIZE`` in the environment) it
starts no process group: :func:`world_size` is 1, :func:`rank` is 0 and every collective is the identity, so the
same script runs unchanged on one process.

The collectives (:func:`all_reduce_mean`, :func:`all_reduce_sum`, :func:`broadcast_`, :func:`gather_objects`,
:func:`barrier`) move their tensors to the device the backend needs (the GPU for NCCL, the CPU for gloo) and back, and
turn a failed or timed-out collective into a :class:`DistributedError` that says which collective failed.

>>> from pyro_sdebnn import distributed
>>> device = distributed.init(seed=0)  # no torchrun: nothing to set up
>>> distributed.world_size(), distributed.rank(), distributed.is_main()
(1, 0, True)
>>> distributed.all_reduce_mean(torch.tensor([1.0, 2.0]))
tensor([1., 2.])
>>> distributed.shutdown()
"""

from __future__ import annotations

import datetime
import math
import os
from typing import Any, Callable

import pyro
import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "DistributedError",
    "all_gather_objects",
    "all_reduce_mean",
    "all_reduce_sum",
    "barrier",
    "broadcast_",
    "gather_objects",
    "init",
    "is_initialized",
    "is_main",
    "local_rank",
    "rank",
    "shutdown",
    "world_size",
]

#: Seconds a collective waits for the other ranks by default before it raises.
DEFAULT_TIMEOUT = 300.0

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
        math.isfinite(timeout) and timeout > 0
    ):
        raise ValueError(f"timeout must be a positive finite number of seconds, got {timeout!r}")
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


def broadcast_(tensor: Tensor, src: int = 0) -> Tensor:
    """Overwrite ``tensor`` in place with its value on rank ``src``; returns it (no-op on one rank).

    :raises DistributedError: if a rank dies or does not arrive within the timeout.
    """
    buf = _collective(tensor, "broadcast", lambda buf: dist.broadcast(buf, src=src))
    if buf is not tensor:
        with torch.no_grad():
            tensor.copy_(buf)
    return tensor


def gather_objects(obj: Any, dst: int = 0) -> list | None:
    """The ``obj`` of every rank, in rank order, on rank ``dst`` (``None`` on the others; ``[obj]`` on one rank).

    The objects travel pickled (:func:`torch.distributed.gather_object`): use it for results within a run (samples,
    ArviZ data), never to read files from elsewhere.

    :raises DistributedError: if a rank dies or does not arrive within the timeout.
    """
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


def shutdown() -> None:
    """Leave the process group (:func:`torch.distributed.destroy_process_group`); no-op without one."""
    if is_initialized():
        dist.destroy_process_group()
