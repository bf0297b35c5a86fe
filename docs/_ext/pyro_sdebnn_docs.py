# SPDX-License-Identifier: Apache-2.0
"""Sphinx extension of the pyro-sdebnn documentation.

It does three things:

1. **Executed tutorials.** At ``builder-inited`` every ``tutorials/[0-9]*.py`` script is run once as
   ``python tutorials/NN_name.py --quick --output docs/tutorials/NN_name`` and a page
   ``docs/tutorials/NN_name.rst`` is written from it: the script's docstring, its ``# %% [markdown]``
   cells as text and the code between them as code blocks, each figure the script saved right after the cell that
   saved it, and the printed output. Set ``PYRO_SDEBNN_DOCS_TUTORIALS=full`` to run the tutorials at their full
   budget instead (several minutes).
2. **The Two Moons study.** The main job ``pyro-sdebnn benchmark two-moons`` (full mode, about 40 s on two CPU
   cores; ``PYRO_SDEBNN_DOCS_QUICK=1`` runs ``--quick`` instead) writes its table and figures to
   ``docs/generated/two_moons/``; its Markdown tables become reST tables (``*.inc``) that the *choosing a method*
   guide includes.
3. **Cross-references.** The API is documented where each object is defined (``pyro_sdebnn.infer.laplace.Laplace``);
   a reference to a re-exported name (``pyro_sdebnn.infer.Laplace``, or ``Laplace`` inside
   :mod:`pyro_sdebnn.infer`) is resolved to that definition. References to other projects are ignored by package
   name only (:data:`NITPICK_IGNORE_REGEX`, the build is offline), so a broken reference to a pyro_sdebnn object
   fails the ``-n -W`` build. A class's "Bases:" line leaves out the internal bases (mixins their module does not list
   in ``__all__``), which are not documented.

Outputs are cached: a script is re-run only when it, the package source or the mode changed
(``PYRO_SDEBNN_DOCS_REUSE=1`` keeps any cached output, to rebuild the text quickly while editing).
"""

from __future__ import annotations

import ast
import csv
import hashlib
import importlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import types
import typing
from pathlib import Path

try:
    from sphinx.errors import ExtensionError
    from sphinx.util import logging
except ImportError:  # the page and reference helpers are also imported by tests/test_docs.py without Sphinx
    import logging

    ExtensionError = RuntimeError

logger = logging.getLogger(__name__)

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
GENERATED = DOCS / "generated"
TUTORIALS = ROOT / "tutorials"
#: Where the tutorial pages are written: ``docs/tutorials/index.rst`` and ``docs/tutorials/NN_name.rst`` (the
#: layout sphinx-gallery would use with ``gallery_dirs="tutorials"``), so pages link to them as
#: :doc:`tutorials/index` and :doc:`tutorials/01_two_moons`.
TUTORIALS_OUT = DOCS / "tutorials"
PACKAGE = "pyro_sdebnn"

