# SPDX-License-Identifier: Apache-2.0
"""The README's commands and examples must stay true: run every ```python block and check the commands exist."""

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
BASH_BLOCKS = re.findall(r"```bash\n(.*?)```", TEXT, flags=re.S)


def test_readme_has_examples_and_commands():
    assert len(PYTHON_BLOCKS) >= 2
    assert 'pip install -e ".[dev]"' in TEXT
    assert "python -m pytest" in TEXT


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_block_runs(index, capsys):
    namespace: dict = {"__name__": f"readme_block_{index}"}
    exec(compile(PYTHON_BLOCKS[index], f"README.md[python block {index}]", "exec"), namespace)


def test_readme_benchmark_names_exist():
    from pyro_sdebnn.experiments import discover

    names = set(discover())
    mentioned = set(re.findall(r"benchmark ([a-z][a-z0-9-]+)", TEXT)) | set(
        re.findall(r"(?<![#\w-])((?:sdebnn|mnvi|sgmcmc|fsgmcmc)-[a-z]+)\b", TEXT)  # not a link anchor
    )
    assert mentioned, "the README names no benchmark"
    assert mentioned <= names, f"README names benchmarks that do not exist: {sorted(mentioned - names)}"


def test_readme_cli_commands_parse():
    from pyro_sdebnn.cli import build_parser

    parser = build_parser()
    for block in BASH_BLOCKS:
        for line in block.splitlines():
            command = line.split("#")[0].strip()
            if not command.startswith("pyro-sdebnn"):
                continue
            argv = shlex.split(command)[1:]
            if "--help" in argv:
                continue
            parser.parse_args(argv)  # raises SystemExit on an unknown command or option
