# SPDX-License-Identifier: Apache-2.0
"""The structure of the Sphinx documentation in ``docs/`` (the build itself runs in ``.ci/run``).

Cheap checks that need neither Sphinx nor a build: every subpackage and module has its API page, every tutorial
is listed and rendered with the figures it saves, every page is reachable from a toctree, the reference
filter ignores other projects only, and the README and CI run the same build command. Every Python block of every
page (``.. code-block:: python`` and the ``::`` literal blocks that are Python) runs, the blocks of a page in order
in one namespace, as a reader would paste them; the few that cannot run here are listed in ``SKIPPED`` with why.
"""

import ast
import importlib.util
import re
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "pyro_sdebnn"
BUILD_COMMAND = "python -m sphinx -W --keep-going -n -b html docs docs/_build/html"


# (page, first line of the block) -> why the block does not run in the test suite
SKIPPED = {
    ("distributed.rst", 32): "a train.py under torchrun, with placeholders (...) for the user's code",
    ("distributed.rst", 81): "a train.py under torchrun: the user's network, data set and sigma stand as placeholders",
    ("distributed.rst", 105): "a train.py under torchrun: the user's model, guide and optimiser",
    ("distributed.rst", 116): "a train.py under torchrun: the user's data set (train_set, d) and networks",
    ("distributed.rst", 187): "a train.py under torchrun: the user's data set (train_set, d)",
    ("distributed.rst", 204): "a train.py under torchrun: the user's model and data (x, y)",
    ("distributed.rst", 221): "a train.py under torchrun: the user's model and data set",
    ("distributed.rst", 254): "a train.py under torchrun: the user's loader and test inputs",
}


