# SPDX-License-Identifier: Apache-2.0
"""Training data as tensors or as a :class:`torch.utils.data.DataLoader`: one way to read both.

Every ``fit`` and ``predict`` of the package accepts either the whole data set as tensors or a
*loader*: any iterable of ``(x, y)`` batches (``(x,)`` or a bare ``x`` for prediction) whose
``dataset`` has a length, such as a :class:`~torch.utils.data.DataLoader` over a torchvision data set
with augmentation. This module holds the three pieces they share:

* ``is_loader`` tells a loader from a tensor;
* ``dataset_size`` is the number of data points :math:`N` (the length of ``loader.dataset``),
  which scales the likelihood of a minibatch of size :math:`b` by :math:`N/b`, exactly as Pyro's
  subsampled :class:`~pyro.plate` does;
* ``iter_batches`` yields the batches one at a time, each moved to the model's device (and
  floating-point inputs to its dtype) with ``non_blocking=True`` when the loader pins memory; the
  whole data set is never copied to the device.

Tensors are read in random minibatches (``minibatch_indices``), and ``module_device_dtype`` says where
the batches go: the model's device and dtype. ``check_tensors`` validates a data set (or a batch) given as
tensors, and :func:`check_finite_batch` rejects a batch (or a whole data set) holding a NaN or an infinity
with a message naming the argument, the batch and the first bad index.

>>> from torch.utils.data import DataLoader, TensorDataset
>>> loader = DataLoader(TensorDataset(torch.randn(10, 3), torch.arange(10)), batch_size=4)
>>> is_loader(loader), dataset_size(loader)
(True, 10)
>>> [tuple(x.shape) for x, y in iter_batches(loader, device="cpu")]
[(4, 3), (4, 3), (2, 3)]
"""

from __future__ import annotations

from typing import Iterable, Iterator, Literal, overload

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["check_finite_batch"]


def is_loader(data) -> bool:
    """``True`` for a loader (an iterable that is not a tensor, array, list, tuple or dict), ``False`` for a tensor.

    :raises TypeError: for anything else (a list of tensors, a NumPy array, ``None``...).
    """
    if isinstance(data, Tensor):
        return False
    if isinstance(data, (list, tuple, dict, str, bytes, np.ndarray)) or not isinstance(data, Iterable):
        raise TypeError(
            "data must be a torch.Tensor or a loader (an iterable of (x, y) batches whose dataset has a "
            f"length, e.g. torch.utils.data.DataLoader), got {type(data).__name__}"
        )
    return True


def dataset_size(loader) -> int:
    """The number of data points :math:`N` behind ``loader``: ``len(loader.dataset)``.

    A :class:`~torch.utils.data.DataLoader` with a ``DistributedSampler`` still reports the global
    :math:`N`, which is what the :math:`N/b` likelihood scaling needs.

    :raises TypeError: if the loader has no ``dataset`` with a length (e.g. an ``IterableDataset``
        of unknown size, or a plain generator): :math:`N` is needed to scale the likelihood.
    :raises ValueError: if the data set is empty.
    """
    dataset = getattr(loader, "dataset", None)
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"the loader ({type(loader).__name__}) must have a `dataset` with a length: the number of data "
            "points N scales the likelihood of each minibatch by N/b; wrap an iterable data set in a "
            "torch.utils.data.DataLoader over a map-style Dataset, or pass the tensors"
        ) from None
    if n < 1:
        raise ValueError(f"the loader's dataset is empty (len(loader.dataset) = {n})")
    return int(n)


def move_batch(t: Tensor, device=None, dtype: torch.dtype | None = None) -> Tensor:
    """Move one batch tensor to ``device`` (floating-point tensors also to ``dtype``).

    Uses ``non_blocking=True`` for pinned memory, so a pinned loader overlaps the copy with compute.
    Integer tensors (labels) keep their dtype.
    """
    if not isinstance(t, Tensor):
        raise TypeError(f"every element of a batch must be a torch.Tensor, got {type(t).__name__}")
    dtype = dtype if (dtype is not None and t.dtype.is_floating_point) else None
    return t.to(device=device, dtype=dtype, non_blocking=t.is_pinned())


@overload
def iter_batches(loader, device=None, dtype: torch.dtype | None = None, *, with_targets: Literal[True] = True,
                 check_finite: str | None = None) -> Iterator[tuple[Tensor, Tensor]]: ...