#: External packages whose objects are referenced from the docstrings and type hints. Without network access
#: there is no intersphinx inventory for them, so their references are not checked; ``pyro_sdebnn.*`` is never
#: in this list, so a broken reference to one of our objects fails the build.
EXTERNAL_PACKAGES = (
    "torch", "pyro", "numpy", "np", "scipy", "matplotlib", "mpl", "arviz", "az", "xarray", "pandas", "sklearn",
    "torchsde", "torchvision", "mlxtend", "tqdm",
    # the standard library
    "collections", "typing", "typing_extensions", "types", "abc", "enum", "dataclasses", "pathlib", "os", "io",
    "argparse", "functools", "contextlib", "concurrent", "threading", "numbers", "warnings", "json", "csv",
    "queue", "math", "re",
)
BUILTINS = (
    "int", "float", "complex", "str", "string", "bool", "bytes", "None", "NoneType", "object", "type", "list", "tuple", "dict",
    "set", "frozenset", "slice", "range", "callable", "property", "Ellipsis", "NotImplemented",
    "Exception", "ValueError", "TypeError", "RuntimeError", "KeyError", "IndexError", "NotImplementedError",
    "KeyboardInterrupt",
    "Warning", "UserWarning", "RuntimeWarning", "DeprecationWarning", "FloatingPointError", "ArithmeticError",
    # typing names as they appear in signatures written with ``from __future__ import annotations``
    "Any", "Callable", "Iterable", "Iterator", "Sequence", "Mapping", "MutableMapping", "Optional", "Union",
    "Literal", "Generator", "ClassVar", "Self", "NamedTuple", "Protocol",
)
#: Short names of external objects as they appear in type hints evaluated from strings (``Tensor``, ``nn.Module``)
#: and aliases of external packages (``nn.``, ``dist.``, ``gp.``).
EXTERNAL_SHORT_NAMES = (
    "Tensor", "Module", "Parameter", "Distribution", "TorchDistribution", "ExpandedDistribution", "Kernel",
    "Figure", "Axes", "Path", "InferenceData", "ndarray", "dtype", "device", "Size", "Constraint", "Transform",
    "Trace", "Messenger", "ELBO", "Trace_ELBO", "MCMC", "MCMCKernel", "Future", "Executor", "Namespace",
    "ArgumentParser", "BrownianInterval", "SDEIto", "Optimizer", "PyroOptim",
)
EXTERNAL_ALIASES = ("nn", "dist", "gp", "F", "optim", "poutine", "plt", "constraints", "tdist", "mpl", "func")
NITPICK_IGNORE_REGEX = [
    (r"py:.*", r"(%s)(\..+)?" % "|".join(map(re.escape, EXTERNAL_PACKAGES))),
    (r"py:.*", r"(%s)" % "|".join(map(re.escape, BUILTINS + EXTERNAL_SHORT_NAMES))),
    (r"py:.*", r"(%s)\..+" % "|".join(map(re.escape, EXTERNAL_ALIASES))),
    # generic aliases split by the signature parser, e.g. ``tuple[int, ...]``
    (r"py:.*", r"(tuple|list|dict|set|frozenset|type|Sequence|Mapping|Iterable|Callable)\[.*"),
    (r"py:.*", r"\.\.\.|\]"),
    # fragments of a union of generic aliases split by the signature parser, e.g. ``None | int | dict[str``
    (r"py:.*", r"(?!pyro_sdebnn)[^\[]*\|[^\[]*\[.*"),
]


# ------------------------------------------------------------------------------------------------ running scripts
def _source_digest(*extra: bytes) -> str:
    digest = hashlib.sha256()
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    for item in extra:
        digest.update(item)
    digest.update(sys.version.encode())
    return digest.hexdigest()