def _literal_blocks(text: str) -> list[tuple[int, str, str]]:
    """``(line, language, code)`` of every ``.. code-block:: LANG`` and ``::`` literal block of an rst page (line:
    1-based, of the line that opens it; language ``"literal"`` for ``::``)."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = re.match(r"^\s*\.\. code-block::\s*(\S+)", line)
        if directive:
            lang = directive.group(1)
        elif line.rstrip().endswith("::") and not line.lstrip().startswith(".. "):
            lang = "literal"
        else:
            i += 1
            continue
        indent = len(line) - len(line.lstrip())

        def inside(k: int) -> bool:
            return lines[k].strip() == "" or len(lines[k]) - len(lines[k].lstrip()) > indent

        j = i + 1
        while j < len(lines) and inside(j) and (lines[j].strip() == "" or lines[j].lstrip().startswith(":")):
            j += 1  # blank lines and the directive's options
        body = []
        while j < len(lines) and inside(j):
            body.append(lines[j])
            j += 1
        blocks.append((i + 1, lang, textwrap.dedent("\n".join(body)).strip("\n") + "\n"))
        i = j
    return blocks


def _is_python(lang: str, code: str) -> bool:
    if lang == "python":
        return True
    if lang != "literal":
        return False
    try:
        ast.parse(code)
    except SyntaxError:  # a shell command, a formula
        return False
    return True


def _pages_with_python():
    pages = {}
    for page in sorted(DOCS.rglob("*.rst")):
        rel = page.relative_to(DOCS)
        if rel.parts[0] in ("_build", "generated") or re.match(r"tutorials/[0-9]", str(rel)):
            continue  # build outputs; the executed tutorial pages are the tutorials, which test_tutorials.py runs
        blocks = [(line, code) for line, lang, code in _literal_blocks(page.read_text()) if _is_python(lang, code)]
        if blocks:
            pages[str(rel)] = blocks
    return pages


PYTHON_PAGES = _pages_with_python()


def test_python_blocks_are_found_and_skips_are_real():
    assert {"quickstart.rst", "methods/sgmcmc.rst", "methods/baselines.rst"} <= set(PYTHON_PAGES)
    found = {(page, line) for page, blocks in PYTHON_PAGES.items() for line, _ in blocks}
    assert set(SKIPPED) <= found, f"SKIPPED names blocks that do not exist: {sorted(set(SKIPPED) - found)}"
    assert len(SKIPPED) < len(found) // 2


@pytest.mark.parametrize("page", sorted(PYTHON_PAGES))
def test_every_python_block_of_the_page_runs(page, tmp_path, monkeypatch, capsys):
    import pyro

    monkeypatch.chdir(tmp_path)  # blocks write checkpoints to the working directory
    pyro.set_rng_seed(0)
    # az.loo's diagnostic on a short chain (Pareto k above 1 - 1/log10(draws) for some point) is output for the
    # reader, not a failure of the block
    warnings.filterwarnings("ignore", message="Estimated shape parameter of Pareto", category=UserWarning)
    namespace: dict = {"__name__": f"docs_{page}"}
    ran = 0
    for line, code in PYTHON_PAGES[page]:
        if (page, line) in SKIPPED:
            continue
        exec(compile(code, f"docs/{page}:{line}", "exec"), namespace)
        ran += 1
    if ran == 0:
        pytest.skip(f"every Python block of {page} is listed in SKIPPED: {sorted({SKIPPED[(page, l)] for l, _ in PYTHON_PAGES[page]})}")


def _load_extension():
    spec = importlib.util.spec_from_file_location("pyro_sdebnn_docs", DOCS / "_ext" / "pyro_sdebnn_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("pyro_sdebnn_docs", module)
    spec.loader.exec_module(module)
    return module


def _subpackages():
    return sorted(
        ".".join(init.parent.relative_to(ROOT).parts) for init in PACKAGE.rglob("__init__.py")
    )


def _public_modules():
    names = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        if any(part.startswith("_") and part != "__init__" for part in rel.parts) or rel.name in ("conftest",):
            continue
        names.append(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
    return sorted(names)


def _automodules():
    found = set()
    for page in (DOCS / "api").glob("*.rst"):
        found.update(re.findall(r"^\.\. automodule:: (\S+)", page.read_text(), flags=re.M))
    return found


def _toctree_entries(page: Path):
    """The documents (paths relative to ``docs/``, no suffix) that the toctrees of ``page`` list."""
    entries = []
    in_tree = False
    for line in page.read_text().splitlines():
        if line.startswith(".. toctree::"):
            in_tree = True
            continue
        if in_tree:
            if line.strip() == "" or line.lstrip().startswith(":"):
                continue
            if not line.startswith("   "):
                in_tree = False
                continue
            target = (page.parent / line.strip()).resolve().relative_to(DOCS.resolve())
            entries.append(str(target.with_suffix("")) if target.suffix == ".rst" else str(target))
    return entries


@pytest.mark.parametrize("subpackage", _subpackages())
def test_every_subpackage_has_an_api_page(subpackage):
    name = "pyro_sdebnn" if subpackage == "pyro_sdebnn" else subpackage.removeprefix("pyro_sdebnn.")
    page = DOCS / "api" / f"{name}.rst"
    assert page.is_file(), f"no API page {page.relative_to(ROOT)} for {subpackage}"
    assert f".. automodule:: {subpackage}\n" in page.read_text(), f"{page.name} does not document {subpackage}"
    assert f"api/{name}" in _toctree_entries(DOCS / "api" / "index.rst"), f"{page.name} is not in api/index.rst"


def test_every_public_module_is_documented():
    missing = sorted(set(_public_modules()) - _automodules())
    assert not missing, f"modules without an automodule directive in docs/api/: {missing}"


def test_every_tutorial_is_listed_and_rendered_with_its_figures(tmp_path):
    ext = _load_extension()
    scripts = ext.tutorial_scripts()
    assert [s.name for s in scripts] == sorted(p.name for p in (ROOT / "tutorials").glob("[0-9]*.py"))
    assert scripts, "no tutorials found"
    listed = _toctree_entries(DOCS / "tutorials" / "index.rst")
    for script in scripts:
        assert f"tutorials/{script.stem}" in listed, f"{script.name} is not in the toctree of docs/tutorials/index.rst"
        figures = ext._SAVEFIG.findall(script.read_text())
        assert figures, f"{script.name} saves no figure (savefig(... 'name.png')) for its page"
        outdir = tmp_path / script.stem
        outdir.mkdir()
        for png in figures:
            (outdir / png).write_bytes(b"png")
        page = ext.tutorial_page(script, outdir, "printed line\n", "quick")
        assert page.startswith(f".. _tutorial-{script.stem}:\n"), "the label other pages link to is missing"
        title = page.splitlines()[2]
        assert title.strip() and page.splitlines()[3] == "=" * len(title), f"{script.name}: bad title {title!r}"
        for png in set(figures):
            assert page.count(f".. figure:: {script.stem}/{png}") == 1, f"{png} is not placed once on the page"
        assert "   printed line" in page


def test_every_page_is_in_a_toctree():
    reachable, todo = set(), ["index"]
    while todo:
        doc = todo.pop()
        if doc in reachable:
            continue
        reachable.add(doc)
        page = DOCS / f"{doc}.rst"
        assert page.is_file() or doc.startswith("tutorials/"), f"a toctree lists {doc}, which does not exist"
        if page.is_file():
            todo.extend(_toctree_entries(page))
    sources = {
        str(p.relative_to(DOCS).with_suffix(""))
        for p in DOCS.rglob("*.rst")
        if not p.relative_to(DOCS).parts[0] in ("_build", "generated")
        and not re.match(r"tutorials/[0-9]", str(p.relative_to(DOCS)))  # executed pages: listed above
    }
    orphans = sorted(sources - reachable)
    assert not orphans, f"pages in no toctree: {orphans}"
    for page in ("install", "quickstart", "choosing_a_method", "tutorials/index", "api/index"):
        assert page in reachable, f"{page} is not reachable from docs/index.rst"
    for method in ("sdebnn", "mnvi", "sgmcmc", "baselines", "metrics"):
        assert f"methods/{method}" in reachable, f"methods/{method} is not reachable from docs/index.rst"


def test_reference_filter_ignores_other_projects_only():
    ext = _load_extension()
    patterns = [(re.compile(t), re.compile(n)) for t, n in ext.NITPICK_IGNORE_REGEX]

    def ignored(role, target):
        return any(t.fullmatch(role) and n.fullmatch(target) for t, n in patterns)

    for target in ("torch.Tensor", "Tensor", "pyro.infer.mcmc.MCMC", "numpy.ndarray", "arviz.InferenceData",
                   "int", "None", "nn.Module", "tuple[int, ...]"):
        assert ignored("py:class", target), target
    for target in ("pyro_sdebnn.nope", "pyro_sdebnn.infer.Nope", "SGHMCX", "pyro_sdebnn.nn.SDEBNN.nope"):
        assert not ignored("py:class", target), target
        assert not ignored("py:func", target), target


def test_readme_and_ci_run_the_strict_build():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert BUILD_COMMAND in readme and BUILD_COMMAND in ci
    assert 'pip install -e ".[docs]"' in readme and 'pip install -e ".[docs]"' in ci
    conf = (DOCS / "conf.py").read_text()
    assert re.search(r"^nitpicky = True$", conf, flags=re.M)
    assert '"sphinx.ext.mathjax"' in conf and '"sphinx.ext.autodoc"' in conf
    setup_cfg = (ROOT / "setup.cfg").read_text()
    assert re.search(r"^docs =\n    sphinx", setup_cfg, flags=re.M), "no docs extra in setup.cfg"
