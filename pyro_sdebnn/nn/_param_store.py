# SPDX-License-Identifier: Apache-2.0
"""Make a :class:`~pyro.nn.PyroModule` compute with the values held in Pyro's param store.

A :class:`~pyro.nn.PyroModule` registers its plain ``nn.Parameter`` attributes (``pyro.param(name, p)``)
and its plain ``nn.Module`` children (``pyro.module(name, m)``) in the global param store, but keeps
computing with its *own* tensors. In one process these are the same objects, so nothing shows; after
``pyro.get_param_store().load(path)`` in a new process the store holds the loaded values while the
module still holds its fresh initial ones, and predictions silently differ. Pyro documents the remedy
for :func:`pyro.module`: ``pyro.module(name, m, update_module_params=True)`` after ``load`` (see the note
of :meth:`pyro.params.param_store.ParamStoreDict.load`); only :class:`~pyro.nn.PyroParam` attributes are
synchronised automatically.

:class:`ParamStoreModule` does the same for plain parameters and children: whenever one is read inside
the module's Pyro context (a ``pyro_method``, ``forward`` or a guide call) and the store holds another
tensor under its name, the module adopts the store's tensor (as ``update_module_params=True`` does), so
model, guide, SVI and :class:`~pyro.infer.Predictive` use the loaded fit. :func:`sync_from_param_store`
does it for a whole module tree at once (for code that reads the weights outside a Pyro context).
"""

from __future__ import annotations

from typing import Any

import pyro
import torch
from pyro.nn import PyroModule
from pyro.nn.module import _make_name
from pyro.params.param_store import param_with_module_name
from torch import nn


def _store_tensor(fullname: str, current: torch.Tensor) -> nn.Parameter | None:
    """The tensor the param store holds under ``fullname`` if it is not ``current`` (as an ``nn.Parameter``)."""
    store = pyro.get_param_store()
    stored = store._params.get(fullname)  # the unconstrained tensor, as Pyro's own PyroModule reads it
    if stored is None or stored is current:
        return None
    if stored.shape != current.shape or stored.dtype != current.dtype:
        return None  # another model's parameter of the same name: left alone, as Pyro leaves plain parameters
    if not isinstance(stored, nn.Parameter) or stored.device != current.device:
        # e.g. set by set_state, or loaded onto another device: keep the data, as a parameter where the module is
        stored = nn.Parameter(stored.detach().to(current.device), requires_grad=current.requires_grad)
        store._params[fullname] = stored
        store._param_to_name[stored] = fullname
    return stored


def _adopt(owner: PyroModule, name: str, value: Any) -> None:
    """Let ``owner``'s attribute ``name`` (a plain parameter or plain child module) use the store's tensors."""
    fullname = _make_name(owner._pyro_name, name)  # the name PyroModule registers it under
    if isinstance(value, nn.Parameter):
        stored = _store_tensor(fullname, value)
        if stored is not None:
            owner._parameters[name] = stored
    elif isinstance(value, nn.Module) and not isinstance(value, PyroModule):
        for module_name, module in value.named_modules():
            for param_name, param in list(module._parameters.items()):
                if param is None:
                    continue
                full = param_with_module_name(fullname, f"{module_name}.{param_name}" if module_name else param_name)
                stored = _store_tensor(full, param)
                if stored is not None:
                    module._parameters[param_name] = stored


def _active(module: PyroModule) -> bool:
    return bool(module._pyro_context.active) and not pyro.settings.get("module_local_params")


class ParamStoreModule:
    """Mixin for a :class:`~pyro.nn.PyroModule`: plain parameters and plain child modules follow the param store.

    Put it first in the bases (``class Net(ParamStoreModule, PyroModule)``). Inside the module's Pyro
    context every read of a plain ``nn.Parameter`` attribute or plain child ``nn.Module`` first adopts the
    tensors that Pyro's global param store holds under their names (``"w0"``, ``"head$$$weight"``...), so
    ``pyro.get_param_store().load(path)`` restores a fit in a new process, the way it restores
    :class:`~pyro.nn.PyroParam` attributes. The cost is one dictionary look-up per parameter per read.
    """

    def __getattr__(self, name: str) -> Any:
        value = super().__getattr__(name)  # type: ignore[misc]
        if isinstance(value, nn.Module | nn.Parameter) and _active(self):  # type: ignore[arg-type]
            _adopt(self, name, value)  # type: ignore[arg-type]
            value = super().__getattr__(name)  # type: ignore[misc]
        return value


def sync_from_param_store(module: PyroModule) -> None:
    """Make every plain parameter and plain child module in ``module``'s tree use the param store's tensors.

    The names are those the module registers (``_pyro_name`` prefixes, ``$$$`` for plain children); a name
    the store does not hold, or holds with another shape or dtype (another model's), is left alone. Call it
    where weights are read outside a Pyro context (e.g. a ``predict`` under ``torch.no_grad``).
    """
    if not isinstance(module, PyroModule) or pyro.settings.get("module_local_params"):
        return
    for name, param in list(module._parameters.items()):
        if param is not None:
            _adopt(module, name, param)
    for name in module.__dict__.get("_pyro_params", {}):  # PyroParam: the store holds its unconstrained value
        current = module._parameters[name + "_unconstrained"]
        if current is None:
            continue
        stored = _store_tensor(_make_name(module._pyro_name, name), current)
        if stored is not None:
            module._parameters[name + "_unconstrained"] = stored
    for name, child in module._modules.items():
        if isinstance(child, PyroModule):
            if not child._pyro_name:  # named on first access, as PyroModule.__getattr__ does
                child._pyro_set_supermodule(_make_name(module._pyro_name, name), module._pyro_context)
            sync_from_param_store(child)
        elif child is not None:
            _adopt(module, name, child)
