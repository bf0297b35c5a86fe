# SPDX-License-Identifier: Apache-2.0
"""Tracing and leaning of the SG-MCMC inner step as an FX graph.

The whole inner step (potential, gradient, noise, update) is traced once into an FX graph with ``make_fx`` so that
Pyro's handler machinery is out of the inner loop, and optionally compiled. Run eagerly, every node of that graph
costs a few microseconds of dispatch, which dominates on small networks, so the graph is kept lean: constants are
folded, identity operations, aliases and dead nodes are removed (:func:`_lean_graph`).

The data are never constants of the graph: the tensors among the model's arguments are inputs of the traced step,
so nothing computed from them (a standardisation of the inputs inside the model, say) is folded. Only values that
depend on tensors created inside the traced code (literals, ``arange``, ``eye`` ...) or on tensors the code reads
from outside (module parameters, a GP kernel's hyper-parameters, tensors in a closure) are folded; the versions of
the latter are recorded (:func:`_graph_is_stale`), and the kernel traces again when one of them changed in place.
The graph is cached by the identity *and* the version counter of the arguments (:func:`_arg_key`), so that data
changed in place (same storage, same ``data_ptr``) also give a fresh trace.
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


def _graph_is_stale(graph: Any) -> bool:
    """Whether a tensor that constants of ``graph`` were folded from has changed in place since (see
    :func:`_fold_constants`)."""
    return any(_version(t) != v for t, v in getattr(graph, "_folded_from", ()))


_NO_OPS = {torch.ops.aten.lift_fresh_copy.default, torch.ops.aten.alias.default, torch.ops.aten.detach.default}
_aten = torch.ops.aten
# (op, scalar) pairs that return their tensor argument unchanged (when dtype and shape are unchanged)
_IDENTITIES = {
    (_aten.add.Tensor, 0.0), (_aten.sub.Tensor, 0.0), (_aten.mul.Tensor, 1.0), (_aten.div.Tensor, 1.0),
    (_aten.pow.Tensor_Scalar, 1.0), (_aten.mul.Scalar, 1.0),
}
_SHAPE_OPS = {_aten.expand.default, _aten.view.default, _aten.reshape.default}


def _meta(node: Any) -> Optional[Tensor]:
    value = node.meta.get("val") if hasattr(node, "meta") else None
    return value if isinstance(value, Tensor) else None


def _is_pure(target: Any) -> bool:
    return (
        isinstance(target, torch._ops.OpOverload)
        and not target._schema.is_mutable
        and torch.Tag.nondeterministic_seeded not in target.tags
        and "empty" not in target.__name__
    )


def _external_constants(graph: Any) -> set:
    """The ``get_attr`` tensors of a ``make_fx`` graph that the traced code read from outside (module parameters,
    closure tensors), as opposed to tensors it created from literals (those reach the graph through
    ``lift_fresh_copy``). Must run before the aliases are dropped."""
    out = set()
    for node in graph.graph.nodes:
        if node.op == "get_attr" and any(u.target is not _aten.lift_fresh_copy.default for u in node.users):
            out.add(node.target)
    return out


def _fold_constants(graph: Any, external: Optional[set] = None) -> None:
    """Evaluate once the nodes that depend on constants only (GP kernel hyper-parameters, ``arange``, ``eye``,
    prior scales ...) and store their values as graph constants.

    Graph inputs (placeholders, such as the model's data) are never constants. ``external`` names the ``get_attr``
    tensors read from outside the traced code (by default all): the versions of those a folded value depends on
    are kept in ``graph._folded_from`` so that a change in place can be detected (:func:`_graph_is_stale`)."""
    if not hasattr(graph, "_folded_from"):
        graph._folded_from = []
    values: dict = {}
    sources: dict = {}  # node -> the external tensors its value was computed from
    count = 0
    for node in list(graph.graph.nodes):
        if node.op == "get_attr":
            value = getattr(graph, node.target)
            if isinstance(value, Tensor):
                values[node] = value
                sources[node] = {node.target} if external is None or node.target in external else set()
            continue
        if node.op != "call_function" or not _is_pure(node.target):
            continue
        flat_inputs: list = []
        torch.fx.node.map_arg((node.args, node.kwargs), flat_inputs.append)
        if not all(n in values for n in flat_inputs):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
        value = node.target(*args, **kwargs)
        if not isinstance(value, Tensor):
            continue
        name = f"_folded_constant{count}"
        count += 1
        graph.register_buffer(name, value, persistent=False)
        with graph.graph.inserting_before(node):
            folded = graph.graph.get_attr(name)
        folded.meta = dict(node.meta)
        node.replace_all_uses_with(folded)
        graph.graph.erase_node(node)
        values[folded] = value
        sources[folded] = set().union(*(sources.get(n, set()) for n in flat_inputs))
        for target in sources[folded]:
            tensor = getattr(graph, target)
            if all(t is not tensor for t, _ in graph._folded_from):
                graph._folded_from.append((tensor, _version(tensor)))
    graph.graph.eliminate_dead_code()


def _drop_identities(graph: Any) -> None:
    """Replace ``x + 0``, ``x * 1``, ``x ** 1``, no-op ``expand``/``view``, ``t(t(x))`` and ``x[arange(len(x))]``
    by ``x`` (Pyro's distributions and the GP kernel leave many of them in the traced step)."""
    for node in list(graph.graph.nodes):
        if node.op != "call_function":
            continue
        target, args = node.target, node.args
        source = args[0] if args and isinstance(args[0], torch.fx.Node) else None
        out, inp = _meta(node), (_meta(source) if source is not None else None)
        if source is None or out is None or inp is None or out.dtype != inp.dtype or out.shape != inp.shape:
            continue
        same = False
        if target is _aten.index.Tensor:
            index = args[1][0] if len(args[1]) == 1 else None
            if isinstance(index, torch.fx.Node) and index.op == "get_attr":
                value = getattr(graph, index.target)
                same = value.dim() == 1 and torch.equal(value, torch.arange(inp.shape[0], device=value.device))
        elif len(args) == 2 and isinstance(args[1], (int, float)) and not node.kwargs:
            try:
                same = (target, float(args[1])) in _IDENTITIES
            except (TypeError, ValueError):
                same = False
        elif target in _SHAPE_OPS:
            same = out.stride() == inp.stride()
        elif target is _aten.t.default:
            same = source.target is _aten.t.default and isinstance(source.args[0], torch.fx.Node)
            if same:
                source = source.args[0]
        if same:
            node.replace_all_uses_with(source)
            graph.graph.erase_node(node)


def _lean_graph(graph: Any) -> None:
    """Strip a ``make_fx`` graph for eager execution: drop aliases/detaches (no autograd runs through the step),
    fold constants, drop identity operations and dead nodes, and the pytree (un)flattening of its generated code.
    Every remaining node is one ATen call (each costs a few microseconds of dispatch on small tensors)."""
    mutates = any(
        isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
        for n in graph.graph.nodes if n.op == "call_function"
    )
    graph._folded_from = []
    if not mutates:  # a functional graph: aliases are values, constants can be shared between calls
        external = _external_constants(graph)
        for node in list(graph.graph.nodes):
            if node.op == "call_function" and node.target in _NO_OPS and len(node.args) == 1:
                node.replace_all_uses_with(node.args[0])
                graph.graph.erase_node(node)
        _fold_constants(graph, external)
        _drop_identities(graph)
    graph.graph.eliminate_dead_code()
    graph.graph._codegen = torch.fx.graph.CodeGen()
    graph.recompile()


def _compile_graph(
    graph: Any, on_failure: Optional[Callable[[Exception], Callable]] = None, options: Optional[dict] = None
) -> Callable:
    """``torch.compile`` the step graph (compiled on the first call; ``options`` are Inductor options). If that first
    call fails and ``on_failure`` is given, the step continues with ``on_failure(error)`` instead of raising."""
    import torch._inductor.config as inductor_config

    # on CPU the compiler's own random-number generation is very slow; use ATen's generator instead
    inductor_config.fallback_random = True
    compiled = torch.compile(graph, dynamic=False, options=options)
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
            state["fn"] = on_failure(e)
            return state["fn"](*args)

    return run
