# SPDX-License-Identifier: Apache-2.0
"""Docstrings and documentation pages render as they read: markup slips that no Sphinx warning catches.

Each docstring of ``pyro_sdebnn/`` (read with :mod:`ast`, nothing imported), each page of ``docs/`` and each
tutorial page (as the documentation build writes it from ``tutorials/NN_name.py``, without running the script) is
parsed with docutils, as autodoc and Sphinx parse them, and the parse tree is checked for structures that
reStructuredText builds silently from an innocent-looking line:

- a lettered or roman enumerated list: a line such as ``1. E. Daxberger (2021) ...`` or a field body ``D.`` starts
  a nested list at "E" or "D", and the letter disappears from the page;
- a definition list: a line followed by a more indented line (a reference whose second line is indented, a
  Google-style ``Args:`` section) becomes a bold term and an indented definition;
- a block quote: an indented paragraph (a code block whose ``::`` is missing) is set as a quotation;
- a ``:param`` or ``:returns:`` field written inside a paragraph, which stays as literal text;
- a control character in a docstring: ``\\alpha`` in a docstring that is not a raw string is a bell character
  followed by "lpha" (likewise ``\\beta``, ``\\frac``, ``\\nabla``, ``\\theta``, ``\\rho``, ``\\varepsilon``);
- a doubled backslash before a command in ``:math:`` (``\\\\eta``, from a raw string written as a non-raw one),
  which MathJax reads as a line break followed by "eta".

The Sphinx roles and directives that docutils does not know only produce system messages, which are ignored here;
the documentation build (``-W -n``) reports those. To keep the test fast, only a text that could hold one of these
structures is parsed: one with a line that starts with a letter or roman numeral and a period or parenthesis (after
any list or field marker), or with a line more indented than the non-blank line before it where that line is a
plain text line (not a field, list item, directive, doctest or a line ending in ``::``). A block quote inside a
list item or a field body is therefore not looked for.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import re
from pathlib import Path

import pytest
from docutils import nodes
from docutils.frontend import get_default_settings
from docutils.parsers.rst import Parser
from docutils.utils import new_document

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pyro_sdebnn"
DOCS = ROOT / "docs"

_PARSER = Parser()
_SETTINGS = get_default_settings(Parser)
_SETTINGS.report_level = 5  # silent: unknown Sphinx roles and directives are the build's business
_SETTINGS.halt_level = 5
_SETTINGS.warning_stream = io.StringIO()

_LETTERED = {"loweralpha", "upperalpha", "lowerroman", "upperroman"}
_FIELD = r":(param|parameter|type|returns?|rtype|raises?)\b[^:`]*:(\s|$)"
_FIELD_IN_TEXT = re.compile(r"(^|\s)" + _FIELD)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_MATH_ROLE = re.compile(r":math:`([^`]*)`")
_DOUBLED_COMMAND = re.compile(r"(?<!\\)\\\\[A-Za-z]")
# lines that could start a lettered or roman list: "E. Daxberger", "1. E. Daxberger", ":param d: D.", "(iv) ..."
_LETTER_MARKER = re.compile(r"^\s*(?:(?:\d+|#)[.)]\s+|[-*+]\s+|:[^:]+:\s+)*\(?([A-Za-z]|[ivxlcdmIVXLCDM]+)[.)](\s|$)",
                            re.MULTILINE)
# a field written after text on the same line
_FIELD_AFTER_TEXT = re.compile(r"[^\s`][ \t]+" + _FIELD)
# lines after which a more indented line is expected: fields, list items, directives, doctests
_OPENS_BLOCK = re.compile(r"^\s*(?::|\.\.|>>>|[-*+] |\d+[.)] |#\. |\(?[A-Za-z][.)] )")


def parse(text: str) -> nodes.document:
    document = new_document("<docstring>", _SETTINGS)
    _PARSER.parse(text, document)
    return document


def markup_problems(text: str) -> list[str]:
    """What renders differently from how ``text`` (a docstring after :func:`inspect.cleandoc`, or a page) reads."""
    problems = []
    control = _CONTROL.search(text)
    if control:
        problems.append(f"control character {control.group()!r} (a backslash escape in a docstring that is not a "
                        "raw string)")
    for tex in _MATH_ROLE.findall(text):
        if _DOUBLED_COMMAND.search(tex):
            problems.append(f"doubled backslash before a command in :math:`{tex}`")
    if not _needs_parse(text):
        return problems
    for node in parse(text).findall(lambda n: not isinstance(n, (nodes.Text, nodes.system_message))):
        if any(isinstance(a, nodes.system_message) for a in _ancestors(node)):
            continue
        shown = node.astext().strip() or (node.parent.astext().strip() if node.parent is not None else "")
        where = shown.splitlines()[0][:80] if shown else ""
        if isinstance(node, nodes.enumerated_list) and node.get("enumtype") in _LETTERED:
            problems.append(f"{node['enumtype']} enumerated list (a letter taken as a list marker): {where!r}")
        elif isinstance(node, nodes.definition_list):
            problems.append(f"definition list (a line followed by a more indented line): {where!r}")
        elif isinstance(node, nodes.block_quote):
            problems.append(f"block quote (an indented paragraph; a missing '::'?): {where!r}")
        elif isinstance(node, nodes.paragraph):
            prose = "".join(t.astext() for t in node.findall(nodes.Text) if not isinstance(t.parent, nodes.literal))
            if _FIELD_IN_TEXT.search(prose):
                problems.append(f"field inside a paragraph, shown as text: {where!r}")
    return problems


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _needs_parse(text: str) -> bool:
    """Whether ``text`` may hold one of the structures looked for (see the module docstring)."""
    if _LETTER_MARKER.search(text) or _FIELD_AFTER_TEXT.search(text):
        return True
    previous, blank = None, False
    for line in text.splitlines():
        if not line.strip():
            blank = True
            continue
        if previous is not None and not _OPENS_BLOCK.match(previous):
            if _indent(line) > _indent(previous) and not previous.rstrip().endswith("::"):
                return True  # a definition list or a block quote
            if not blank and _indent(line) >= _indent(previous) and re.match(r"\s*" + _FIELD, line):
                return True  # a field line right under a text line continues its paragraph
        previous, blank = line, False
    return False


def _ancestors(node: nodes.Node):
    while node.parent is not None:
        node = node.parent
        yield node


def package_docstrings() -> list[tuple[str, str]]:
    """``(path:line name, cleaned docstring)`` of every module, class and function docstring of the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node, clean=True)
                if text:
                    line = node.body[0].lineno
                    found.append((f"{path.relative_to(ROOT)}:{line} {getattr(node, 'name', '<module>')}", text))
    return found


