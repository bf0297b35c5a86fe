# SPDX-License-Identifier: Apache-2.0
"""Training data as tensors or as a :class:`torch.utils.data.DataLoader`: one way to read both.

Every ``fit`` and ``predict`` of the package, ``mcmc.run`` and ``train_svi`` accept either the whole data set as
tensors or a *loader*: any iterable of batches whose ``dataset`` has a length :math:`N`, which scales the likelihood
of a minibatch of size :math:`b` by :math:`N/b`, as Pyro's subsampled :class:`~pyro.plate` does. Batches are moved
to the model's device one at a time, so the whole data set is never copied there. The networks read ``(x, y)``
batches (``iter_batches``); a Pyro model is called on each batch by one rule (``batch_arguments``): a tuple
or list batch as ``model(*batch)``, a dict as ``model(**batch)``, a single tensor as ``model(batch)``.

>>> from torch.utils.data import DataLoader, TensorDataset
>>> loader = DataLoader(TensorDataset(torch.randn(10, 3), torch.arange(10)), batch_size=4)
>>> is_loader(loader), dataset_size(loader)
(True, 10)
>>> [tuple(x.shape) for x, y in iter_batches(loader, device="cpu")]
[(4, 3), (4, 3), (2, 3)]
"""

from __future__ import annotations

import inspect
import random
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, NoReturn, Sequence, overload

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["check_finite_batch"]


def is_loader(data) -> bool:
    """``True`` for a loader (an iterable that is not a tensor, array, list, tuple or dict), ``False`` for a tensor.

    :raises TypeError: for anything else (a list of tensors, a NumPy array, ``None``...).
    """
    if isinstance(data, Tensor):
        return False
    if isinstance(data, (list, tuple, dict, str, bytes, np.ndarray)) or not isinstance(data, Iterable):
        raise TypeError("data must be a torch.Tensor or a loader (an iterable of batches whose dataset has a length, "
                        f"e.g. torch.utils.data.DataLoader), got {type(data).__name__}")
    return True


def dataset_size(loader) -> int:
    """The number of data points :math:`N` behind ``loader``: ``len(loader.dataset)`` (the global :math:`N` under a
    ``DistributedSampler``, as the :math:`N/b` likelihood scaling needs).

    :raises TypeError: if the loader has no ``dataset`` with a length (e.g. an ``IterableDataset`` of unknown size, or
        a plain generator).
    :raises ValueError: if the data set is empty.
    """
    dataset = getattr(loader, "dataset", None)
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"the loader ({type(loader).__name__}) must have a `dataset` with a length: the number of data "
                        "points N scales the likelihood of each minibatch by N/b; wrap an iterable data set in a "
                        "torch.utils.data.DataLoader over a map-style Dataset, or pass the tensors") from None
    if n < 1:
        raise ValueError(f"the loader's dataset is empty (len(loader.dataset) = {n})")
    return int(n)