@overload
def iter_batches(loader, device=None, dtype: torch.dtype | None = None, *, with_targets: bool,
                 check_finite: str | None = None) -> Iterator[tuple[Tensor, Tensor | None]]: ...


def iter_batches(loader, device=None, dtype: torch.dtype | None = None, *, with_targets: bool = True,
                 check_finite: str | None = None) -> Iterator[tuple[Tensor, Tensor | None]]:
    """Yield the ``(x, y)`` batches of ``loader`` one at a time, moved to ``device`` / ``dtype``.

    :param loader: an iterable of ``(x, y)`` pairs (lists or tuples of two tensors); with
        ``with_targets=False``, ``(x,)``, ``(x, y)`` or a bare tensor ``x`` (then ``y`` is ``None``).
    :param device: where each batch goes (the model's device); ``None`` leaves it where it is.
    :param dtype: the model's floating-point dtype (inputs only; integer labels are kept).
    :param str check_finite: if given, the name of the inputs in the caller's signature (``"x"``,
        ``"x_train"``...): every batch then goes through :func:`check_finite_batch` (one device-to-host
        sync per batch; the targets only ``with_targets``).
    :raises TypeError: if a batch is not an ``(x, y)`` pair of tensors.
    :raises ValueError: if ``x`` and ``y`` of a batch differ in their first dimension, or a batch is empty, or
        (with ``check_finite``) a batch holds a NaN or an infinity.
    """
    for i, batch in enumerate(loader):
        if isinstance(batch, Tensor) and not with_targets:
            x, y = batch, None
        elif isinstance(batch, (list, tuple)) and (len(batch) == 2 or (len(batch) == 1 and not with_targets)):
            x, y = batch[0], (batch[1] if len(batch) == 2 else None)
        else:
            what = f"a {type(batch).__name__}" + (f" of length {len(batch)}" if isinstance(batch, (list, tuple)) else "")
            raise TypeError(
                f"batch {i} of the loader is {what}; every batch must be an (x, y) pair of tensors"
                + ("" if with_targets else " (or x alone for prediction)")
            )
        x = move_batch(x, device, dtype)
        if x.dim() == 0 or x.shape[0] == 0:
            raise ValueError(f"batch {i} of the loader is empty or has no batch dimension (x shape {tuple(x.shape)})")
        if y is not None:
            y = move_batch(y, device, dtype)
            if y.shape[:1] != x.shape[:1]:
                raise ValueError(
                    f"batch {i}: x and y must have the same first (batch) dimension, got {tuple(x.shape)} "
                    f"and {tuple(y.shape)}"
                )
        if check_finite is not None:  # targets only when they are used (not for prediction)
            check_finite_batch(x, y if with_targets else None, what=check_finite, batch_index=i)
        yield x, y


def minibatch_indices(n: int, batch_size: int, device=None, *, shuffle: bool = True,
                      generator: torch.Generator | None = None) -> Iterator[Tensor]:
    """The indices of one epoch of minibatches of ``n`` data points: ``batch_size`` at a time, the last maybe fewer.

    With ``shuffle`` the order is a fresh ``torch.randperm(n)`` (from ``generator``, default torch's global one),
    else ``0, 1, ..., n - 1``. The indices live on ``device``, the data's device, so indexing stays there.

    >>> [idx.tolist() for idx in minibatch_indices(5, 2, shuffle=False)]
    [[0, 1], [2, 3], [4]]
    """
    if shuffle:
        order = torch.randperm(n, device=device, generator=generator)
    else:
        order = torch.arange(n, device=device)
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


def module_device_dtype(*modules: nn.Module, buffers: bool = False) -> tuple[torch.device | None, torch.dtype | None]:
    """Device and dtype of the first floating-point parameter of ``modules``: where the model's batches go.

    :param bool buffers: look at the modules' buffers too, after all parameters (for a model without parameters).
    :return: ``(device, dtype)``, or ``(None, None)`` if there is no floating-point tensor to follow (then
        ``move_batch`` leaves a batch where it is).

    >>> module_device_dtype(torch.nn.Linear(2, 1).double())
    (device(type='cpu'), torch.float64)
    """
    tensors: list[torch.Tensor] = [p for m in modules for p in m.parameters()]
    if buffers:
        tensors += [b for m in modules for b in m.buffers()]
    for t in tensors:
        if t.dtype.is_floating_point:
            return t.device, t.dtype
    return None, None


