# SPDX-License-Identifier: Apache-2.0
"""The package's modules import one another one way: no import cycle, no function-level import of a package module.

The modules are read with :mod:`ast` (nothing is imported). An import of a package module inside a function is
allowed only where listed in :data:`ALLOWED`, each with its reason; the cycle check follows the imports at module
level (outside ``if TYPE_CHECKING:``) and also the packages whose ``__init__`` an import runs, as Python does: importing
``pyro_sdebnn.a.b`` from outside ``pyro_sdebnn.a`` first runs ``pyro_sdebnn/a/__init__.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pyro_sdebnn"

#: ``(importing module or package prefix, imported module or package prefix): reason``.
ALLOWED = {
    ("pyro_sdebnn.cli", "pyro_sdebnn"): (
        "`pyro-sdebnn --help` and `--version` must start without torch: the command line imports the library "
        "(and the one experiment asked for) only when a command needs it"
    ),
    ("pyro_sdebnn.experiments.", "pyro_sdebnn.cli"): (
        "the image benchmarks add the command line's --data-dir options (add_data_dir_arguments), and the command "
        "line imports the experiments package for its registry"
    ),
    **{
        ("pyro_sdebnn.experiments.", heavy): (
            "`pyro-sdebnn benchmark NAME --help` imports the experiment's module for its options: the models, guides "
            "and kernels (and with them torchvision, ArviZ, the GP code) are imported when the benchmark runs"
        )
        for heavy in ("pyro_sdebnn.infer", "pyro_sdebnn.nn", "pyro_sdebnn.distributions")
    },
}


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


def _imports() -> tuple[dict[str, set[str]], list[tuple[str, str, int]]]:
    """Module-level imports ``{module: {imported}}`` and function-level ones ``[(module, imported, line)]``."""
    top: dict[str, set[str]] = {name: set() for name in MODULES}
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

    for name, path in MODULES.items():
        walk(name, ast.parse(path.read_text(), str(path)), False, False)
    return top, late


def _allowed(module: str, target: str) -> bool:
    def match(name: str, prefix: str) -> bool:
        return name.startswith(prefix) if prefix.endswith(".") else name == prefix or name.startswith(prefix + ".")

    return any(match(module, a) and match(target, b) for a, b in ALLOWED)


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
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}" for m, t, line in LATE if not _allowed(m, t)]
    assert not bad, "import these at module level (or add a reason to ALLOWED):\n" + "\n".join(bad)


@pytest.mark.parametrize("rule", sorted(ALLOWED))
def test_every_exception_is_still_needed(rule):
    module, target = rule
    assert any(_allowed(m, t) and (m.startswith(module.rstrip("."))) for m, t, _ in LATE), (
        f"no function-level import matches {rule}: remove it from ALLOWED"
    )


def test_the_checks_see_a_cycle_and_a_late_import():
    # negative controls on a made-up graph and module: the checks can fail
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = _graph({"p.x.m": {"p.y.n"}, "p.y.n": {"p.x.k"}})
    assert graph["p.x.m"] == {"p.y", "p.y.n"} and graph["p.y.n"] == {"p.x", "p.x.k"}
    assert not _allowed("pyro_sdebnn.infer.methods", "pyro_sdebnn.infer.map_training")
    assert _allowed("pyro_sdebnn.experiments.two_moons", "pyro_sdebnn.infer")
    assert not _allowed("pyro_sdebnn.experiments.two_moons", "pyro_sdebnn.metrics")  # light: imported at the top
    assert ("pyro_sdebnn.infer.svi_training", "pyro_sdebnn._comm") not in {(m, t) for m, t, _ in LATE}


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