def documentation_pages() -> list[Path]:
    """The hand-written pages of ``docs/`` (not the build, the included outputs or the executed tutorial pages)."""
    skipped = {"_build", "generated"}
    return [
        path for path in sorted(DOCS.rglob("*.rst"))
        if not skipped & set(path.relative_to(DOCS).parts)
        and not (path.parent.name == "tutorials" and path.name[:1].isdigit())
    ]


@pytest.mark.parametrize("text, expected", [
    ("**References**\n\n1. E. Daxberger, A. Kristiadi (2021). Laplace Redux.\n2. D. MacKay (1992). Title.\n",
     "upperalpha"),
    (":param int weight_dim: D.\n:param int hidden_dim: H.\n", "upperalpha"),
    ("[1] Max Welling, Yee Whye Teh (2011). \"Title\".\n    ICML 2011.\n", "definition list"),
    ("Compute it.\n\nArgs:\n    value (Tensor): the value.\n", "definition list"),
    ("Run this:\n\n    python -m pyro_sdebnn datasets\n", "block quote"),
    (":param x: inputs. :param y: targets.\n", "field inside a paragraph"),
    ("Compute it.\n:param x: inputs.\n", "field inside a paragraph"),
    ("Noise variances :math:`\alpha`.", "control character"),
    ("Step size :math:`\\\\eta_t`.", "doubled backslash"),
])
def test_each_slip_is_caught(text, expected):
    problems = markup_problems(text)
    assert any(expected in problem for problem in problems), problems


@pytest.mark.parametrize("text", [
    "**References**\n\n1. Erik Daxberger, Agustinus Kristiadi (2021). Laplace Redux.\n2. David MacKay (1992). T.\n",
    "**References**\n\n1. J. Schmitt, S. Roth (2021). Sampling-free Variational Inference for Neural Networks with\n"
    "   Multiplicative Activation Noise. GCPR 2021.\n",
    "[1] Max Welling, Yee Whye Teh (2011). \"Title\".\nICML 2011.\n",
    ":param int weight_dim: D, the number of weights.\n:param y: targets,\n    continued.\n",
    "Compute it.\n\n:param x: inputs,\n    continued.\n:param y: targets.\n",
    "Write ``:param x: text`` in a docstring.",
    "Run this::\n\n    python -m pyro_sdebnn datasets\n",
    ".. math::\n\n    Q = \\begin{pmatrix} 0 & -1 \\\\ 1 & 0 \\end{pmatrix}\n",
    "Step size :math:`\\eta_t`; a matrix :math:`\\begin{pmatrix} a \\\\ b \\end{pmatrix}`.",
])
def test_what_reads_right_passes(text):
    assert markup_problems(text) == []


def test_the_docstrings_of_the_package_render_as_they_read():
    docstrings = package_docstrings()
    assert len(docstrings) > 500, f"only {len(docstrings)} docstrings found under {PACKAGE}"
    bad = [f"{where}: {problem}" for where, text in docstrings for problem in markup_problems(text)]
    assert not bad, "docstrings that render differently from how they read:\n" + "\n".join(bad)


def test_the_tutorial_pages_render_as_they_read(tmp_path):
    spec = importlib.util.spec_from_file_location("_tutorial_pages", DOCS / "_ext" / "pyro_sdebnn_docs.py")
    extension = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extension)
    scripts = extension.tutorial_scripts()
    assert len(scripts) >= 5, f"only {len(scripts)} tutorials found"
    # the page the documentation build writes, less the figures and the printed output (the script is not run)
    pages = {script.name: extension.tutorial_page(script, tmp_path, "", "quick") for script in scripts}
    bad = [f"tutorials/{name}: {problem}" for name, page in pages.items() for problem in markup_problems(page)]
    assert not bad, "tutorial pages that render differently from how they read:\n" + "\n".join(bad)


def test_the_documentation_pages_render_as_they_read():
    pages = documentation_pages()
    assert len(pages) > 10, f"only {len(pages)} pages found under {DOCS}"
    bad = [f"{path.relative_to(ROOT)}: {problem}" for path in pages for problem in markup_problems(path.read_text())]
    assert not bad, "documentation pages that render differently from how they read:\n" + "\n".join(bad)
