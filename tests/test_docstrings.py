# SPDX-License-Identifier: Apache-2.0
"""Every docstring of the package is at most ``MAX_LINES`` lines.

A docstring says what and why, with the equation and the full reference; detailed protocols and option tables go to
the documentation page of the subject (``docs/``), measured figures to ``BENCHMARKS.md``. The length counted is that
of the docstring statement in the source (its first to its last line, quotes included), for every module, class and
function (methods and nested functions included) of ``pyro_sdebnn/``, read with :mod:`ast` (nothing is imported).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pyro_sdebnn"
MAX_LINES = 40

_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_lengths(source: str) -> list[tuple[str, int, int]]:
    """``(name, first line, number of lines)`` of every docstring of the module source ``source`` (name: the
    dotted path of the class or function inside the module, ``"<module>"`` for the module's own)."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _DOCUMENTED):
                name = f"{prefix}{child.name}"
                statement = _docstring_statement(child)
                if statement is not None:
                    found.append((name, statement.lineno, statement.end_lineno - statement.lineno + 1))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    tree = ast.parse(source)
    statement = _docstring_statement(tree)
    if statement is not None:
        found.append(("<module>", statement.lineno, statement.end_lineno - statement.lineno + 1))
    visit(tree, "")
    return found


def _docstring_statement(node: ast.AST) -> ast.Expr | None:
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0]
    return None


def test_the_walk_counts_the_docstring_statement_of_every_kind_of_definition():
    source = textwrap.dedent('''
        """Module,
        two lines."""
        import os

        class A:
            """Class."""

            def method(self):
                """Method,

                three lines."""

                def inner():
                    """Nested."""

        async def g():
            """Async."""

        def no_docstring():
            x = "a string that is not first"
    ''')
    assert docstring_lengths(source) == [
        ("<module>", 2, 2), ("A", 7, 1), ("A.method", 10, 3), ("A.method.inner", 15, 1), ("g", 18, 1),
    ]


def test_every_docstring_of_the_package_is_at_most_40_lines():
    too_long, counted = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        for name, line, length in docstring_lengths(path.read_text()):
            counted += 1
            if length > MAX_LINES:
                too_long.append(f"{path.relative_to(PACKAGE.parent)}:{line} {name}: {length} lines")
    assert counted > 500, f"only {counted} docstrings found under {PACKAGE}"  # the walk reached the package
    assert not too_long, (
        f"docstrings longer than {MAX_LINES} lines (say what and why; move detailed protocols and option tables to "
        "the docs page of the subject, measured figures to BENCHMARKS.md):\n" + "\n".join(too_long))
