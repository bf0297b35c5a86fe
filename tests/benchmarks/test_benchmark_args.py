# SPDX-License-Identifier: Apache-2.0
"""The benchmark scripts parse their numeric options with the checkers of :mod:`pyro_sdebnn.experiments._arg_types`,
so that a bad value (``--repeats 0``, ``--threads -1``, ``--lr nan``) is argparse's one-line error, not a traceback
or a silent fix-up later."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))


def _option(call: ast.Call) -> str:
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return names[0] if names else f"<add_argument at line {call.lineno}>"


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_no_benchmark_option_is_parsed_with_a_bare_int_or_float(path):
    bare = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for kw in node.keywords:
                if kw.arg == "type" and isinstance(kw.value, ast.Name) and kw.value.id in ("int", "float"):
                    bare.append(f"{_option(node)} (type={kw.value.id}, line {node.lineno})")
    assert not bare, (f"benchmarks/{path.name}: options parsed with a bare int/float, use a checker of "
                      f"pyro_sdebnn.experiments._arg_types instead: {', '.join(bare)}")


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_the_name_check_is_not_rebound_where_it_is_the_checkers_module(path):
    tree = ast.parse(path.read_text())
    if not any(isinstance(node, ast.ImportFrom) and node.module == "pyro_sdebnn.experiments"
               and any(a.name == "_arg_types" and a.asname == "check" for a in node.names) for node in tree.body):
        return
    rebound = [node.lineno for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
               and node.name == "check"]
    rebound += [node.lineno for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "check" for t in node.targets)]
    assert not rebound, f"benchmarks/{path.name}: the module-level name 'check' is rebound at lines {rebound}"


def test_a_bad_value_is_argparses_one_line_error():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cli_startup.py"), "--repeats", "0"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "argument --repeats: expected an integer >= 1, got '0'" in proc.stderr
    assert "Traceback" not in proc.stderr