def run_cached(name: str, args: list[str], outdir: Path, key: str) -> str:
    """Run ``python *args`` (which writes into ``outdir``) unless ``outdir`` holds a run with the same ``key``.

    Returns the run's standard output. A failing run raises :class:`sphinx.errors.ExtensionError`.
    """
    stamp = outdir / ".stamp"
    stdout_file = outdir / ".stdout"
    reuse = os.environ.get("PYRO_SDEBNN_DOCS_REUSE", "") not in ("", "0")
    if stamp.is_file() and (reuse or stamp.read_text() == key) and stdout_file.is_file():
        logger.info(f"[pyro_sdebnn_docs] {name}: cached output in {outdir.relative_to(ROOT)}")
        return stdout_file.read_text()
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    logger.info(f"[pyro_sdebnn_docs] running {name}: python {' '.join(args)}")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args], cwd=outdir, env=env, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    (outdir / ".stderr").write_text(proc.stderr)
    if proc.returncode != 0:
        raise ExtensionError(
            f"{name} failed (exit {proc.returncode}) while building the docs:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    stdout_file.write_text(proc.stdout)
    (outdir / ".seconds").write_text(f"{seconds:.1f}")
    stamp.write_text(key)
    logger.info(f"[pyro_sdebnn_docs] {name} took {seconds:.1f} s")
    return proc.stdout


# ------------------------------------------------------------------------------------------------ tutorial pages
_MARKER = re.compile(r"^(?P<indent>\s*)# %%(?P<rest>.*)$")
_SAVEFIG = re.compile(r"""savefig\([^)]*?["']([\w.\-]+\.png)["']""")
_SINGLE_TICKS = re.compile(r"(?<![`:\w])`([^`\n]+)`(?![`_\w])")
_MD_LINK = re.compile(r"\[([^\]]+)\]\((https?://[^)]+)\)")


def tutorial_scripts() -> list[Path]:
    """The tutorial scripts, in order (``tutorials/[0-9]*.py``)."""
    return sorted(TUTORIALS.glob("[0-9]*.py"))


def _markdown_to_rst(line: str) -> str:
    line = _MD_LINK.sub(r"`\1 <\2>`_", line)
    line = _SINGLE_TICKS.sub(r"``\1``", line)
    # a bare "|" would start a substitution reference: escape it outside inline literals
    parts = line.split("``")
    return "``".join(part.replace("|", "\\|") if i % 2 == 0 else part for i, part in enumerate(parts))


def split_cells(source: str) -> list[tuple[str | None, list[str], str]]:
    """Split a ``# %%`` script into ``(heading, text_lines, code)`` cells (the docstring is not part of them).

    The comment lines right after a ``# %% [markdown]`` marker are the cell's text (a leading ``## Heading``
    becomes its heading); the code until the next marker is the cell's code, dedented.
    """
    tree = ast.parse(source)
    lines = source.splitlines()
    start = 0
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(getattr(tree.body[0], "value", None), ast.Constant):
        start = tree.body[0].end_lineno
    cells: list[tuple[str | None, list[str], list[str]]] = []
    heading, text, code = None, [], []
    in_text = False
    for line in lines[start:]:
        match = _MARKER.match(line)
        if match:
            if heading or text or any(c.strip() for c in code):
                cells.append((heading, text, code))
            heading, text, code = None, [], []
            in_text = "markdown" in match.group("rest")
            continue
        stripped = line.strip()
        if in_text and stripped.startswith("#"):
            content = stripped[1:]
            content = content[1:] if content.startswith(" ") else content
            if not text and content.startswith("#"):
                heading = content.lstrip("#").strip()
            else:
                text.append(_markdown_to_rst(content))
            continue
        in_text = False
        code.append(line)
    if heading or text or any(c.strip() for c in code):
        cells.append((heading, text, code))
    result = []
    for heading, text, code in cells:
        while code and not code[0].strip():
            code.pop(0)
        while code and not code[-1].strip():
            code.pop()
        result.append((heading, text, textwrap.dedent("\n".join(code))))
    return result


def _heading(text: str, char: str) -> list[str]:
    return [text, char * len(text), ""]


def tutorial_page(script: Path, outdir: Path, stdout: str, mode: str) -> str:
    """The reST page of one executed tutorial."""
    source = script.read_text()
    doc = ast.get_docstring(ast.parse(source)) or script.stem
    title, _, body = doc.partition("\n")
    rel = f"tutorials/{script.name}"
    flag = " --quick" if mode == "quick" else ""
    out: list[str] = [f".. _tutorial-{script.stem}:", "", *_heading(title.strip(), "="), body.strip(), ""]
    seconds = (outdir / ".seconds").read_text().strip() if (outdir / ".seconds").is_file() else "?"
    budget = (
        "the ``--quick`` smoke budget that CI runs (tiny networks, few steps: the figures show what the code "
        "produces, not converged results; drop ``--quick`` for the full budget)"
        if mode == "quick"
        else "the full budget"
    )
    out += [
        ".. note::",
        "",
        f"   The output and figures on this page come from running ``python {rel}{flag} --output DIR`` while",
        f"   the documentation was built ({seconds} s), with {budget}.",
        f"   :download:`Download the script <{script.name}>`.",
        "",
    ]
    placed: set[str] = set()
    for heading, text, code in split_cells(source):
        if heading:
            out += _heading(heading, "-")
        if text:
            out += [*text, ""]
        if code.strip():
            out += [".. code-block:: python", "", *textwrap.indent(code, "   ").splitlines(), ""]
        for png in _SAVEFIG.findall(code):
            if (outdir / png).is_file() and png not in placed:
                placed.add(png)
                out += [f".. figure:: {script.stem}/{png}", "   :width: 100%", "", f"   ``{png}``", ""]
    rest = sorted(p.name for p in outdir.glob("*.png") if p.name not in placed)
    if rest:
        out += _heading("Other figures", "-")
        for png in rest:
            out += [f".. figure:: {script.stem}/{png}", "   :width: 100%", "", f"   ``{png}``", ""]
    out += _heading("Printed output", "-")
    printed = stdout.rstrip() or "(nothing printed)"
    out += [".. code-block:: text", "", *textwrap.indent(printed, "   ").splitlines(), ""]
    return "\n".join(out) + "\n"


def build_tutorials(app) -> None:
    examples, gallery = app.config.tutorials_examples_dir, app.config.tutorials_gallery_dir
    if (DOCS / examples).resolve() != TUTORIALS or (DOCS / gallery).resolve() != TUTORIALS_OUT:
        raise ExtensionError(
            f"tutorials_examples_dir / tutorials_gallery_dir must be '../tutorials' / 'tutorials', "
            f"got {examples!r} / {gallery!r}"
        )
    mode = os.environ.get("PYRO_SDEBNN_DOCS_TUTORIALS", "quick")
    if mode not in ("quick", "full"):
        raise ExtensionError(f"PYRO_SDEBNN_DOCS_TUTORIALS must be 'quick' or 'full', got {mode!r}")
    target = TUTORIALS_OUT
    target.mkdir(parents=True, exist_ok=True)
    index_file = target / "index.rst"
    if not index_file.is_file():
        raise ExtensionError(f"{index_file} (the hand-written index of the tutorials) is missing")
    listed = set(re.findall(r"^ {3}(\S+)$", index_file.read_text(), flags=re.M))
    unlisted = [script.stem for script in tutorial_scripts() if script.stem not in listed]
    if unlisted:
        raise ExtensionError(f"tutorials missing from the toctree of docs/tutorials/index.rst: {unlisted}")
    for script in tutorial_scripts():
        outdir = target / script.stem
        args = [str(script), "--output", str(outdir)] + (["--quick"] if mode == "quick" else [])
        key = _source_digest(script.read_bytes(), mode.encode())
        stdout = run_cached(f"tutorial {script.name}", args, outdir, key)
        shutil.copyfile(script, target / script.name)
        page = tutorial_page(script, outdir, stdout, mode)
        page_file = target / f"{script.stem}.rst"
        if not page_file.is_file() or page_file.read_text() != page:
            page_file.write_text(page)


# ------------------------------------------------------------------------------------------------ Two Moons study
def markdown_table_to_rst(markdown: str) -> str:
    """Convert the first pipe table of a Markdown text to a reST ``list-table``."""
    rows = [line.strip() for line in markdown.splitlines() if line.strip().startswith("|")]
    if len(rows) < 2:
        raise ExtensionError("no Markdown table found")
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows if not re.fullmatch(r"[|\-: ]+", row)]
    out = [".. list-table::", "   :header-rows: 1", ""]
    for row in cells:
        out.append("   * - " + _markdown_to_rst(row[0]))
        out += ["     - " + _markdown_to_rst(c) for c in row[1:]]
    return "\n".join(out) + "\n"


