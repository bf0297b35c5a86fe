# SPDX-License-Identifier: Apache-2.0
"""Checkpoints of the baseline methods: plain files that load with ``torch.load(path, weights_only=True)``.

Every fitted baseline (:class:`~pyro_sdebnn.infer.MAPEstimate`, :class:`~pyro_sdebnn.infer.MeanFieldVI`,
:class:`~pyro_sdebnn.infer.MCDropout`, :class:`~pyro_sdebnn.infer.DeepEnsemble`,
:class:`~pyro_sdebnn.infer.Laplace`) has ``state_dict()`` / ``load_state_dict(sd)`` and ``save(path)`` /
``load(path)``. A checkpoint is a dictionary of tensors, numbers, strings, lists and dictionaries only
(no pickled objects, constraints or closures), holding

* ``"format"`` and ``"method"`` (the class name), checked on load;
* the fitted state: Pyro guide parameters as *unconstrained* tensors with the names of their constraints
  (the constraints themselves are rebuilt by the guide), network weights, ensemble members, the Laplace
  curvature;
* the training state needed to *resume*: the optimiser (and scheduler) state, the loss of every epoch
  so far (its length is the epoch reached) and the state of torch's global random number generator
  (and of any ``torch.Generator`` of the training loader) at the end of the last epoch.

``fit(..., resume=True)`` continues from that state, so ``fit(num_epochs=k)``, ``save``, ``load`` in a
new object, ``fit(num_epochs=K - k, resume=True)`` ends with the same parameters as ``fit(num_epochs=K)``
with the same seed (bitwise on CPU).

A file that is not such a checkpoint (truncated, corrupted, another method's or another model's)
raises ``ValueError`` and leaves the object unchanged.
"""

from __future__ import annotations

import copy
import os
import random
import tempfile
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["CHECKPOINT_FORMAT", "load_checkpoint", "save_checkpoint"]

#: Format tag written into every checkpoint of the baselines.
CHECKPOINT_FORMAT = "pyro_sdebnn.baseline/1"


def save_checkpoint(state: dict, path) -> None:
    """Write ``state`` to ``path`` with :func:`torch.save`, atomically: it goes to a temporary file in the same
    folder first and replaces ``path`` only once complete, so an interrupted write leaves the previous checkpoint."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path, map_location=None) -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` with ``torch.load(..., weights_only=True)``.

    :raises ValueError: if the file cannot be read as a checkpoint (truncated, corrupted, not a
        checkpoint of this package).
    :raises FileNotFoundError: if ``path`` does not exist.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {os.fspath(path)!r}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # truncated zip, bad pickle, unsupported globals, ...
        raise ValueError(
            f"{os.fspath(path)!r} is not a readable checkpoint (truncated or corrupted file?): {err}"
        ) from None
    check_header(state, None)
    return state


def check_header(state, method: str | None) -> None:
    """Check the format tag and, if given, the method name of a checkpoint dictionary."""
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"not a checkpoint of a pyro_sdebnn baseline (expected format {CHECKPOINT_FORMAT!r})")
    if method is not None and state.get("method") != method:
        raise ValueError(f"the checkpoint is of a {state.get('method')!r}, not of a {method!r}")


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


def loader_generators(loader) -> list[torch.Generator]:
    """The distinct ``torch.Generator`` objects a loader shuffles with (``loader.generator``, its samplers')."""
    found: list[torch.Generator] = []
    batch_sampler = getattr(loader, "batch_sampler", None)
    candidates = [
        getattr(loader, "generator", None),
        getattr(getattr(loader, "sampler", None), "generator", None),
        getattr(batch_sampler, "generator", None),
        getattr(getattr(batch_sampler, "sampler", None), "generator", None),
    ]
    for gen in candidates:
        if isinstance(gen, torch.Generator) and all(gen is not g for g in found):
            found.append(gen)
    return found


def rng_state(loader=None) -> dict:
    """Every random state a training run reads, as tensors, numbers and lists (``weights_only``-loadable): torch's
    CPU generator (uint8 tensor), the CUDA ones if initialised, NumPy's and Python's, and the loader's own
    generators (``DataLoader(generator=...)``, a sampler's)."""
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


def set_rng_state(state: dict, loader=None) -> None:
    """Restore what :func:`rng_state` captured (the loader's generators only if it has as many)."""
    gens = loader_generators(loader) if loader is not None else []
    saved = state.get("loader", [])
    if gens and saved and len(gens) != len(saved):
        raise ValueError(
            f"the loader has {len(gens)} torch.Generator(s) but the interrupted run's had {len(saved)}; "
            "resume with a loader built the same way"
        )
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
