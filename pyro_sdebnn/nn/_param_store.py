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

**Names.** Pyro names the parameters of a root :class:`~pyro.nn.PyroModule` by its ``name`` (the argument of
``PyroModule.__init__``, ``""`` by default) and the attribute path (``"w0"``, ``"head$$$weight"``, or
``"a.w0"`` for ``name="a"``), and "two PyroModules of the same name will both synchronize with the global param
store and thus contain the same data" (the :class:`~pyro.nn.PyroModule` documentation). Two networks of the same
name in one process would then silently train one set of parameters (the second adopts the first's tensors; one of
another shape would leave the second untrained, the optimiser seeing the first's tensor). So a tensor of the store is
adopted only when no *other live* module holds it (a store restored by ``load``, or the fit of a module that no
longer exists, as Pyro populates a new module from the store): one still held by another module is a
``ValueError`` naming the parameter and the ``name=`` argument that separates the two, and so is a tensor of another
shape or dtype (another model's parameters, e.g. a param store loaded from another fit).
"""

from __future__ import annotations

import functools
import gc
import weakref
from typing import Any, Callable, TypeVar

import pyro
import torch
from pyro.nn import PyroModule
from pyro.nn.module import _make_name
from pyro.params.param_store import param_with_module_name
from torch import nn

_F = TypeVar("_F", bound=Callable[..., Any])

# id(module) -> weak reference: the modules that have read their parameters through the param store (registered by
# ``register_module``, dropped when garbage collected). A tensor of the store held by one of them belongs to it.
_LIVE: dict[int, weakref.ref] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    if _LIVE.get(key) is ref:  # not a newer module that reuses the id
        del _LIVE[key]


def register_module(module: nn.Module) -> None:
    """Record ``module`` as a live user of the param store (no state on the module: copies and pickles are unaffected).

    Called at each read of its parameters inside its Pyro context (a dictionary look-up when already recorded)."""
    key = id(module)
    ref = _LIVE.get(key)
    if ref is None or ref() is not module:
        _LIVE[key] = weakref.ref(module, functools.partial(_forget, key))


def _holder(tensor: torch.Tensor, reader: nn.Module) -> nn.Module | None:
    """A live registered module other than ``reader`` that holds ``tensor`` as one of its parameters, else ``None``."""
    def find() -> nn.Module | None:
        for ref in list(_LIVE.values()):
            module = ref()
            if module is not None and module is not reader and any(p is tensor for p in module.parameters()):
                return module
        return None

    if find() is None:
        return None
    gc.collect()  # a module that is unreachable but not yet collected (kept by a reference cycle) does not count
    return find()


def check_name(name: Any, owner: str) -> str:
    """``name=`` of a network or guide: the prefix of its Pyro parameter names (a string without Pyro's ``$$$``)."""
    if not isinstance(name, str):
        raise TypeError(f"{owner}: name must be a string (the prefix of its Pyro parameter names), got "
                        f"{type(name).__name__}")
    if "$$$" in name:
        raise ValueError(f"{owner}: name must not contain '$$$' (Pyro's module namespace divider), got {name!r}")
    return name


def check_not_shared(fullname: str, stored: torch.Tensor, current: torch.Tensor, reader: nn.Module,
                     prefix: str) -> None:
    """``ValueError`` if the store's tensor ``stored`` under ``fullname`` (not ``reader``'s own ``current``) belongs to
    another live module, or has another shape or dtype: adopting it would share or mix two models' parameters.

    ``prefix`` is ``reader``'s name (the ``name=`` of its constructor), quoted in the message."""
    kind = type(reader).__name__
    fix = (f"give each model its own name, {kind}(..., name='a') (Pyro prefixes the parameter names with it; this "
           f"one's is {prefix!r}), or call pyro.clear_param_store() before building the new one")
    other = _holder(stored, reader)
    if other is not None:
        raise ValueError(
            f"{kind}: Pyro's param store holds {fullname!r} for another live {type(other).__name__} of the same "
            f"name: the two would silently train one set of parameters; {fix}")
    if stored.shape != current.shape or stored.dtype != current.dtype:
        raise ValueError(
            f"{kind}: Pyro's param store holds {fullname!r} with shape {tuple(stored.shape)} and dtype "
            f"{stored.dtype}, this module's is {tuple(current.shape)} {current.dtype}: it is another model's "
            f"parameter (a param store loaded from another fit, or a model of the same name); {fix}")


def _store_tensor(fullname: str, current: torch.Tensor, reader: nn.Module, prefix: str) -> nn.Parameter | None:
    """The tensor the param store holds under ``fullname`` if it is not ``current`` (as an ``nn.Parameter``).

    ``ValueError`` (:func:`check_not_shared`) if that tensor is another live module's or of another shape or dtype."""
    store = pyro.get_param_store()
    stored = store._params.get(fullname)  # the unconstrained tensor, as Pyro's own PyroModule reads it
    if stored is None or stored is current:
        return None
    check_not_shared(fullname, stored, current, reader, prefix)
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
        stored = _store_tensor(fullname, value, owner, owner._pyro_name)
        if stored is not None:
            owner._parameters[name] = stored
    elif isinstance(value, nn.Module) and not isinstance(value, PyroModule):
        for module_name, module in value.named_modules():
            for param_name, param in list(module._parameters.items()):
                if param is None:
                    continue
                full = param_with_module_name(fullname, f"{module_name}.{param_name}" if module_name else param_name)
                stored = _store_tensor(full, param, owner, owner._pyro_name)
                if stored is not None:
                    module._parameters[param_name] = stored


def _active(module: PyroModule) -> bool:
    context = module.__dict__.get("_pyro_context")  # absent while the module is built or unpickled
    return context is not None and bool(context.active) and not pyro.settings.get("module_local_params")


class ParamStoreModule:
    """Mixin for a :class:`~pyro.nn.PyroModule`: plain parameters and plain child modules follow the param store.

    Put it first in the bases (``class Net(ParamStoreModule, PyroModule)``). Inside the module's Pyro
    context every read of a plain ``nn.Parameter`` attribute or plain child ``nn.Module`` first adopts the
    tensors that Pyro's global param store holds under their names (``"w0"``, ``"head$$$weight"``...), so
    ``pyro.get_param_store().load(path)`` restores a fit in a new process, the way it restores
    :class:`~pyro.nn.PyroParam` attributes. The cost is one dictionary look-up per parameter per read.
    A tensor that another live module of the same names holds is never adopted (a ``ValueError`` naming the
    ``name=`` argument, see the module docstring); neither is a :class:`~pyro.nn.PyroParam`'s.
    """

    def __getattr__(self, name: str) -> Any:
        active = _active(self)  # type: ignore[arg-type]
        if active:
            register_module(self)  # type: ignore[arg-type]
            if name in self.__dict__.get("_pyro_params", ()):
                # a PyroParam: Pyro's own __getattr__ adopts the store's tensor; not another live module's
                _check_pyro_param(self, name)  # type: ignore[arg-type]
        value = super().__getattr__(name)  # type: ignore[misc]
        if active and isinstance(value, nn.Module | nn.Parameter):
            _adopt(self, name, value)  # type: ignore[arg-type]
            value = super().__getattr__(name)  # type: ignore[misc]
        return value


def _check_pyro_param(module: PyroModule, name: str) -> None:
    """The store's tensor for the :class:`~pyro.nn.PyroParam` ``name`` of ``module`` may be adopted (see
    :func:`check_not_shared`)."""
    current = module._parameters.get(name + "_unconstrained")
    stored = pyro.get_param_store()._params.get(_make_name(module._pyro_name, name))
    if current is not None and stored is not None and stored is not current:
        check_not_shared(_make_name(module._pyro_name, name), stored, current, module, module._pyro_name)


def sync_from_param_store(module: PyroModule) -> None:
    """Make every plain parameter and plain child module in ``module``'s tree use the param store's tensors.

    The names are those the module registers (``_pyro_name`` prefixes, ``$$$`` for plain children); a name
    the store does not hold is left alone; a tensor that another live module holds, or of another shape or dtype
    (another model's), is a ``ValueError`` (:func:`check_not_shared`). Call it where weights are read outside a
    Pyro context (e.g. a ``predict`` under ``torch.no_grad``).
    """
    if not isinstance(module, PyroModule) or pyro.settings.get("module_local_params"):
        return
    register_module(module)
    for name, param in list(module._parameters.items()):
        if param is not None:
            _adopt(module, name, param)
    for name in module.__dict__.get("_pyro_params", {}):  # PyroParam: the store holds its unconstrained value
        current = module._parameters[name + "_unconstrained"]
        if current is None:
            continue
        stored = _store_tensor(_make_name(module._pyro_name, name), current, module, module._pyro_name)
        if stored is not None:
            module._parameters[name + "_unconstrained"] = stored
    for name, child in module._modules.items():
        if isinstance(child, PyroModule):
            if not child._pyro_name:  # named on first access, as PyroModule.__getattr__ does
                child._pyro_set_supermodule(_make_name(module._pyro_name, name), module._pyro_context)
            sync_from_param_store(child)
        elif child is not None:
            _adopt(module, name, child)


def reads_param_store(method: _F) -> _F:
    """Decorate a public method of a :class:`~pyro.nn.PyroModule` that reads its parameters outside a Pyro context
    (a ``prior()``, a training loss for a plain torch optimiser, a likelihood): it first makes the module compute with
    the param store's tensors (:func:`sync_from_param_store`), as its model, guide and ``predict`` do, so a store
    restored with ``pyro.get_param_store().load(path)`` gives the fit's numbers in every method. Inside the module's
    own Pyro context (a ``pyro_method``, ``forward``) nothing is added: its reads adopt the store's tensors already."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        sync_outside_context(self)
        return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def sync_outside_context(module: PyroModule) -> None:
    """:func:`sync_from_param_store` unless ``module``'s own Pyro context is active (where its reads adopt already)."""
    if not _active(module):
        sync_from_param_store(module)
