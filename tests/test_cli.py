# SPDX-License-Identifier: Apache-2.0
import json
import subprocess
import sys

import pytest

from pyro_sdebnn._commands import resolve_device
from pyro_sdebnn.cli import build_parser, main
from pyro_sdebnn.experiments import REGISTRY


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


def test_python_dash_m_entry_point_and_a_light_start():
    # python -m pyro_sdebnn works; --help and --version import neither torch nor any experiment module
    code = (
        "import contextlib, io, runpy, sys\n"
        "sys.argv = ['pyro-sdebnn', '--help']\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n"
        "        runpy.run_module('pyro_sdebnn', run_name='__main__')\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, exit.code\n"
        "from pyro_sdebnn.cli import main\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n"
        "        main(['--version'])\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, exit.code\n"
        "light = ('pyro_sdebnn.experiments._arg_types', 'pyro_sdebnn.experiments._report')\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pyro', 'numpy')\n"
        "               or m.startswith('pyro_sdebnn.experiments.') and m not in light or m == 'pyro_sdebnn._commands')\n"
        "print(out.getvalue())\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: pyro-sdebnn" in proc.stdout and "pyro-sdebnn 0." in proc.stdout
    assert "HEAVY []" in proc.stdout, proc.stdout.splitlines()[-1]


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


def _fake_experiments(run):
    """The ``experiments`` argument of ``main``: one benchmark, ``fake``, whose ``run`` is given."""
    import types

    module = types.SimpleNamespace(NAME="fake", DESCRIPTION="a test double", add_arguments=lambda parser: None, run=run)
    return {"fake": module}


@pytest.mark.parametrize(
    "error", [ValueError("--epochs must be positive, got 0"), FileNotFoundError("MNIST not found under data/")]
)
def test_user_errors_are_one_line_exit_2(capsys, tmp_path, error):
    def run(args):
        raise error

    fake = _fake_experiments(run)
    assert main(["benchmark", "fake", "--output", str(tmp_path)], fake) == 2
    assert capsys.readouterr().err == f"pyro-sdebnn: error: {error}\n"


@pytest.mark.parametrize("error", [ValueError("shape mismatch in a matmul"), RuntimeError("CUDA error"), KeyError("w")])
def test_bugs_inside_an_experiment_propagate(tmp_path, error):
    def run(args):
        raise error

    fake = _fake_experiments(run)
    with pytest.raises(type(error), match=str(error).strip("'")):
        main(["benchmark", "fake", "--output", str(tmp_path)], fake)


def test_bad_device_and_unknown_benchmark_exit_2(capsys, tmp_path):
    fake = _fake_experiments(lambda args: pytest.fail("run must not start"))
    assert main(["benchmark", "fake", "--device", "not-a-device", "--output", str(tmp_path)], fake) == 2
    assert capsys.readouterr().err.startswith("pyro-sdebnn: error: --device")
    with pytest.raises(SystemExit) as exit_info:
        main(["benchmark", "bogus"], fake)
    assert exit_info.value.code == 2


def test_benchmark_gets_resolved_args_and_seed(capsys, tmp_path):
    import torch

    seen = {}

    def run(args):
        seen.update(vars(args), draw=torch.rand(()))
        return {"value": 1}

    fake = _fake_experiments(run)
    assert main(["benchmark", "fake", "--seed", "3", "--output", str(tmp_path / "out")], fake) == 0
    assert seen["device"] == torch.device("cpu") and seen["output"] == tmp_path / "out" and seen["output"].is_dir()
    torch.manual_seed(3)
    assert seen["draw"] == torch.rand(())
    out = capsys.readouterr().out
    assert "value  1" in out and '"value"' not in out  # a text table, not a JSON dump
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == {"value": 1}


def test_end_of_run_prints_tables_and_the_files_written(capsys, tmp_path):
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

    fake = _fake_experiments(run)
    assert main(["benchmark", "fake", "--output", str(out_dir)], fake) == 0
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
    from pyro_sdebnn.experiments._report import format_summary

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


# --------------------------------------------------------------------------- the registry
def test_registry_entries_load_with_their_description():
    from pyro_sdebnn.experiments import REGISTRY, load

    for name, entry in REGISTRY.items():
        module = load(name)
        assert module.NAME == name and module.DESCRIPTION == entry.description
        assert callable(module.add_arguments) and callable(module.run)


def test_benchmark_help_lists_every_benchmark_and_says_what_quick_does(capsys):
    from pyro_sdebnn.experiments import REGISTRY

    with pytest.raises(SystemExit) as exit_info:
        main(["benchmark", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in REGISTRY)
    with pytest.raises(SystemExit):
        main(["benchmark", "sdebnn-mnist", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--quick small, fast settings (the CI smoke mode): scikit-" in out and "8x8 digits unless --dataset" in out


# --------------------------------------------------------------------------- user errors: one line, exit 2
def _exit_2(argv, capsys, *words, experiments=None):
    with pytest.raises(SystemExit) as exit_info:
        main(argv, experiments)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("pyro-sdebnn") and ": error: " in err[-1], err
    for word in words:
        assert word in err[-1], (word, err[-1])
    return err[-1]


@pytest.mark.parametrize("argv, words", [
    (["--seed", "-1", "datasets"], ("--seed", "[0, 2147483647]")),
    (["--seed", "99999999999", "datasets"], ("--seed", "[0, 2147483647]")),
    (["--seed", "1.5", "datasets"], ("--seed",)),
    (["benchmark"], ("NAME is required", "two-moons", "sdebnn-toy")),
    (["benchmark", "two-moons", "--n-train", "0"], ("--n-train", ">= 1", "'0'")),
    (["benchmark", "two-moons", "--n-train", "-5"], ("--n-train", ">= 1", "'-5'")),
    (["benchmark", "two-moons", "--threads", "0"], ("--threads", ">= 1")),
    (["benchmark", "sdebnn-toy", "--dt", "0"], ("--dt", "(0, 1]")),
    (["benchmark", "sdebnn-toy", "--dt", "-0.1"], ("--dt", "(0, 1]")),
    (["benchmark", "sdebnn-toy", "--quick", "--dt", "0"], ("--dt", "(0, 1]")),
    (["benchmark", "sdebnn-toy", "--quick", "--dt", "-0.1"], ("--dt", "(0, 1]")),
    (["benchmark", "sdebnn-toy", "--sigma", "nan"], ("--sigma", "finite")),
    (["benchmark", "sdebnn-toy", "--threads", "0"], ("--threads",)),
    (["benchmark", "sgmcmc-uci", "--splits", "0"], ("--splits", "[1, 20]")),
    (["benchmark", "sgmcmc-uci", "--splits", "21"], ("--splits", "[1, 20]")),
    (["benchmark", "sdebnn-mnist", "--download"], ("--download needs --data-dir",)),
    (["--download", "benchmark", "mnvi-mnist"], ("--download needs --data-dir",)),
    (["--download", "--quick"], ("--download needs --data-dir",)),
    (["--dist-timeout", "0", "datasets"], ("--dist-timeout",)),
    (["--dist-timeout", "1e300", "datasets"], ("--dist-timeout", "(0, 1e+09]")),  # it overflowed timedelta
])
def test_user_errors_name_the_flag_and_what_is_allowed(capsys, argv, words):
    _exit_2(argv, capsys, *words)


def test_output_that_is_a_file_or_cannot_be_written(capsys, tmp_path):
    fake = _fake_experiments(lambda args: pytest.fail("run must not start"))
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a folder\n")
    _exit_2(["benchmark", "fake", "--output", str(a_file)], capsys, "--output", "existing file", experiments=fake)
    # an empty path (an unset shell variable) would write into the current folder
    _exit_2(["benchmark", "fake", "--output", ""], capsys, "--output", "empty path", experiments=fake)
    # a folder that cannot be created (its parent is a file): the same one-line error, from the run's start
    assert main(["benchmark", "fake", "--output", str(a_file / "sub")], fake) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyro-sdebnn: error: --output: cannot write into the folder") and err.count("\n") == 1


def test_every_numeric_option_of_every_benchmark_is_checked(capsys):
    """No benchmark option takes a bare ``int`` / ``float``: each numeric one has a checker that rejects bad values
    with argparse's one line naming the option (and so exit status 2)."""
    import argparse

    from pyro_sdebnn.cli import _build
    from pyro_sdebnn.experiments import REGISTRY

    parser, bench = _build(None)
    names = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))
    checked = 0
    for name in REGISTRY:
        names.pending.pop(name)()  # fill the sub-parser as parsing its name would
        for action in names.choices[name]._actions:
            assert action.type not in (int, float), f"{name} {action.option_strings}: a bare {action.type}"
            if action.type is None or not action.option_strings or action.type.__name__ in ("Path", "folder"):
                continue
            option = action.option_strings[-1]
            for bad in ("-1", "nan", "x"):
                line = _exit_2(["benchmark", name, option, bad], capsys)
                assert f"argument {option}: expected " in line and repr(bad) in line
                checked += 1
    assert checked >= 3 * 30  # every benchmark has several numeric options


def test_quick_fills_in_only_the_options_not_given(tmp_path, monkeypatch):
    from pyro_sdebnn.experiments import sdebnn_toy

    seen = {}

    def stop(args, results):
        seen.update(dt=args.dt, hidden=args.hidden, steps=args.steps)
        raise KeyboardInterrupt

    monkeypatch.setattr(sdebnn_toy, "_regression", stop)
    assert main(["benchmark", "sdebnn-toy", "--quick", "--dt", "0.02", "--output", str(tmp_path)]) == 130
    assert seen == {"dt": 0.02, "hidden": 16, "steps": 40}


# --------------------------------------------------------------------------- Ctrl-C
def test_interrupt_keeps_the_finished_part_and_exits_130(tmp_path, capsys):
    from pyro_sdebnn.experiments._harness import Interrupted

    def run(args):
        (args.output / "table.md").write_text("| a |\n")
        raise Interrupted({"a": {"acc": 0.5}}, "1 of 3 methods finished")

    assert main(["benchmark", "fake", "--output", str(tmp_path)], _fake_experiments(run)) == 130
    captured = capsys.readouterr()
    assert "benchmark fake INTERRUPTED" in captured.out and "table.md" in captured.out
    assert "1 of 3 methods finished" in captured.err
    assert json.loads((tmp_path / "summary.json").read_text()) == {"a": {"acc": 0.5}}
    readme = (tmp_path / "README.md").read_text()
    assert "**Interrupted** (Ctrl-C / SIGINT)" in readme and "1 of 3 methods finished" in readme


def test_a_plain_keyboard_interrupt_is_noted_too(tmp_path, capsys):
    def run(args):
        (args.output / "README.md").write_text("# fake\n\nwhat this run is.\n")
        raise KeyboardInterrupt

    assert main(["benchmark", "fake", "--output", str(tmp_path)], _fake_experiments(run)) == 130
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# fake\n\nwhat this run is.\n\n**Interrupted**") and "only what had been" in readme
    assert not (tmp_path / "summary.json").exists()


def test_an_interrupt_while_starting_up_is_one_line_and_130(tmp_path, capsys):
    # Ctrl-C while the benchmark's module (and torch) is imported: the parser fills the benchmark's options then
    import types

    def add_arguments(parser):
        raise KeyboardInterrupt

    fake = {"fake": types.SimpleNamespace(NAME="fake", DESCRIPTION="d", add_arguments=add_arguments, run=None)}
    assert main(["benchmark", "fake", "--output", str(tmp_path)], fake) == 130
    assert capsys.readouterr().err == "pyro-sdebnn: interrupted (Ctrl-C / SIGINT)\n"
    assert not any(tmp_path.iterdir())


def test_sigint_to_a_running_benchmark(tmp_path):
    """The real signal: SIGINT while a benchmark runs ends the process with status 130 and the finished part kept."""
    import signal
    import time

    code = (
        "import signal, sys, time, types\n"
        "from pathlib import Path\n"
        # a process started in the background by a non-interactive shell inherits SIGINT ignored, and Python then
        # installs no KeyboardInterrupt handler: restore the handler a terminal's Ctrl-C finds
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from pyro_sdebnn.cli import main\n"
        "def run(args):\n"
        "    (args.output / 'table.md').write_text('| finished |\\n')\n"
        "    (args.output / 'started').write_text('')\n"
        "    time.sleep(60)\n"
        "fake = types.SimpleNamespace(NAME='fake', DESCRIPTION='d', add_arguments=lambda parser: None, run=run)\n"
        "sys.exit(main(['benchmark', 'fake', '--output', sys.argv[1]], {'fake': fake}))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "benchmark fake INTERRUPTED" in out and "table.md" in out and "Interrupted" in err
    assert "**Interrupted** (Ctrl-C / SIGINT)" in (tmp_path / "README.md").read_text()


def test_summary_cells_leave_out_a_nan_standard_error():
    # a single run has no standard error: the summary shows its mean alone, not "mean ± nan"
    from pyro_sdebnn.experiments._report import _cell

    assert _cell((0.5, 0.0123)) == "0.5 ± 0.0123"
    assert _cell((24.2, float("nan"))) == "24.2"
    assert _cell([3, 1]) == "3 ± 1"
    assert _cell(1.23456) == "1.235"
    assert _cell("mnvi") == "mnvi"


# --------------------------------------------------------------------------- options in the wrong place
def _options_fake(run=None, data_dir=False):
    """A benchmark ``fake`` with its own options ``--n-train N``, ``--paper`` and ``--milestones [M ...]``."""
    import types

    from pyro_sdebnn.experiments import _arg_types as check

    def add_arguments(parser):
        parser.add_argument("--n-train", type=check.positive_int, default=200)
        parser.add_argument("--paper", action="store_true")
        parser.add_argument("--milestones", type=check.positive_int, nargs="*", default=[10])
        if data_dir:
            check.add_data_dir_arguments(parser)

    run = run or (lambda args: pytest.fail("run must not start"))
    return types.SimpleNamespace(NAME="fake", DESCRIPTION="a test double", add_arguments=add_arguments, run=run)


@pytest.mark.parametrize("argv, where, fixed", [
    (["--n-train", "50", "benchmark", "fake"], "`pyro-sdebnn`", "benchmark fake --n-train 50"),
    (["benchmark", "--n-train", "50", "fake", "--quick"], "`pyro-sdebnn benchmark`",
     "benchmark fake --n-train 50 --quick"),
    (["--paper", "--seed", "3", "benchmark", "fake"], "`pyro-sdebnn`", "--seed 3 benchmark fake --paper"),
    (["benchmark", "--milestones", "3", "4", "--n-train=5", "fake"], "`pyro-sdebnn benchmark`",
     "benchmark fake --milestones 3 4 --n-train=5"),
])
def test_a_benchmark_option_before_its_name_says_where_it_goes(capsys, argv, where, fixed):
    fake = {"fake": _options_fake()}
    line = _exit_2(argv, capsys, f"of `benchmark fake`, not of {where}", "after the benchmark name",
                   f"as in: pyro-sdebnn {fixed}", experiments=fake)
    assert "invalid choice" not in line
    args = build_parser(fake).parse_args(fixed.split())  # the suggested command line is right
    assert args.benchmark == "fake" and args.n_train in (50, 5, 200)


def test_a_benchmark_option_without_a_sub_command_names_the_default_benchmark(capsys):
    fake = {"two-moons": _options_fake()}
    _exit_2(["--n-train", "50", "--quick"], capsys, "--n-train is an option of `benchmark two-moons`",
            "as in: pyro-sdebnn --quick benchmark two-moons --n-train 50", experiments=fake)


def test_global_options_also_between_benchmark_and_its_name():
    fake = {"fake": _options_fake()}
    args = build_parser(fake).parse_args(["benchmark", "--seed", "2", "--quick", "fake", "--n-train", "5"])
    assert args.seed == 2 and args.quick is True and args.n_train == 5
    args = build_parser(fake).parse_args(["--seed", "1", "benchmark", "--seed", "2", "fake", "--seed", "3"])
    assert args.seed == 3  # the last one given wins, as for any repeated option


@pytest.mark.parametrize("argv, where, fixed", [
    (["--n-train", "5", "datasets"], "pyro-sdebnn: error: --n-train is an option", "datasets"),
    (["--seed", "3", "--milestones", "4", "5", "datasets", "--json"], "pyro-sdebnn: error: --milestones is",
     "--seed 3 datasets --json"),
    (["datasets", "--n-train=5", "--paper", "--json"], "pyro-sdebnn datasets: error: --n-train, --paper are",
     "datasets --json"),
])
def test_a_benchmark_option_given_to_datasets_says_whose_it_is(capsys, argv, where, fixed):
    fake = {"fake": _options_fake()}
    line = _exit_2(argv, capsys, "of `benchmark NAME` (NAME: fake), not of `pyro-sdebnn` or `datasets`",
                   f"as in: pyro-sdebnn {fixed}", experiments=fake)
    assert line.startswith(where) and "invalid choice" not in line
    assert build_parser(fake).parse_args(fixed.split()).command == "datasets"  # the suggested line is right


def test_datasets_as_an_option_value_is_not_the_sub_command(capsys):
    fake = {"two-moons": _options_fake()}  # `--output datasets`: a folder; no sub-command, so the default benchmark
    _exit_2(["--output", "datasets", "--n-train", "5"], capsys, "--n-train is an option of `benchmark two-moons`",
            "as in: pyro-sdebnn --output datasets benchmark two-moons --n-train 5", experiments=fake)


def test_an_option_of_no_benchmark_keeps_argparse_message(capsys):
    fake = {"fake": _options_fake()}
    _exit_2(["--bogus", "benchmark", "fake"], capsys, "unrecognized arguments: --bogus", experiments=fake)
    _exit_2(["--bogus", "datasets"], capsys, "unrecognized arguments: --bogus", experiments=fake)
    _exit_2(["benchmark", "fake", "--bogus"], capsys, "unrecognized arguments: --bogus", experiments=fake)
    # a global option after `datasets` is not a benchmark's: argparse's message, not "an option of `benchmark NAME`"
    _exit_2(["datasets", "--data-dir", "DIR"], capsys, "unrecognized arguments: --data-dir DIR", experiments=fake)


# --------------------------------------------------------------------------- --data-dir
@pytest.mark.parametrize("argv", [
    ["--data-dir", "DIR", "benchmark", "fake"],
    ["benchmark", "--data-dir", "DIR", "fake"],
    ["--data-dir", "DIR", "--download", "benchmark", "fake"],
])
def test_data_dir_is_refused_for_a_benchmark_that_reads_no_files(capsys, tmp_path, argv):
    fake = {"fake": _options_fake()}
    argv = [str(tmp_path) if a == "DIR" else a for a in argv]
    _exit_2(argv, capsys, "--data-dir: benchmark fake reads no data from disk", "would be ignored",
            experiments=fake)


@pytest.mark.parametrize("after", [["--data-dir", "DIR"], ["--data-dir=DIR", "--quick"], ["--data", "DIR"]])
def test_data_dir_after_the_name_gets_the_same_message_as_before_it(capsys, tmp_path, after):
    fake = {"fake": _options_fake()}
    after = [a.replace("DIR", str(tmp_path)) for a in after]
    before = _exit_2(["--data-dir", str(tmp_path), "benchmark", "fake"], capsys, experiments=fake)
    line = _exit_2(["benchmark", "fake", *after], capsys, experiments=fake)
    assert line == before and "--data-dir: benchmark fake reads no data from disk" in line


def test_data_dir_is_refused_for_the_default_benchmark_and_a_registered_one(capsys, tmp_path):
    _exit_2(["--data-dir", str(tmp_path), "--quick"], capsys, "--data-dir: benchmark two-moons reads no data",
            experiments={"two-moons": _options_fake()})
    _exit_2(["--data-dir", str(tmp_path), "benchmark", "sgmcmc-uci"], capsys, "benchmark sgmcmc-uci reads no data")
    _exit_2(["benchmark", "sgmcmc-uci", "--data-dir", str(tmp_path)], capsys, "benchmark sgmcmc-uci reads no data")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_download_without_a_folder_gets_the_same_message_before_and_after_the_name(capsys, name):
    # after the name of a benchmark that reads no files, --download is an argument its sub-parser leaves unparsed
    # (argparse alone says "unrecognized arguments: --download"); the image benchmarks parse it themselves
    before = _exit_2(["--download", "benchmark", name], capsys, "--download needs --data-dir DIR")
    assert _exit_2(["benchmark", name, "--download"], capsys) == before
    assert _exit_2(["benchmark", "--download", name], capsys) == before


@pytest.mark.parametrize("after, before, words", [
    (["--do"], ["--download"], "--download needs --data-dir DIR"),  # an abbreviation argparse reads as --download
    (["--download", "--quick"], ["--download"], "--download needs --data-dir DIR"),
    # with a folder, the message is that the benchmark reads no folder, not that --download needs one
    (["--download", "--data-dir", "DIR"], ["--download", "--data-dir", "DIR"], "--data-dir: benchmark fake reads no"),
    (["--data-dir=DIR", "--download"], ["--data-dir=DIR", "--download"], "--data-dir: benchmark fake reads no"),
])
def test_download_after_the_name_of_a_benchmark_that_reads_no_files(capsys, tmp_path, after, before, words):
    fake = {"fake": _options_fake()}
    after, before = ([a.replace("DIR", str(tmp_path)) for a in argv] for argv in (after, before))
    expected = _exit_2([*before, "benchmark", "fake"], capsys, words, experiments=fake)
    assert _exit_2(["benchmark", "fake", *after], capsys, experiments=fake) == expected


def test_data_dir_reaches_a_benchmark_that_reads_files(tmp_path):
    seen = {}
    fake = {"fake": _options_fake(run=lambda args: seen.update(data_dir=args.data_dir) or {}, data_dir=True)}
    assert main(["--data-dir", str(tmp_path / "data"), "benchmark", "fake", "--output", str(tmp_path / "out")],
                fake) == 0
    assert seen["data_dir"] == tmp_path / "data"


@pytest.mark.parametrize("argv, repeated", [
    (["benchmark", "sgmcmc-uci", "--methods", "SGLD", "SGLD"], "'SGLD'"),
    (["benchmark", "fsgmcmc-gap", "--methods", "fSGLD", "SGLD", "fSGLD"], "'fSGLD'"),
    (["benchmark", "realdata-nuts", "--datasets", "diabetes", "diabetes"], "'diabetes'"),
    (["benchmark", "two-moons", "--methods", "map", "map"], "'map'"),
])
def test_a_method_or_data_set_given_twice_is_a_usage_error(capsys, argv, repeated):
    # run twice, its rows were counted as independent runs (sgmcmc-uci --splits 1: "splits 2", standard error 0)
    _exit_2(argv + ["--quick"], capsys, f"argument {argv[2]}: {repeated} given more than once")


def test_every_list_option_of_every_benchmark_refuses_a_repeated_value():
    import argparse

    from pyro_sdebnn.cli import _build
    from pyro_sdebnn.experiments import _arg_types

    parser, bench = _build(None)
    names = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))
    lists = []
    for name in REGISTRY:
        names.pending.pop(name)()
        lists += [(name, action.dest, type(action)) for action in names.choices[name]._actions
                  if action.nargs == "+"]
    assert len(lists) >= 7 and all(kind is _arg_types.Distinct for *_, kind in lists), lists


@pytest.mark.parametrize("methods, words", [(",", "no method given"),
                                            ("odenet,resnet,odenet", "['odenet'] given more than once")])
def test_sdebnn_mnist_methods_empty_or_repeated_is_a_usage_error(capsys, tmp_path, methods, words):
    # an empty list ended in an UnboundLocalError after loading the data
    assert main(["--output", str(tmp_path), "benchmark", "sdebnn-mnist", "--quick", "--methods", methods]) == 2
    assert capsys.readouterr().err.startswith(f"pyro-sdebnn: error: --methods: {words}")


@pytest.mark.parametrize("option", ["--data-dir", "--mnist-root"])
def test_an_empty_data_dir_or_a_file_is_a_usage_error(capsys, tmp_path, option):
    # an empty --data-dir (an unset shell variable) read the current folder
    before = option == "--data-dir"
    a_file = tmp_path / "mnist.tar"
    a_file.write_text("not a folder\n")
    for value, words in (("", "empty path"), (str(a_file), "existing file")):
        argv = ([option, value, "benchmark", "mnvi-mnist"] if before else ["benchmark", "mnvi-mnist", option, value])
        _exit_2(argv + ["--quick"], capsys, f"argument {option}: expected a folder", words)


def test_a_usage_error_quoting_a_multi_line_message_is_one_line(capsys, tmp_path):
    def run(args):  # as torchvision words a failed download: "Error downloading ...:\nTried ..., got:\n..."
        raise FileNotFoundError("MNIST not found. (torchvision said: Error downloading x.gz:\nTried https://a/, got:\n"
                                "<urlopen error>\n)")

    assert main(["benchmark", "fake", "--output", str(tmp_path)], _fake_experiments(run)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Error downloading x.gz: Tried https://a/, got: <urlopen error> )" in err


def test_a_reader_that_leaves_ends_the_output_quietly():
    # `pyro-sdebnn datasets | head -1` ended in a BrokenPipeError traceback
    with subprocess.Popen([sys.executable, "-m", "pyro_sdebnn", "datasets"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        proc.stdout.close()  # the reader leaves before the first line (the start takes seconds: imports)
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert code == 141 and "Error" not in err and "Traceback" not in err, err
