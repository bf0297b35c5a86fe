# SPDX-License-Identifier: Apache-2.0
import json
import subprocess
import sys

import pytest

from pyro_sdebnn.cli import build_parser, main, resolve_device


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for word in ("datasets", "benchmark", "--device", "--seed", "--output", "--quick"):
        assert word in out


def test_common_options_accepted_after_subcommand():
    args = build_parser().parse_args(["datasets", "--seed", "7", "--device", "cpu"])
    assert args.seed == 7 and args.device == "cpu"
    args = build_parser().parse_args(["--seed", "3", "datasets"])
    assert args.seed == 3


def test_bad_device_is_a_clear_error():
    with pytest.raises(ValueError, match="--device"):
        resolve_device("not-a-device")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")


def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-m", "pyro_sdebnn", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "pyro-sdebnn" in proc.stdout


def test_datasets_lists_every_bundled_data_set(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    names = ("two_moons", "toy_regression_1d", "gap_regression_1d", "uci_boston", "mnist_subset", "digits", "mnist")
    for name in names:
        assert name in out
    assert "(455, 13)" in out  # Boston 90/10 split of 506 rows


def test_datasets_json(capsys):
    import json

    assert main(["datasets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["name"] for row in rows} >= {"two_moons", "uci_boston"}
    assert all(set(row) >= {"name", "task", "shapes", "source"} for row in rows)


def _fake_experiments(monkeypatch, run):
    """Replace the discovered experiments by one, ``fake``, whose ``run`` is given."""
    import types

    import pyro_sdebnn.experiments

    module = types.SimpleNamespace(NAME="fake", DESCRIPTION="a test double", add_arguments=lambda parser: None, run=run)
    monkeypatch.setattr(pyro_sdebnn.experiments, "discover", lambda: {"fake": module})


@pytest.mark.parametrize(
    "error", [ValueError("--epochs must be positive, got 0"), FileNotFoundError("MNIST not found under data/")]
)
def test_user_errors_are_one_line_exit_2(monkeypatch, capsys, tmp_path, error):
    def run(args):
        raise error

    _fake_experiments(monkeypatch, run)
    assert main(["benchmark", "fake", "--output", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"pyro-sdebnn: error: {error}\n"


@pytest.mark.parametrize("error", [ValueError("shape mismatch in a matmul"), RuntimeError("CUDA error"), KeyError("w")])
def test_bugs_inside_an_experiment_propagate(monkeypatch, tmp_path, error):
    def run(args):
        raise error

    _fake_experiments(monkeypatch, run)
    with pytest.raises(type(error), match=str(error).strip("'")):
        main(["benchmark", "fake", "--output", str(tmp_path)])


def test_bad_device_and_unknown_benchmark_exit_2(monkeypatch, capsys, tmp_path):
    _fake_experiments(monkeypatch, lambda args: pytest.fail("run must not start"))
    assert main(["benchmark", "fake", "--device", "not-a-device", "--output", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("pyro-sdebnn: error: --device")
    with pytest.raises(SystemExit) as exit_info:
        main(["benchmark", "bogus"])
    assert exit_info.value.code == 2


def test_benchmark_gets_resolved_args_and_seed(monkeypatch, capsys, tmp_path):
    import torch

    seen = {}

    def run(args):
        seen.update(vars(args), draw=torch.rand(()))
        return {"value": 1}

    _fake_experiments(monkeypatch, run)
    assert main(["benchmark", "fake", "--seed", "3", "--output", str(tmp_path / "out")]) == 0
    assert seen["device"] == torch.device("cpu") and seen["output"] == tmp_path / "out" and seen["output"].is_dir()
    torch.manual_seed(3)
    assert seen["draw"] == torch.rand(())
    out = capsys.readouterr().out
    assert "value  1" in out and '"value"' not in out  # a text table, not a JSON dump
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == {"value": 1}


def test_end_of_run_prints_tables_and_the_files_written(monkeypatch, capsys, tmp_path):
    import os

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    old = out_dir / "from_an_earlier_run.csv"
    old.write_text("x\n")
    os.utime(old, (1, 1))  # written long before this run

    def run(args):
        (args.output / "figs").mkdir()
        (args.output / "figs" / "reliability.png").write_bytes(b"png")
        (args.output / "table.md").write_text("| a |\n")
        return {
            "methods": {"sdebnn": {"accuracy": 0.96391, "ece": 0.0253}, "odenet": {"accuracy": 0.9712, "ece": 0.031}},
            "solver_tolerance": [{"solver": "euler", "seconds": 1.5}, {"solver": "srk", "seconds": 3.25}],
        }

    _fake_experiments(monkeypatch, run)
    assert main(["benchmark", "fake", "--output", str(out_dir)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "{" not in out
    header = next(line for line in lines if line.split()[:1] == ["method"])
    assert header.split() == ["method", "accuracy", "ece"]
    assert any(line.split() == ["sdebnn", "0.9639", "0.0253"] for line in lines)
    assert any(line.split() == ["srk", "3.25"] for line in lines)
    listed = [line.split()[0] for line in lines[lines.index(f"files written under {out_dir}:") + 1:]]
    assert listed == ["figs/reliability.png", "summary.json", "table.md"]


def test_format_summary_layouts():
    from pyro_sdebnn.cli import format_summary

    flat = format_summary({"steps": 400, "final_loss": 1.23456, "converged": True})
    assert flat[0].split() == ["name", "value"] and flat[3].split() == ["final_loss", "1.235"]
    rows = format_summary({"sgld": {"rmse": 3.4}, "fsgld": "failed: SamplerDivergenceError"})
    assert rows[0].split() == ["method", "rmse", "status"]
    assert rows[3].split() == ["fsgld", "failed:", "SamplerDivergenceError"]
    nested = format_summary({"split 0": {"mnvi": {"ll": -2.5}}, "note": "paper protocol"})
    assert "split 0" in nested and any(line.split() == ["mnvi", "-2.5"] for line in nested)


def test_data_dir_is_global_or_per_image_benchmark():
    from pathlib import Path

    parser = build_parser()
    args = parser.parse_args(["benchmark", "sdebnn-mnist"])
    assert args.data_dir is None and args.download is False  # bundled subsets, no download
    args = parser.parse_args(["--data-dir", "a", "benchmark", "sdebnn-mnist"])
    assert args.data_dir == Path("a") and args.download is False
    args = parser.parse_args(["--data-dir", "a", "benchmark", "mnvi-mnist", "--data-dir", "b", "--download"])
    assert args.data_dir == Path("b") and args.download is True