def check_tensors(x: Tensor, y: Tensor | None = None, likelihood: str | None = None) -> None:
    """Validate inputs ``x`` ``(N, ...)`` and targets ``y`` ``(N,)`` (or ``None``) given as tensors.

    :param str likelihood: ``"categorical"`` (``y`` holds integer labels), ``"normal"`` (``y`` is floating
        point) or ``None`` (any dtype).
    :raises TypeError: when ``x`` or ``y`` is not a tensor, or ``y`` has the wrong dtype for the likelihood.
    :raises ValueError: when ``x`` has no feature dimension or ``y`` does not have one entry per row of ``x``.

    >>> check_tensors(torch.randn(4, 2), torch.zeros(3, dtype=torch.long), "categorical")
    Traceback (most recent call last):
    ...
    ValueError: y must have shape (N,) = (4,), got (3,)
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (N, ...) with a feature dimension, got {tuple(x.shape)}")
    if y is None:
        return
    if not isinstance(y, Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
    if y.shape != x.shape[:1]:
        raise ValueError(f"y must have shape (N,) = {tuple(x.shape[:1])}, got {tuple(y.shape)}")
    if likelihood == "categorical" and (y.dtype.is_floating_point or y.dtype == torch.bool):
        raise TypeError(f"categorical labels y must be an integer tensor, got {y.dtype}")
    if likelihood == "normal" and not y.dtype.is_floating_point:
        raise TypeError(f"normal-likelihood targets y must be a floating-point tensor, got {y.dtype}")


def _target_name(what: str) -> str:
    """The name of the targets that go with inputs called ``what``: ``x_train`` -> ``y_train``, ``x`` -> ``y``."""
    return "y" + what[1:] if what.startswith("x") else f"the targets of {what}"


def _first_bad(t: Tensor) -> tuple[str, tuple[int, ...], int]:
    """``("NaN" or "Inf", index of the first non-finite entry, number of non-finite entries)``."""
    t = t.detach()
    bad = ~torch.isfinite(t)
    first = tuple(int(i) for i in bad.nonzero()[0]) if bad.dim() else ()
    return ("NaN" if bool(torch.isnan(t[first])) else "Inf"), first, int(bad.sum())


def check_finite_batch(x: Tensor, y: Tensor | None = None, *, what: str = "x", batch_index: int | None = None) -> None:
    """Reject inputs ``x`` (and floating-point targets ``y``) holding a NaN or an infinity.

    A single non-finite datum turns the loss, its gradient and then every weight into NaN; Pyro would
    report it only later, as an invalid distribution parameter, far from its cause. The check is one
    plain sum per tensor, read back as a Python ``bool``: a NaN or an infinity makes the sum non-finite,
    and a sum is several times cheaper on a CPU than ``torch.isfinite(x).all()``; on a GPU it is one
    device-to-host synchronisation per batch. Only a non-finite sum (a bad entry, or an overflow of
    finite values, which then passes) goes on to the exact element-wise check, which builds the message
    with the index of the first bad entry. Integer targets (class labels) are always finite and not read.

    :param x: the inputs of one batch (or the whole data set given as a tensor).
    :param y: the targets, or ``None``.
    :param str what: the name of ``x`` in the caller's signature (``"x"``, ``"x_train"``...); the targets are
        named after it (``"y_train"``).
    :param int batch_index: the position of the batch in its loader (0-based), or ``None`` for a tensor.
    :raises ValueError: naming the argument, the batch and the first bad index.

    >>> x = torch.zeros(4, 2); x[3, 1] = float("nan")
    >>> check_finite_batch(x, what="x_train", batch_index=2)
    Traceback (most recent call last):
    ...
    ValueError: x_train contains NaN at index (3, 1) of batch 2 of the loader (1 non-finite value in all); ...
    >>> check_finite_batch(torch.zeros(2, 1), torch.tensor([0, 1]))  # integer labels: not read
    """
    check_y = y is not None and (y.is_floating_point() or y.is_complex())
    tensors = [t for t in (x, y if check_y else None) if t is not None and (t.is_floating_point() or t.is_complex())]
    if not tensors or bool(torch.isfinite(torch.stack([t.sum().abs().float() for t in tensors])).all()):
        return
    where = "" if batch_index is None else f" of batch {batch_index} of the loader"
    for name, t in ((what, x), (_target_name(what), y if check_y else None)):
        if t is not None and not bool(torch.isfinite(t).all()):
            kind, first, count = _first_bad(t)
            raise ValueError(
                f"{name} contains {kind} at index {first}{where} ({count} non-finite value"
                f"{'' if count == 1 else 's'} in all); remove or impute the non-finite entries"
            )
