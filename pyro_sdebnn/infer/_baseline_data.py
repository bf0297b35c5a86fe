# SPDX-License-Identifier: Apache-2.0
"""The data every baseline's ``fit`` and ``predict`` read: tensors or a loader, checked, on the model's device.

- ``_check_data`` (:func:`~pyro_sdebnn.data.loaders.check_tensors`) and :func:`_check_fit_args` validate the
  inputs, targets and training arguments;
- :class:`_TrainingData` is the training data of one ``fit``, read one epoch at a time (random minibatches of
  tensors, or one pass over a loader);
- :func:`_iter_inputs` / :func:`_first_inputs` read the inputs to predict on;
- every batch read, for ``fit`` or ``predict``, goes through
  :func:`~pyro_sdebnn.data.loaders.check_finite_batch`: a NaN or an infinity raises a ``ValueError`` naming
  the argument, the batch and the index (tensors are checked once, whole, so the index is the row of ``x``);
- :func:`_data_parallel_sampler` / :func:`_is_sharded` tell whether a loader is sharded over several ranks
  (:mod:`pyro_sdebnn.distributed`).

Loaders are handled by :mod:`pyro_sdebnn.data.loaders`; this module adds the error messages naming the
argument and the random-state bookkeeping that keeps a peek at a loader from changing any later draw.
"""

from __future__ import annotations

import numbers
from typing import Iterator

import torch
from torch import Tensor, nn

from pyro_sdebnn._comm import data_parallel_sampler, is_sharded
from pyro_sdebnn.data.loaders import (
    check_finite_batch,
    dataset_size,
    is_loader,
    iter_batches,
    minibatch_indices,
    module_device_dtype,
    move_batch,
    rng_state,
    set_rng_state,
)
from pyro_sdebnn.data.loaders import check_tensors as _check_data
from pyro_sdebnn.infer._training import SchedulerStepper, check_clip


