# SPDX-License-Identifier: Apache-2.0
"""Checkpoints of the package: one file format, one atomic writer, one reader, one capture of the random state.

Every checkpoint the package writes -- a fitted baseline's (``method.save(path)``), a
:func:`~pyro_sdebnn.infer.train_svi` run's (``checkpoint=path``), an SG-MCMC run's
(:func:`~pyro_sdebnn.infer.mcmc.save_run`, :class:`~pyro_sdebnn.infer.mcmc.checkpoint.CheckpointHook`) -- is one
dictionary in one envelope::

    {"format": "pyro_sdebnn/<kind>", "version": 1, ...the state of that kind...}

with ``<kind>`` one of ``KINDS`` (``"baseline"``, ``"svi"``, ``"sgmcmc"``). It holds only tensors, numbers,
strings, lists and dictionaries (no pickled objects, constraints or closures), so that
``torch.load(path, weights_only=True)`` reads it. ``save_checkpoint`` writes it atomically (to a temporary file in
the same folder, then moved into place: an interrupted write leaves the previous checkpoint);
:func:`load_checkpoint` reads it back and checks the envelope: a file of another kind or version, or not a checkpoint
at all (truncated, corrupted), raises a ``ValueError`` naming the format and version expected.

The training state a checkpoint needs to *resume* bitwise includes every random state a run reads: ``rng_state``
captures torch's CPU generator, every initialised CUDA device's, NumPy's, Python's, and the ``torch.Generator`` objects
a loader shuffles with (``DataLoader(generator=...)``, its sampler's); ``set_rng_state`` restores them. They live with
the loaders (:mod:`pyro_sdebnn.data.loaders`), below the samplers and trainers that capture them.

Fitted baselines (``MAPEstimate``, ``MeanFieldVI``, ``MCDropout``, ``DeepEnsemble``, ``Laplace``) save the method's
class name (checked on load), the fitted state and the training state (kind ``"baseline"``), so that
``fit(..., resume=True)`` continues a run bitwise on CPU (:doc:`/methods/baselines`).

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "state.pt")
>>> save_checkpoint("svi", {"epoch": 3}, path)
>>> sorted(torch.load(path, weights_only=True).items())
[('epoch', 3), ('format', 'pyro_sdebnn/svi'), ('version', 1)]
>>> load_checkpoint(path, "sgmcmc")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: ...is a checkpoint of format 'pyro_sdebnn/svi' version 1, expected format 'pyro_sdebnn/sgmcmc' version 1
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor


__all__ = ["load_checkpoint"]

#: The version of the checkpoint layout written by this version of the package (the ``"version"`` entry).
CHECKPOINT_VERSION = 1

#: The kinds of checkpoint: the ``<kind>`` of the ``"format"`` entry ``"pyro_sdebnn/<kind>"``.
KINDS = ("baseline", "svi", "sgmcmc")


def _format(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return f"pyro_sdebnn/{kind}"


def _check_path(path) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)


def envelope(kind: str) -> dict:
    """The entries every checkpoint of ``kind`` starts with: ``{"format": "pyro_sdebnn/<kind>", "version": n}``."""
    return {"format": _format(kind), "version": CHECKPOINT_VERSION}


def check_envelope(state, kind: str | None, where: str = "the checkpoint") -> None:
    """Check that ``state`` is a checkpoint dictionary of ``kind`` (any kind for ``None``) and of this version.

    :raises ValueError: naming the format and version found and those expected.
    """
    expected = None if kind is None else _format(kind)
    fmt = state.get("format") if isinstance(state, dict) else None
    version = state.get("version") if isinstance(state, dict) else None
    ours = isinstance(fmt, str) and fmt.startswith("pyro_sdebnn/") and fmt[len("pyro_sdebnn/"):] in KINDS
    if not ours or (expected is not None and fmt != expected) or version != CHECKPOINT_VERSION:
        found = f"a checkpoint of format {fmt!r} version {version!r}" if fmt is not None else "not a checkpoint"
        wanted = f"format {expected!r}" if expected else "format 'pyro_sdebnn/<kind>'"
        raise ValueError(f"{where} is {found}, expected {wanted} version {CHECKPOINT_VERSION}")


def save_checkpoint(kind: str, state: dict, path) -> None:
    """Write ``{"format": "pyro_sdebnn/<kind>", "version": CHECKPOINT_VERSION, **state}`` to ``path`` with
    :func:`torch.save`, atomically: it goes to a temporary file in the same folder first and replaces ``path`` only
    once complete, so an interrupted write leaves the previous checkpoint.

    :param str kind: one of ``KINDS``.
    :param dict state: tensors, numbers, strings, lists and dictionaries only (what ``weights_only=True`` loads);
        its ``"format"`` and ``"version"`` entries, if it has them, must be those of ``envelope(kind)``.
    :raises ValueError: for an unknown ``kind`` or a ``state`` holding another envelope.
    """
    header = envelope(kind)
    if not isinstance(state, dict) or any(state.get(k, v) != v for k, v in header.items()):
        raise ValueError(f"state must be a dict whose 'format' and 'version', if any, are {header}")
    path = _check_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save({**header, **state}, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path, kind: str | None = None, map_location=None) -> dict:
    """Read a checkpoint written by ``save_checkpoint`` with ``torch.load(..., weights_only=True)``.

    :param path: the file.
    :param str kind: the kind expected (one of ``KINDS``); ``None`` accepts any kind of this version.
    :param map_location: passed to :func:`torch.load`.
    :returns: the checkpoint dictionary, envelope included.
    :raises FileNotFoundError: if ``path`` does not exist.
    :raises ValueError: if the file cannot be read as a checkpoint (truncated, corrupted), holds CUDA tensors on a
        machine without CUDA (the message names ``map_location``) or is of another format or version than expected
        (the message names both).
    """
    path = _check_path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {os.fspath(path)!r}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except RuntimeError as err:
        if "on a CUDA device" not in str(err) or torch.cuda.is_available():
            raise _unreadable(path, err) from None
        raise ValueError(f"{os.fspath(path)!r} holds tensors saved on a CUDA device and this machine has no CUDA: "
                         "pass map_location='cpu' (or the device to load them to)") from None
    except Exception as err:  # truncated zip, bad pickle, unsupported globals, ...
        raise _unreadable(path, err) from None
    check_envelope(state, kind, repr(os.fspath(path)))
    return state


def _unreadable(path, err: Exception) -> ValueError:
    return ValueError(f"{os.fspath(path)!r} is not a readable checkpoint (truncated or corrupted file?): "
                      f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")


def check_tensors(saved, current: dict[str, Tensor], what: str) -> None:
    """Check that ``saved`` maps the same names to tensors of the same shapes as ``current``."""
    if not isinstance(saved, dict):
        raise ValueError(f"the checkpoint's {what} is not a dictionary of tensors")
    if set(saved) != set(current):
        missing, extra = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
        raise ValueError(f"the checkpoint's {what} do not match this model: missing {missing}, unexpected {extra}")
    for name, value in current.items():
        other = saved[name]
        if not isinstance(other, Tensor) or other.shape != value.shape:
            shape = tuple(other.shape) if isinstance(other, Tensor) else type(other).__name__
            raise ValueError(f"the checkpoint's {what} {name!r} has shape {shape}, this model's {tuple(value.shape)}")


def detached(obj: Any) -> Any:
    """A deep copy of a state (tensors detached and cloned), so later training cannot change it."""
    if isinstance(obj, Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):  # item by item: Counter(pairs) would count the pairs
        out: dict = Counter() if isinstance(obj, Counter) else OrderedDict() if isinstance(obj, OrderedDict) else {}
        for key, value in obj.items():
            out[key] = detached(value)
        return out
    if isinstance(obj, list):
        return [detached(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(detached(v) for v in obj)
    return copy.deepcopy(obj)