def move_batch(t: Tensor, device=None, dtype: torch.dtype | None = None) -> Tensor:
    """Move one batch tensor to ``device`` (floating-point tensors also to ``dtype``; integer labels keep theirs),
    without blocking from pinned memory, so that a pinned loader overlaps the copy with compute."""
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

    :param loader: an iterable of ``(x, y)`` pairs (lists or tuples of two tensors); with ``with_targets=False``,
        ``(x,)``, ``(x, y)`` or a bare tensor ``x`` (then ``y`` is ``None``).
    :param device: where each batch goes (the model's device); ``None`` leaves it where it is.
    :param dtype: the model's floating-point dtype (inputs only; integer labels are kept).
    :param str check_finite: if given, the name of the inputs in the caller's signature (``"x"``, ``"x_train"``...):
        every batch then goes through :func:`check_finite_batch` (the targets only ``with_targets``).
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
            length = f" of length {len(batch)}" if isinstance(batch, (list, tuple)) else ""
            raise TypeError(f"batch {i} of the loader is a {type(batch).__name__}{length}; every batch must be an "
                            "(x, y) pair of tensors" + ("" if with_targets else " (or x alone for prediction)"))
        x = move_batch(x, device, dtype)
        if x.dim() == 0 or x.shape[0] == 0:
            raise ValueError(f"batch {i} of the loader is empty or has no batch dimension (x shape {tuple(x.shape)})")
        if y is not None:
            y = move_batch(y, device, dtype)
            if y.shape[:1] != x.shape[:1]:
                raise ValueError(f"batch {i}: x and y must have the same first (batch) dimension, got "
                                 f"{tuple(x.shape)} and {tuple(y.shape)}")
        if check_finite is not None:
            check_finite_batch(x, y if with_targets else None, what=check_finite, batch_index=i)
        yield x, y


def _leaves(value: Any) -> list:
    """The leaves of one argument: itself for a tensor (the common case, without the cost of a pytree pass)."""
    return [value] if isinstance(value, Tensor) else tree_flatten(value)[0]


def _parameters(model: Callable) -> list[inspect.Parameter] | None:
    """The parameters of ``model`` (of its ``forward`` for a module), ``None`` where they cannot be read."""
    fn = model.forward if isinstance(model, nn.Module) else model
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def _named(args: tuple, kwargs: Mapping[str, Any], model: Callable | None, unknown: str = "batch") -> list:
    """``(name, value)`` of every argument, a positional one named after the model's parameter (``batch[i]`` where
    unknown)."""
    params = (_parameters(model) if model is not None else None) or ()
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [positional[i] if i < len(positional) else f"{unknown}[{i}]" for i in range(len(args))]
    return list(zip(names, args)) + list(kwargs.items())


def read_batch(batch: Any, batch_index: int | None = None, *, kwargs: Mapping[str, Any] | None = None,
               model: Callable | None = None) -> tuple[list, Any, int]:
    """One batch of a loader, read by the rule of :func:`batch_arguments` and checked in one pass: ``(tensors, spec,
    b)``, its tensors in the order of ``tree_flatten((args, kwargs))``, its structure (equal for batches of the same
    form) and its batch dimension. :func:`arguments` turns the tensors back into ``(args, kwargs)``. Parameters and
    errors: those of :func:`batch_arguments`."""
    where = "the batch" if batch_index is None else f"batch {batch_index} of the loader"
    args: tuple
    kw: dict[str, Any]
    if isinstance(batch, Tensor):
        args, kw = (batch,), {}
    elif isinstance(batch, (tuple, list)):
        args, kw = tuple(batch), {}
    elif isinstance(batch, Mapping):
        keys = list(batch)
        if not all(isinstance(k, str) for k in keys):
            raise TypeError(f"{where} is a dict with keys {keys!r}: a dict batch is passed as model(**batch), so its "
                            "keys must be the model's argument names (strings)")
        args, kw = (), dict(batch)
    else:
        raise TypeError(f"{where} is a {type(batch).__name__}; a batch must be a tuple or list (called as "
                        "model(*batch)), a dict (model(**batch)) or a tensor (model(batch)), as torch's default "
                        "collate builds them")
    values = (*args, *kw.values())
    spec: Any
    if all(isinstance(v, Tensor) for v in values):  # flat: no pytree pass
        leaves, spec = list(values), (len(args), tuple(kw))
    else:
        leaves, spec = tree_flatten((args, kw))
    sizes = {t.shape[0] if isinstance(t, Tensor) and t.dim() else 0 for t in leaves}
    if len(sizes) != 1 or 0 in sizes:
        _structure_error(args, kw, where, model)
    both = sorted(set(kw) & set(kwargs)) if kwargs else []
    if both:
        raise ValueError(f"{where} is a dict with the keys {both}, which are also given as keyword arguments")
    params = _parameters(model) if model is not None else None
    if params is not None:
        try:
            inspect.Signature(params).bind(*args, **kw, **(kwargs or {}))
        except TypeError as e:
            shape = (f"a dict with keys {list(batch)}, passed as model(**batch)" if isinstance(batch, Mapping)
                     else "a tensor, passed as model(batch)" if isinstance(batch, Tensor)
                     else f"a {type(batch).__name__} of length {len(args)}, passed as model(*batch)")
            extra = f" with the keyword arguments {sorted(kwargs)}" if kwargs else ""
            raise TypeError(f"{where} is {shape}{extra}, which does not fit the model's parameters "
                            f"({', '.join(str(p) for p in params)}): {e}") from None
    return leaves, spec, sizes.pop()


def _structure_error(args: tuple, kwargs: dict[str, Any], where: str, model: Callable | None) -> NoReturn:
    """Raise the error for a batch whose leaves are not tensors sharing a non-empty first dimension, naming them."""
    sizes: list[tuple[str, int]] = []
    for name, value in _named(args, kwargs, model):
        for leaf in _leaves(value):
            if not isinstance(leaf, Tensor):
                raise TypeError(f"{where}: argument {name!r} holds a {type(leaf).__name__}, not a tensor; every "
                                "element of a batch must be a tensor (turn the data set's items into tensors, or drop "
                                "this field in a collate_fn)")
            if leaf.dim() == 0 or leaf.shape[0] == 0:
                raise ValueError(f"{where} is empty or has no batch dimension (argument {name!r} has shape "
                                 f"{tuple(leaf.shape)})")
            sizes.append((name, int(leaf.shape[0])))
    if not sizes:
        raise TypeError(f"{where} holds no tensor")
    listed = ", ".join(f"{name!r}: {b}" for name, b in sizes)
    raise ValueError(f"{where}: its tensors must share their first (batch) dimension, as torch's default collate "
                     f"builds them (the likelihood of the batch is scaled by N/b), got {listed}")


def check_same_structure(spec: Any, first: Any, batch_index: int) -> None:
    """A batch of structure ``spec`` (:func:`read_batch`) must have the first batch's, ``first``."""
    if spec != first:
        raise ValueError(f"batch {batch_index} of the loader has another structure than its first batch (the model's "
                         f"arguments must be the same in every batch): {spec} against {first}")


def arguments(leaves: Sequence, spec: Any) -> tuple[tuple, dict[str, Any]]:
    """The model's ``(args, kwargs)`` from the tensors ``leaves`` of a batch of structure ``spec`` (``read_batch``)."""
    if isinstance(spec, tuple):  # flat: (number of positional arguments, keys)
        n, keys = spec
        return tuple(leaves[:n]), dict(zip(keys, leaves[n:]))
    return tree_unflatten(list(leaves), spec)


def leaf_names(spec: Any, count: int, model: Callable | None = None, *, label: str = "{}",
               unknown: str = "batch") -> list[str]:
    """The name of each of the ``count`` leaves of arguments of structure ``spec``, for messages: ``label`` filled with
    the name of the model's argument that holds it, followed by ``(its tensor k)`` in an argument of several."""
    args, kw = arguments(range(count), spec)  # the leaves' positions, in the arguments' structure
    names = [""] * count
    for name, value in _named(args, kw, model, unknown):
        positions = _leaves(value)
        for k, i in enumerate(positions):
            names[i] = label.format(name) + ("" if len(positions) == 1 else f" (its tensor {k})")
    return names


def batch_arguments(batch: Any, batch_index: int | None = None, *, kwargs: Mapping[str, Any] | None = None,
                    model: Callable | None = None) -> tuple[tuple, dict[str, Any]]:
    """The model's arguments ``(args, kwargs)`` for one batch of a loader, called as ``model(*args, **kwargs)``: the
    one rule of the package, for the structures torch's default collation builds:

    * a tuple or a list (a data set of tuples, e.g. a :class:`~torch.utils.data.TensorDataset`): ``model(*batch)``,
      e.g. ``model(x, y)`` or ``model(x, t, y)``;
    * a dict (a data set of dicts): ``model(**batch)``, its keys being the model's argument names;
    * a single tensor (a data set of tensors): ``model(batch)``.

    Every leaf of the batch (nested tuples, lists and dicts included) must be a tensor, and all of them must share
    their first dimension, the batch dimension :math:`b`: the likelihood of the batch is scaled by :math:`N/b`.

    :param batch: one batch of a loader.
    :param int batch_index: its position in the loader (0-based), for the messages.
    :param dict kwargs: keyword arguments passed to the model besides the batch (e.g. those of ``mcmc.run``),
        after the batch's own.
    :param callable model: if given, the call is checked against its signature (once, on a loader's first batch).
    :raises TypeError: for another structure, a leaf that is not a tensor (a batch of strings, say), a dict key
        that is not a string, or a call that does not fit the model's signature (naming the batch's keys or length
        and the model's parameters).
    :raises ValueError: if the tensors do not share a non-empty first dimension (naming them), or a key of a dict
        batch is also among ``kwargs``.

    >>> x, t, y = torch.zeros(4, 3), torch.ones(4), torch.zeros(4)
    >>> [tuple(a.shape) for a in batch_arguments([x, t, y])[0]]
    [(4, 3), (4,), (4,)]
    >>> args, kw = batch_arguments({"x": x, "y": y}, kwargs={"num_data": 100})
    >>> args, sorted(kw)
    ((), ['num_data', 'x', 'y'])
    >>> batch_arguments({"x": x, "y": y[:3]}, 2)
    Traceback (most recent call last):
    ...
    ValueError: batch 2 of the loader: its tensors must share their first (batch) dimension, ...
    """
    leaves, spec, _ = read_batch(batch, batch_index, kwargs=kwargs, model=model)
    args, kw = arguments(leaves, spec)
    return args, {**kw, **(kwargs or {})}


def batch_length(args: tuple, kwargs: Mapping[str, Any] | None = None) -> int:
    """The batch dimension :math:`b` of arguments from ``batch_arguments``: the first dimension of their first
    tensor, positional arguments first (they all share it)."""
    for value in (*args, *(kwargs or {}).values()):
        for leaf in _leaves(value):
            if isinstance(leaf, Tensor):
                return int(leaf.shape[0])
    raise ValueError("the arguments hold no tensor")


def iter_model_batches(loader, device=None, dtype: torch.dtype | None = None, *,
                       kwargs: Mapping[str, Any] | None = None, model: Callable | None = None,
                       check_finite: bool = False) -> Iterator[tuple[tuple, dict[str, Any]]]:
    """Yield the model's arguments ``(args, kwargs)`` of every batch of ``loader`` (``batch_arguments``), moved
    to ``device`` / ``dtype`` (floating-point tensors only).

    :param dict kwargs: keyword arguments passed to the model besides each batch (after a dict batch's own entries;
        neither moved nor checked).
    :param model: the model: the first batch is checked against its signature, and a non-finite batch is reported
        under the names of its parameters.
    :param bool check_finite: every batch goes through ``check_finite_tensors``.
    """
    extra = dict(kwargs or {})
    for i, raw in enumerate(loader):
        leaves, spec, _ = read_batch(raw, i, kwargs=extra, model=model if i == 0 else None)
        if check_finite:
            check_finite_tensors(leaves, lambda: leaf_names(spec, len(leaves), model), batch_index=i)
        args, own = arguments([move_batch(t, device, dtype) for t in leaves], spec)
        yield args, {**own, **extra}


def minibatch_indices(n: int, batch_size: int, device=None, *, shuffle: bool = True,
                      generator: torch.Generator | None = None) -> Iterator[Tensor]:
    """The indices of one epoch of minibatches of ``n`` data points: ``batch_size`` at a time, the last maybe fewer.

    With ``shuffle`` the order is a fresh ``torch.randperm(n)`` (from ``generator``, default torch's global one),
    else ``0, 1, ..., n - 1``. The indices live on ``device``, the data's device.

    >>> [idx.tolist() for idx in minibatch_indices(5, 2, shuffle=False)]
    [[0, 1], [2, 3], [4]]
    """
    order = torch.randperm(n, device=device, generator=generator) if shuffle else torch.arange(n, device=device)
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


def check_finite_tensors(tensors: Sequence, names: Callable[[], Sequence[str]], *, batch_index: int | None = None,
                         advice: str = "") -> None:
    """Reject floating-point (or complex) tensors holding a NaN or an infinity: the one finite-data check of the
    package (:func:`check_finite_batch`, a loader's batches for SVI and SG-MCMC, the model's arguments of
    ``MinibatchPotential``).

    A single non-finite datum turns the loss, its gradient and then every weight into NaN, which Pyro would report
    only later, as an invalid distribution parameter. The check is one sum per tensor and one read-back of their
    total; only a non-finite total (a bad entry, or an overflow of finite values, which then passes) goes on to the
    element-wise check that finds the first bad entry.

    :param tensors: the values to check (anything but a floating-point or complex tensor is passed over).
    :param names: called only to build a message: the name of each of ``tensors``.
    :param int batch_index: the position of the batch in its loader (0-based), or ``None`` for tensors.
    :param str advice: appended to the message.
    :raises ValueError: naming the tensor, the batch and the first bad index.
    """
    total: Tensor | None = None
    for t in tensors:
        if isinstance(t, Tensor) and (t.is_floating_point() or t.is_complex()):
            total = t.sum() if total is None else total + t.sum()
    if total is None or bool(torch.isfinite(total)):
        return
    where = "" if batch_index is None else f" of batch {batch_index} of the loader"
    for name, t in zip(names(), tensors):
        if isinstance(t, Tensor) and (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            t = t.detach()
            bad = ~torch.isfinite(t)
            first = tuple(int(i) for i in bad.nonzero()[0]) if bad.dim() else ()
            count = int(bad.sum())
            kind = "NaN" if bool(torch.isnan(t[first])) else "Inf"
            raise ValueError(f"{name} contains {kind} at index {first}{where} ({count} non-finite value"
                             f"{'' if count == 1 else 's'} in all); remove or impute the non-finite entries{advice}")


def check_finite_batch(x: Tensor, y: Tensor | None = None, *, what: str = "x", batch_index: int | None = None) -> None:
    """Reject inputs ``x`` (and floating-point targets ``y``) holding a NaN or an infinity
    (``check_finite_tensors``). Integer targets (class labels) are always finite and not read.

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
    check_finite_tensors((x, y), lambda: (what, "y" + what[1:] if what.startswith("x") else f"the targets of {what}"),
                         batch_index=batch_index)


# ----- the random state a run over data reads ------------------------------------------------------------------------
def loader_generators(loader: Any) -> list[torch.Generator]:
    """The ``torch.Generator`` objects a loader draws its order from, each once, in a fixed order: the loader's own
    (``DataLoader(..., generator=g)``, which also seeds the workers), its sampler's and its batch sampler's
    sampler's (``RandomSampler(data, generator=g)``, ``SubsetRandomSampler``, ``WeightedRandomSampler``).

    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> g = torch.Generator().manual_seed(0)
    >>> loader = DataLoader(TensorDataset(torch.zeros(4)), batch_size=2, shuffle=True, generator=g)
    >>> loader_generators(loader) == [g]
    True
    """
    batch_sampler = getattr(loader, "batch_sampler", None)
    owners = (loader, getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None))
    found: list[torch.Generator] = []
    for owner in owners:
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not h for h in found):
            found.append(g)
    return found


def rng_state(loader: Any = None) -> dict:
    """Every random state a training run reads, as tensors, numbers and lists (``weights_only``-loadable): torch's
    CPU generator (uint8 tensor), the CUDA ones if initialised, NumPy's and Python's, and the loader's own
    generators (:func:`loader_generators`). Every checkpoint of the package stores this capture, so that a run over
    data resumes bitwise."""
    version, mt, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if cuda else [],
        "numpy": {"name": str(np_name), "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
                  "pos": int(np_pos), "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "random": {"version": int(version), "state": list(mt), "gauss": gauss},
        "loader": [g.get_state() for g in loader_generators(loader)] if loader is not None else [],
    }


def set_rng_state(state: dict, loader: Any = None) -> None:
    """Restore what ``rng_state`` captured (the loader's generators only if it has as many)."""
    gens = loader_generators(loader) if loader is not None else []
    saved = state.get("loader", [])
    if gens and saved and len(gens) != len(saved):
        raise ValueError(f"the loader has {len(gens)} torch.Generator(s) but the interrupted run's had {len(saved)}; "
                         "resume with a loader built the same way")
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    if "numpy" in state:
        npy = state["numpy"]
        np.random.set_state((npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                             npy["gauss"]))
    if "random" in state:
        rnd = state["random"]
        random.setstate((rnd["version"], tuple(rnd["state"]), rnd["gauss"]))
    for gen, gen_state in zip(gens, saved):
        gen.set_state(gen_state.cpu())