def build_two_moons(app) -> None:
    quick = os.environ.get("PYRO_SDEBNN_DOCS_QUICK", "") not in ("", "0")
    outdir = GENERATED / "two_moons"
    args = ["-m", PACKAGE, "benchmark", "two-moons", "--output", str(outdir)] + (["--quick"] if quick else [])
    key = _source_digest(b"quick" if quick else b"full")
    run_cached("the Two Moons main job", args, outdir, key)
    with open(outdir / "two_moons_table.csv", newline="") as f:
        failed = [row for row in csv.DictReader(f) if row.get("status", "ok") != "ok"]
    if failed:
        (outdir / ".stamp").unlink()
        raise ExtensionError(
            "methods failed in the Two Moons main job: "
            + "; ".join(f"{row['method']}: {row['status']}" for row in failed)
        )
    for name in ("two_moons_table", "sgmcmc_ess"):
        md = outdir / f"{name}.md"
        if not md.is_file():
            raise ExtensionError(f"the Two Moons main job did not write {md.name}")
        (outdir / f"{name}.inc").write_text(markdown_table_to_rst(md.read_text()))
    seconds = (outdir / ".seconds").read_text().strip()
    command = "pyro-sdebnn benchmark two-moons --quick --output DIR" if quick else "pyro-sdebnn benchmark two-moons --output DIR"
    mode = "quick (smoke) mode" if quick else "full mode"
    (outdir / "run.inc").write_text(
        f"The table and figures below were produced by ``{command}`` ({mode}, seed 0) while this page was built; "
        f"it took {seconds} s on the build machine.\n"
    )


