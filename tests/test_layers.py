# SPDX-License-Identifier: Apache-2.0
"""The package's modules import one another one way: no import cycle, no function-level import of a package module.

The modules are read with :mod:`ast` (nothing is imported). Function-level imports are for optional third-party
dependencies only; a package module is imported at module level. The command line keeps ``pyro-sdebnn --help`` free
of torch by loading its sub-commands' work and each benchmark by name (``pyro_sdebnn.cli.COMMANDS``,
``pyro_sdebnn.experiments.REGISTRY``), not by importing inside functions. The cycle check follows the imports at
module level (outside ``if TYPE_CHECKING:``) and also the packages whose ``__init__`` an import runs, as Python does:
importing ``pyro_sdebnn.a.b`` from outside ``pyro_sdebnn.a`` first runs ``pyro_sdebnn/a/__init__.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pyro_sdebnn"

def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _target(importer: str, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The package modules an import statement loads (the module itself, or its package for a name in it)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = importer.split(".")
            if MODULES[importer].name != "__init__.py":
                parts = parts[:-1]
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    out = []
    for name in names:
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name.split(".")[0] == PACKAGE and name not in out:
            out.append(name)
    return out


def _imports(sources: dict[str, str] | None = None) -> tuple[dict[str, set[str]], list[tuple[str, str, int]]]:
    """Module-level imports ``{module: {imported}}`` and function-level ones ``[(module, imported, line)]`` of the
    package's modules (or of ``sources``, ``{module name: code}``)."""
    if sources is None:
        sources = {name: path.read_text() for name, path in MODULES.items()}
    top: dict[str, set[str]] = {name: set() for name in sources}
    late: list[tuple[str, str, int]] = []

    def walk(module: str, node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            function = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            checking = type_checking or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and not checking:
                for target in _target(module, child):
                    if function:
                        late.append((module, target, child.lineno))
                    else:
                        top[module].add(target)
            walk(module, child, function, checking)

    for name, code in sources.items():
        walk(name, ast.parse(code, name), False, False)
    return top, late


def _graph(top: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module-level imports plus the packages whose ``__init__`` each import runs (not the importer's own)."""
    graph: dict[str, set[str]] = {}
    for module, targets in top.items():
        own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
        edges = set()
        for target in targets:
            parts = target.split(".")
            edges |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} - own
        graph[module] = edges - {module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


TOP, LATE = _imports()


def test_no_import_cycle_among_the_package_modules():
    cycles = _cycles(_graph(TOP))
    assert not cycles, "import cycles (module-level imports and the package __init__ they run): " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def test_no_function_level_import_of_a_package_module():
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}" for m, t, line in LATE]
    assert not bad, "import these at module level:\n" + "\n".join(bad)


def test_the_modules_the_command_line_loads_by_name_close_no_cycle():
    # the command line imports its sub-commands' work (COMMANDS) and each benchmark (REGISTRY) by name when they run:
    # with those edges added, the graph must still have no cycle (no such module imports the command line back)
    from pyro_sdebnn.cli import COMMANDS
    from pyro_sdebnn.experiments import REGISTRY

    loaded = {target.partition(":")[0] for target in COMMANDS.values()}
    loaded |= {f"pyro_sdebnn.experiments.{entry.module}" for entry in REGISTRY.values()}
    assert loaded <= set(MODULES), loaded - set(MODULES)
    for target in COMMANDS.values():
        module, _, function = target.partition(":")
        assert f"def {function}(" in MODULES[module].read_text(), target
    top = {module: set(targets) for module, targets in TOP.items()}
    top["pyro_sdebnn.cli"] |= loaded
    cycles = _cycles(_graph(top))
    assert not cycles, "; ".join(" <-> ".join(c) for c in cycles)


def test_the_checks_see_a_cycle_and_a_late_import():
    # negative controls on a made-up graph and module: the checks can fail
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = _graph({"p.x.m": {"p.y.n"}, "p.y.n": {"p.x.k"}})
    assert graph["p.x.m"] == {"p.y", "p.y.n"} and graph["p.y.n"] == {"p.x", "p.x.k"}
    code = ("import numpy\nfrom pyro_sdebnn import metrics\n\n\ndef f():\n    import pyro_sdebnn.infer\n"
            "    from .. import nn\n    import numpy\n")
    top, late = _imports({"pyro_sdebnn.experiments.two_moons": code})
    assert top == {"pyro_sdebnn.experiments.two_moons": {"pyro_sdebnn.metrics"}}
    assert late == [("pyro_sdebnn.experiments.two_moons", "pyro_sdebnn.infer", 6),
                    ("pyro_sdebnn.experiments.two_moons", "pyro_sdebnn.nn", 7)]


def _reached(module: str) -> set[str]:
    """The package modules ``module`` imports at module level, transitively (package ``__init__`` files not followed)."""
    reached, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(TOP[name])
    return reached - {module}


def test_the_sgmcmc_kernel_owns_its_state_and_the_checkpoint_layer_sits_above_it():
    # the kernel's state_dict / load_state_dict are its own (as an optimiser's); files, samples and resuming import it
    checkpoint_layer = {"pyro_sdebnn.infer.checkpoint", "pyro_sdebnn.infer.mcmc.checkpoint"}
    assert not _reached("pyro_sdebnn.infer.mcmc.kernel") & checkpoint_layer
    assert "pyro_sdebnn.infer.mcmc.kernel" in _reached("pyro_sdebnn.infer.mcmc.checkpoint")  # the check can fail
