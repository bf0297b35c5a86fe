# SPDX-License-Identifier: Apache-2.0
"""Helpers of the traced SG-MCMC step: the identity of the model's arguments and ``torch.compile``.

The data are never constants of the traced graph: the tensors among the model's arguments are inputs of the step, and
tensors the traced code reads from outside (module parameters, a GP kernel's hyper-parameters, tensors in a closure)
stay references to those tensors, so a change in place is seen by the next step. The kernel keeps its potential (and
graphs) while the arguments of ``mcmc.run`` keep their identity *and* their version counter (:func:`_arg_key`), so
that data changed in place (same storage, same ``data_ptr``) are validated and traced again.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

import torch
from torch import Tensor


def _version(tensor: Tensor) -> int:
    """The version counter of a tensor (bumped by every in-place change); -1 for inference tensors, which have none
    (and cannot be changed in place outside inference mode)."""
    try:
        return int(tensor._version)
    except RuntimeError:
        return -1


def _arg_key(arg: Any) -> Any:
    """Identity of a model argument: tensors by storage and version counter (``MCMC.run`` hands over fresh
    ``detach()``-ed views, which share both), containers by their items, other objects by ``id``."""
    if torch.is_tensor(arg):
        return (
            "tensor", arg.data_ptr(), tuple(arg.shape), tuple(arg.stride()), arg.dtype, str(arg.device), _version(arg)
        )
    if isinstance(arg, (list, tuple)):
        return (type(arg).__name__, tuple(_arg_key(a) for a in arg))
    if isinstance(arg, dict):
        return ("dict", tuple((k, _arg_key(v)) for k, v in arg.items()))
    return ("object", id(arg))


def _compile_graph(graph: Any, on_failure: Optional[Callable[[Exception], Callable]] = None) -> Callable:
    """``torch.compile`` the step graph (compiled on the first call). If that first call fails and ``on_failure`` is
    given, the step continues with ``on_failure(error)`` instead of raising."""
    import torch._inductor.config as inductor_config

    # on CPU the compiler's own random-number generation is very slow; use ATen's generator instead
    inductor_config.fallback_random = True
    compiled = torch.compile(graph, dynamic=False)
    state: dict[str, Any] = {"fn": None}

    def run(*args: Tensor) -> tuple:
        if state["fn"] is not None:
            return state["fn"](*args)
        try:  # the first call compiles; the compiler's own deprecation notices are not ours
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = compiled(*args)
            state["fn"] = compiled
            return out
        except Exception as e:  # noqa: BLE001 - re-raised unless the caller has a fallback
            if on_failure is None:
                raise
            fallback = on_failure(e)
            state["fn"] = fallback
            return fallback(*args)

    return run