def builder_inited(app) -> None:
    GENERATED.mkdir(exist_ok=True)
    build_two_moons(app)
    build_tutorials(app)


# ------------------------------------------------------------------------------------------------ references
def _import_dotted(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


def canonical_name(dotted: str) -> str | None:
    """The defining location ``module.qualname`` of a dotted pyro_sdebnn name, or ``None`` if it does not import."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        path = obj.__name__
        for part in parts[i:]:
            try:
                obj = getattr(obj, part)
            except AttributeError:
                return None
            obj = getattr(obj, "__func__", obj)
            if isinstance(obj, types.ModuleType):
                path = obj.__name__
            elif isinstance(obj, (type, types.FunctionType)) and "<" not in getattr(obj, "__qualname__", "<"):
                path = f"{obj.__module__}.{obj.__qualname__}"
            else:
                path = f"{path}.{part}"
        return path
    return None


def _object_index(app, env) -> dict[int, str]:
    """``id(object) -> documented name`` for the documented pyro_sdebnn objects (data attributes included)."""
    cached = getattr(app, "_pyro_sdebnn_object_index", None)
    if cached is not None:
        return cached
    index: dict[int, str] = {}
    for name, _, objtype, _, _, _ in env.get_domain("py").get_objects():
        if not name.startswith(PACKAGE + ".") or objtype == "module":
            continue
        try:
            obj = _import_dotted(name)
        except Exception:  # noqa: BLE001 -- an object that does not import is simply not indexed
            continue
        if isinstance(obj, (int, float, str, bool, type(None))):
            continue  # interned values have no identity worth matching
        index.setdefault(id(getattr(obj, "__func__", obj)), name)
    app._pyro_sdebnn_object_index = index
    return index


def missing_reference(app, env, node, contnode):
    """Resolve a reference to a re-exported pyro_sdebnn name to the place the object is documented."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    modname, clsname = node.get("py:module"), node.get("py:class")
    candidates = []
    if target.startswith(PACKAGE + ".") or target == PACKAGE:
        candidates.append(target)
    else:
        if modname and clsname:
            candidates.append(f"{modname}.{clsname}.{target}")
        if modname and modname.startswith(PACKAGE):
            candidates.append(f"{modname}.{target}")
    domain = env.get_domain("py")
    documented = {name for name, *_ in domain.get_objects()}
    for candidate in candidates:
        if any(part.startswith("_") for part in candidate.split(".")):
            # A private helper (``_update``, a ``_Mixin`` base class) is not documented: if it exists, the
            # reference is rendered as code without a link; if it does not, it stays a broken reference.
            try:
                _import_dotted(candidate)
            except Exception:  # noqa: BLE001
                continue
            return contnode
        names = [canonical_name(candidate)]
        try:
            obj = _import_dotted(candidate)
            if isinstance(obj, typing.TypeVar):
                return contnode  # a type variable of a signature: nothing to link to
            names.append(_object_index(app, env).get(id(getattr(obj, "__func__", obj))))
        except Exception:  # noqa: BLE001
            pass
        for name in names:
            if name and name in documented:
                new = node.deepcopy()
                new["reftarget"] = name
                new["refspecific"] = False
                result = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], name, new, contnode)
                if result is not None:
                    return result
    return None


def public_bases(app, name, obj, options, bases) -> None:
    """Drop from a class's "Bases:" line the package's internal bases: a mixin that its module does not list in
    ``__all__`` is not documented (not public API), so a link to it could not resolve."""
    def internal(base) -> bool:
        module = sys.modules.get(getattr(base, "__module__", "") or "")
        if module is None or not module.__name__.startswith(PACKAGE + "."):
            return False
        listed = getattr(module, "__all__", None)
        return listed is not None and base.__name__ not in listed

    bases[:] = [base for base in bases if not internal(base)]


def setup(app):
    # the sphinx-gallery-style layout of the tutorial pages (set in conf.py; only these values are supported)
    app.add_config_value("tutorials_examples_dir", "../tutorials", "env")
    app.add_config_value("tutorials_gallery_dir", "tutorials", "env")
    app.connect("builder-inited", builder_inited)
    app.connect("missing-reference", missing_reference)
    app.connect("autodoc-process-bases", public_bases)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
