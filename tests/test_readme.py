# SPDX-License-Identifier: Apache-2.0
"""The README's commands and examples must stay true: run every ```python block and check the commands exist."""

import re
import shlex
from pathlib import Path

import pyro
import pytest
import torch

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


def _block_with(text: str) -> str:
    """The one README Python block that contains ``text``."""
    blocks = [block for block in PYTHON_BLOCKS if text in block]
    assert len(blocks) == 1, f"{len(blocks)} README blocks contain {text!r}"
    return blocks[0]


def test_readme_guide_swap_runs_on_the_readme_model(capsys):
    # "swapping it is one line: Pyro's AutoNormal ... or NeuralSDEGuide": the quickstart with its guide line replaced
    # by the AutoNormal of its comment, everything else unchanged, trains and predicts
    block = _block_with("guide = NeuralSDEGuide(net)")
    guide_line = re.search(r"^guide = NeuralSDEGuide\(net\) +# or: (guide = AutoNormal\(net\.model\))$", block,
                           flags=re.M)
    assert guide_line is not None, "the quickstart's guide line no longer names its AutoNormal swap"
    code = block.replace(guide_line.group(0), guide_line.group(1))
    assert code.count("AutoNormal(net.model)") == 1 and "NeuralSDEGuide(net)" not in code
    namespace: dict = {"__name__": "readme_swap_AutoNormal"}
    exec(compile(code, "README.md[quickstart, AutoNormal]", "exec"), namespace)
    assert type(namespace["guide"]).__name__ == "AutoNormal"
    assert namespace["probs"].shape == (500, 2)
    assert torch.allclose(namespace["probs"].sum(-1), torch.ones(500))
    assert "ECE" in capsys.readouterr().out


def test_readme_kernel_swaps_run_on_the_readme_model(capsys):
    # "Swap SGHMC(...) for SGLD(model, step_size=...), or for FSGLD(model, gp_prior=...)": the SG-MCMC example with
    # each swap, its model unchanged (no deterministic site: fSGLD reads the logits of its likelihood); the runs are
    # shortened, the swap is the claim
    block = _block_with("kernel = SGHMC(")
    kernel_line = re.search(r"^kernel = SGHMC\(.*\)$", block, flags=re.M).group(0)
    assert "Swap `SGHMC(...)` for `SGLD(model, step_size=...)`, or for `FSGLD(model, gp_prior=...)`" in TEXT
    swaps = {
        "SGLD": "from pyro_sdebnn.infer.mcmc import SGLD\n"
                "kernel = SGLD(model, step_size=1e-3, num_steps=10, subsample_size=32)",
        "FSGLD": "import pyro.contrib.gp as gp\nfrom pyro_sdebnn.infer.mcmc import FSGLD\n"
                 "kernel = FSGLD(model, gp_prior=gp.kernels.RBF(2), step_size=1e-4, num_steps=10, subsample_size=32)",
    }
    for name, swap in swaps.items():
        code = block.replace(kernel_line, swap).replace("num_samples=30, warmup_steps=50",
                                                        "num_samples=10, warmup_steps=10, disable_progbar=True")
        assert code.count(name + "(model") == 1 and "disable_progbar" in code
        namespace: dict = {"__name__": f"readme_swap_{name}"}
        pyro.set_rng_seed(0)
        exec(compile(code, f"README.md[python block 0, {name}]", "exec"), namespace)
        assert type(namespace["kernel"]).__name__ == name
        assert namespace["idata"].log_likelihood["y"].shape == (1, 10, 200)
        assert "ECE" in capsys.readouterr().out


def test_readme_benchmark_names_exist():
    from pyro_sdebnn.experiments import discover

    names = set(discover())
    mentioned = set(re.findall(r"benchmark ([a-z][a-z0-9-]+)", TEXT)) | set(
        re.findall(r"(?<![#\w-])((?:sdebnn|mnvi|sgmcmc|fsgmcmc)-[a-z]+)\b", TEXT)  # not a link anchor
    )
    assert mentioned, "the README names no benchmark"
    assert mentioned <= names, f"README names benchmarks that do not exist: {sorted(mentioned - names)}"


def test_readme_benchmark_help_comment_lists_every_benchmark():
    # the comment after `pyro-sdebnn benchmark --help` (it may run over several comment lines) says what the
    # command lists: every benchmark the CLI has
    from pyro_sdebnn.experiments import discover

    match = re.search(r"^pyro-sdebnn benchmark --help +#(.*(?:\n +#.*)*)", TEXT, flags=re.M)
    assert match is not None, "the README no longer shows `pyro-sdebnn benchmark --help`"
    listed = {name.strip() for name in match.group(1).replace("#", "").split(",")}
    assert listed == set(discover()), f"listed {sorted(listed)}, the CLI has {sorted(discover())}"


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