def _check_fit_args(n: int, *, num_epochs: int, lr: float, batch_size: int | None, weight_decay: float | None) -> int:
    """Validate the arguments every ``fit`` shares; return the minibatch size (``n`` for ``batch_size=None``).

    ``weight_decay=None`` is accepted (the SVI baselines then keep their prior); otherwise it must be
    non-negative.
    """
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 0:
        raise ValueError(f"num_epochs must be a non-negative integer, got {num_epochs!r}")
    for name, value in (("lr", lr), ("weight_decay", weight_decay)):
        if name == "weight_decay" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    if weight_decay is not None and not weight_decay >= 0:
        raise ValueError(f"weight_decay must be non-negative, got {weight_decay!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral)):
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    size = n if batch_size is None else int(batch_size)
    if size < 1:
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    return size


def _network_training_data(x, y, likelihood: str, *, num_epochs: int, lr: float, batch_size: int | None,
                           weight_decay: float, scheduler_step: str, clip_norm, clip_inf_norm):
    """Check what every ``fit`` of a plain network shares (before any work); return the :class:`_TrainingData`, the
    minibatch size and the checked clipping thresholds ``(clip_norm, clip_inf_norm)``."""
    data = _TrainingData(x, y, likelihood, batch_size)
    size = _check_fit_args(data.n, num_epochs=num_epochs, lr=lr, batch_size=batch_size, weight_decay=weight_decay)
    clip_norm, clip_inf_norm = check_clip(clip_norm, clip_inf_norm)
    SchedulerStepper(None, scheduler_step)  # validates scheduler_step
    return data, size, (clip_norm, clip_inf_norm)

def _is_loader_arg(x, name: str = "x") -> bool:
    """:func:`~pyro_sdebnn.data.loaders.is_loader` with an error naming the argument."""
    try:
        return is_loader(x)
    except TypeError:
        raise TypeError(
            f"{name} must be a torch.Tensor or a loader (an iterable of (x, y) batches whose dataset has a "
            f"length, e.g. torch.utils.data.DataLoader), got {type(x).__name__}"
        ) from None


def _follow_module(x, y, module: nn.Module | None = None, *, device=None, dtype=None):
    """Tensors ``x`` (and ``y``) on the model's device, floating ones in its dtype, as a loader's batches are moved
    (integer labels keep their dtype); a loader is returned as it is. The device and dtype are those of the first
    parameter of ``module``, or ``device`` / ``dtype``; without either nothing moves. Tensors already there are
    returned themselves (no copy), so the numbers of every run whose data matched the model are unchanged."""
    if _is_loader_arg(x):
        return x, y
    if module is not None:
        device, dtype = module_device_dtype(module)
    if device is None and dtype is None:
        return x, y
    return move_batch(x, device, dtype), (move_batch(y, device, dtype) if isinstance(y, Tensor) else y)


def _module_device_dtype(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    """Device and floating-point dtype of a module's first parameter (where every batch goes); without one, the
    CPU and torch's default dtype."""
    device, dtype = module_device_dtype(module)
    if device is None or dtype is None:
        return torch.device("cpu"), torch.get_default_dtype()
    return device, dtype


class _TrainingData:
    """The training data of ``fit``: tensors ``(x, y)`` or a loader, read one epoch at a time.

    Tensors are split into random minibatches of ``batch_size`` (a fresh ``torch.randperm`` per epoch,
    from torch's global generator); a loader is read as it is (an epoch is one pass over it, its own
    batch size and order), every batch moved to the model's device one at a time.
    """

    def __init__(self, x, y, likelihood: str, batch_size: int | None) -> None:
        self.likelihood = likelihood
        self.x: Tensor | None
        self.y: Tensor | None
        if _is_loader_arg(x):
            if y is not None:
                raise TypeError("y must be omitted when x is a loader: the loader yields the (x, y) batches")
            self.loader, self.x, self.y = x, None, None
            self.n = dataset_size(x)
            self.batch_size = self.n
        else:
            if y is None:
                raise TypeError("y is required when x is a tensor (or pass a loader of (x, y) batches as x)")
            _check_data(x, y, likelihood)
            check_finite_batch(x, y, what="x")  # the whole data set once: the index is the row of x
            self.loader, self.x, self.y = None, x, y
            self.n = x.shape[0]
            self.batch_size = self.n if batch_size is None else batch_size

    @property
    def is_loader(self) -> bool:
        return self.loader is not None

    def batches(self, device=None, dtype=None) -> Iterator[tuple[Tensor, Tensor]]:
        """One epoch of ``(x, y)`` minibatches (loader batches on ``device`` / ``dtype``)."""
        if self.x is not None and self.y is not None:  # tensors (else a loader)
            x, y = self.x, self.y
            for idx in minibatch_indices(self.n, int(self.batch_size), x.device):
                yield x[idx], y[idx]
            return
        for xb, yb in iter_batches(self.loader, device, dtype, check_finite="x"):
            _check_data(xb, yb, self.likelihood)
            yield xb, yb

    def first_batch(self, device=None, dtype=None) -> tuple[Tensor, Tensor]:
        """A batch to read the input shape from (for tensors: the data themselves).

        Reading a loader's first batch draws from torch's global generator (and the loader's own); both
        are put back afterwards, so peeking changes no later random draw (and a resumed run stays exact).
        """
        if self.x is not None and self.y is not None:
            return self.x, self.y
        state = rng_state(self.loader)
        try:
            return next(iter(self.batches(device, dtype)))
        except StopIteration:
            raise ValueError("the loader yielded no batch") from None
        finally:
            set_rng_state(state, self.loader)


def _is_sharded(loader) -> bool:
    """Whether ``loader`` is sharded by a ``DistributedSampler`` over several running ranks (no collective)."""
    if loader is None or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    return is_sharded(loader)


def _data_parallel_sampler(loader):
    """The ``DistributedSampler`` of a data-parallel fit (several ranks, a sharded loader), else ``None``.

    See :mod:`pyro_sdebnn.distributed`.
    """
    if loader is None or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    return data_parallel_sampler(loader)


def _iter_inputs(x, device=None, dtype=None, likelihood: str | None = None) -> Iterator[Tensor]:
    """The inputs to predict on: ``x`` itself (a tensor) or the ``x`` of every batch of a loader."""
    if not _is_loader_arg(x):
        _check_data(x, None, likelihood or "categorical")
        check_finite_batch(x, what="x")
        yield move_batch(x, device, dtype)  # to the model's device and dtype, as a loader's batches
        return
    empty = True
    for xb, _ in iter_batches(x, device, dtype, with_targets=False, check_finite="x"):
        _check_data(xb, None, likelihood or "categorical")
        empty = False
        yield xb
    if empty:  # nothing to predict on: say so, rather than fail to concatenate no outputs
        raise ValueError("x: the loader yielded no batch (fewer points than one batch with drop_last=True, or a "
                         "sampler that draws none?)")


def _first_inputs(x, device=None, dtype=None, likelihood: str | None = None) -> Tensor:
    """The first inputs ``_iter_inputs`` yields, read without changing any random state."""
    if not _is_loader_arg(x):
        return next(_iter_inputs(x, device, dtype, likelihood))
    state = rng_state(x)
    try:
        return next(_iter_inputs(x, device, dtype, likelihood))
    except StopIteration:
        raise ValueError("the loader yielded no batch") from None
    finally:
        set_rng_state(state, x)
