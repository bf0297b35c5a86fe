# SPDX-License-Identifier: Apache-2.0
"""Every tutorial runs in quick mode (so the tutorials cannot rot) and writes at least one file."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("[0-9]*.py"))


def test_tutorials_exist():
    assert TUTORIALS, "no tutorials/[0-9]*.py found"


@pytest.mark.parametrize("script", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_in_quick_mode(script, tmp_path):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--output", str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    written = [p for p in out.rglob("*") if p.is_file()]
    assert written, f"{script.name} wrote no file into --output"
