# SPDX-License-Identifier: Apache-2.0
"""The ``pyro-sdebnn`` command line (also ``python -m pyro_sdebnn``).

::

    pyro-sdebnn [--device DEV] [--seed N] [--output DIR] COMMAND ...

    pyro-sdebnn datasets                      # list the bundled data sets and their shapes
    pyro-sdebnn benchmark NAME [--quick]      # run one experiment of pyro_sdebnn.experiments
    pyro-sdebnn --quick                       # the main job (the default benchmark) in quick mode
    pyro-sdebnn --data-dir DIR benchmark sdebnn-mnist --dataset cifar10   # full torchvision data from DIR

Several processes (``torchrun``, see :mod:`pyro_sdebnn.distributed`)::

    torchrun --standalone --nproc_per_node=4 -m pyro_sdebnn --distributed benchmark two-moons --quick

runs the benchmark once per rank, with seed ``--seed + rank`` (and GPU ``LOCAL_RANK`` with ``--device cuda``): four
replicates in the time of one. Rank 0 writes the outputs: its own run's under ``--output``, and the files of rank
``r`` (gathered to it, its ``summary.json`` included) under ``OUTPUT/rank<r>/``. The experiments themselves are not
data-parallel; ``--dist-timeout`` (default one day) bounds how long rank 0 waits for the slowest rank.

The common options may also be given after the sub-command. Without a sub-command the main job
runs: ``benchmark two-moons`` when that experiment is installed.

``--data-dir DIR`` (before the sub-command, or after an image benchmark's name) points the image
benchmarks (``sdebnn-mnist``, ``mnvi-mnist``) at the torchvision files of MNIST, Fashion-MNIST or
CIFAR-10 in ``DIR``; they then train through a :class:`~torch.utils.data.DataLoader` on the full data
set. Nothing is downloaded unless ``--download`` is given; without ``--data-dir`` they use the small
bundled subsets.

The benchmarks are those of :data:`pyro_sdebnn.experiments.REGISTRY` (one line each); a benchmark's module, and
torch with it, is imported only when that benchmark is asked for, so ``--version`` and ``--help`` start at once.

Errors the user can fix end the program with a one-line message and exit status 2: an unknown
command, benchmark or option, or a value an option does not allow (argparse: every numeric option has a
``type=`` check, e.g. ``argument --n-train: expected an integer >= 1, got '0'``), ``benchmark`` without a name,
``--download`` without ``--data-dir``, an ``--output`` that is a file or cannot be written, an unavailable
``--device``, a data file that is missing (``FileNotFoundError`` from the loaders) and a ``ValueError`` whose
message starts with the option it rejects (the experiments' convention, e.g. ``--epochs must be positive``).
Every other exception is a bug and propagates with its traceback.

Ctrl-C (SIGINT) does not throw the run away: every benchmark writes its table (and the files of each finished
method) as each method finishes; on an interrupt it writes what is finished, the command line adds a line saying
so to ``OUTPUT/README.md``, prints the finished part and exits with status 130. Ctrl-C before the benchmark runs
(while torch and the benchmark's module are imported) prints one line and exits with status 130 as well.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Sequence

from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.experiments import REGISTRY, load

DEFAULT_BENCHMARK = "two-moons"
#: The exit status after Ctrl-C (SIGINT), as a shell reports a process ended by that signal: 128 + 2.
EXIT_INTERRUPTED = 130


def resolve_device(name: str):
    """Turn ``--device`` into a :class:`torch.device`, with a clear error when it is unavailable."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"--device: {name!r} is not a torch device name ({err})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: {name!r} was asked for but CUDA is not available on this machine")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device: {name!r} was asked for but MPS is not available on this machine")
    return device


def _add_common(parser: argparse.ArgumentParser, suppress: bool, quick: str | None = None) -> None:
    default: Callable[[Any], Any] = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    parser.add_argument("--device", default=default("cpu"), help="torch device, e.g. cpu or cuda:0 (default cpu)")
    parser.add_argument("--seed", type=check.seed, default=default(0),
                        help=f"random seed, an integer in [0, {check.MAX_SEED}] (default 0)")
    parser.add_argument("--output", type=check.output_folder, default=default(Path("outputs")),
                        help="folder for tables and figures (default outputs/); each result is written as soon as "
                             "it is finished, and Ctrl-C keeps what is done")
    parser.add_argument("--quick", action="store_true", default=default(False),
                        help="small, fast settings (the CI smoke mode)" + (f": {quick}" if quick else ""))
    parser.add_argument(
        "--distributed", action="store_true", default=default(False),
        help="under torchrun: every rank runs the benchmark with seed --seed + rank (GPU LOCAL_RANK with --device "
             "cuda), rank 0 writes the outputs, those of rank r under OUTPUT/rank<r>",
    )
    parser.add_argument(
        "--dist-timeout", type=check.positive_float, default=default(86400.0),
        help="with --distributed: seconds rank 0 waits for the slowest rank at the end (default one day)",
    )


def add_data_dir_arguments(parser: argparse.ArgumentParser, suppress: bool = True) -> None:
    """``--data-dir`` and ``--download``: the global options, repeated (``suppress``: no default, so that the
    global value stays unless given again) by the image benchmarks that read them."""
    parser.add_argument("--data-dir", type=Path, default=argparse.SUPPRESS if suppress else None,
                        help="folder with the torchvision files (MNIST/raw, FashionMNIST/raw or cifar-10-batches-py) "
                             "for the image benchmarks: train on the full data set through a DataLoader")
    parser.add_argument("--download", action="store_true", default=argparse.SUPPRESS if suppress else False,
                        help="allow the image benchmarks to download missing files into --data-dir (off by default; "
                             "needs --data-dir)")


class _Benchmarks(argparse._SubParsersAction):
    """The ``benchmark NAME`` sub-parsers, filled in only for the NAME given: the experiment's module (and torch with
    it) is imported when its options are needed, not when ``pyro-sdebnn --help`` or ``--version`` runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pending: dict[str, Callable[[], None]] = {}

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        fill = self.pending.pop(values[0], None) if values else None
        if fill is not None:
            fill()
        super().__call__(parser, namespace, values, option_string)


def _benchmark_module(name: str, experiments: Mapping[str, ModuleType] | None) -> ModuleType:
    return experiments[name] if experiments is not None else load(name)


def _build(experiments: Mapping[str, ModuleType] | None) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    from pyro_sdebnn import __version__

    parser = argparse.ArgumentParser(
        prog="pyro-sdebnn",
        description="Bayesian neural networks for Pyro: data sets, benchmarks and the head-to-head study.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_common(parser, suppress=False)
    add_data_dir_arguments(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    datasets = commands.add_parser("datasets", help="list the bundled data sets with their shapes")
    _add_common(datasets, suppress=True)
    datasets.add_argument("--json", action="store_true", help="print JSON instead of a table")

    bench = commands.add_parser("benchmark", help="run an experiment (see `pyro-sdebnn benchmark --help`)")
    names = bench.add_subparsers(dest="benchmark", metavar="NAME", action=_Benchmarks)
    assert isinstance(names, _Benchmarks)
    descriptions = ({name: REGISTRY[name].description for name in REGISTRY} if experiments is None
                    else {name: module.DESCRIPTION for name, module in experiments.items()})
    for name, description in sorted(descriptions.items()):
        sub = names.add_parser(name, help=description, description=description)

        def fill(name: str = name, sub: argparse.ArgumentParser = sub) -> None:
            module = _benchmark_module(name, experiments)
            _add_common(sub, suppress=True, quick=getattr(module, "QUICK", None))
            module.add_arguments(sub)

        names.pending[name] = fill
    return parser, bench


def build_parser(experiments: Mapping[str, ModuleType] | None = None) -> argparse.ArgumentParser:
    """The argument parser. The ``benchmark`` sub-commands are ``experiments`` (``{name: module}``) or, by default,
    those of :data:`pyro_sdebnn.experiments.REGISTRY`, whose modules are imported only when their name is parsed."""
    return _build(experiments)[0]


def _run_datasets(args: argparse.Namespace) -> int:
    from pyro_sdebnn.data._catalog import describe_datasets

    rows = describe_datasets()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("name", "task", "shapes", "source")
    table = [header] + [(r["name"], r["task"], r["shapes"], r["source"]) for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def _usage_error(err: Exception) -> int:
    print(f"pyro-sdebnn: error: {err}", file=sys.stderr)
    return 2


def _run_benchmark(args: argparse.Namespace, experiment: ModuleType) -> int:
    try:
        args.device = resolve_device(args.device)
    except ValueError as err:
        return _usage_error(err)
    if args.distributed:
        return _run_distributed(args, experiment)
    return _run_once(args, experiment)


def _run_distributed(args: argparse.Namespace, experiment: ModuleType) -> int:
    """``--distributed``: rank ``r`` runs the benchmark with seed ``--seed + r``; rank 0 writes every rank's files.

    Rank 0 runs into ``--output``; every other rank runs into a temporary folder, and its files (its
    ``summary.json`` among them) travel to rank 0, which writes them under ``OUTPUT/rank<r>/``. Only rank 0 prints
    the end-of-run report. Launched without ``torchrun`` this is the plain run (a world of one).
    """
    import contextlib
    import io
    import tempfile

    from pyro_sdebnn import _comm

    started = not _comm.is_initialized()  # leave a group the caller started as it is
    try:  # an incomplete torchrun environment (argparse has already checked --dist-timeout)
        device = _comm.init("nccl" if args.device.type == "cuda" else "gloo", timeout=args.dist_timeout)
    except ValueError as err:
        return _usage_error(ValueError(f"--distributed: {err}"))
    rank = _comm.rank()
    if args.device.type == "cuda":
        args.device = device  # one GPU per process: cuda:LOCAL_RANK
    args.seed += rank
    try:
        if rank == 0:
            status, files = _run_once(args, experiment), {}
        else:
            with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
                args.output = Path(tmp)
                status = _run_once(args, experiment)
                files = {p.relative_to(tmp).as_posix(): p.read_bytes() for p in sorted(Path(tmp).rglob("*"))
                         if p.is_file()}
        gathered = _comm.gather_objects({"seed": args.seed, "status": status, "files": files})
        if gathered is None:
            return status
        for r, got in enumerate(gathered[1:], start=1):
            folder = args.output / f"rank{r}"
            for name, data in got["files"].items():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(data)
            print(f"rank {r} (seed {got['seed']}): {len(got['files'])} files under {folder}"
                  + ("" if got["status"] == 0 else f", exit status {got['status']}"))
        return max(got["status"] for got in gathered)
    except BaseException:
        if started:
            _comm.shutdown(wait=False)  # the other ranks may be inside a collective: no barrier
            started = False
        raise
    finally:
        if started:
            _comm.shutdown()


def _prepare_output(output: Path) -> None:
    """Create ``--output`` and check that a file can be written there.

    :raises ValueError: (``--output: ...``) naming the folder and the operating system's reason.
    """
    import tempfile

    try:
        output.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output):
            pass
    except OSError as err:
        raise ValueError(f"--output: cannot write into the folder {str(output)!r} ({err.strerror or err})") from None


def _note_interruption(output: Path, err: KeyboardInterrupt, seconds: float) -> str:
    """Append to ``OUTPUT/README.md`` (created if missing) the line saying the run was interrupted; return it."""
    progress = getattr(err, "progress", None)
    line = (f"**Interrupted** (Ctrl-C / SIGINT) after {seconds:.0f} s: "
            + (f"{progress}; the tables and figures here hold only those." if progress else
               "the files here hold only what had been finished by then."))
    readme = output / "README.md"
    previous = readme.read_text() if readme.is_file() else "# Interrupted run\n"
    readme.write_text(previous.rstrip("\n") + "\n\n" + line + "\n")
    return line


def _run_once(args: argparse.Namespace, experiment: ModuleType) -> int:
    import pyro

    try:
        _prepare_output(args.output)  # argparse made it a Path
    except ValueError as err:
        return _usage_error(err)
    pyro.set_rng_seed(args.seed)  # seeds torch, numpy and random
    start, wall_start = time.perf_counter(), time.time() - 1.0  # mtime resolution margin
    interrupted = None
    try:
        summary = experiment.run(args)
    except FileNotFoundError as err:  # a data set that is not on this machine
        return _usage_error(err)
    except ValueError as err:
        if not str(err).startswith("--"):  # not an option the user gave: a bug, keep the traceback
            raise
        return _usage_error(err)
    except KeyboardInterrupt as err:  # Ctrl-C: keep what is finished (an experiment's Interrupted carries it)
        summary = getattr(err, "summary", None)
        interrupted = _note_interruption(args.output, err, time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    if summary:
        (args.output / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    report = end_of_run_report(args.benchmark, summary or {}, args.output, elapsed, since=wall_start)
    if interrupted is not None:
        print(report.replace(f"benchmark {args.benchmark} finished", f"benchmark {args.benchmark} INTERRUPTED", 1))
        print(interrupted.replace("**", ""), file=sys.stderr)
        return EXIT_INTERRUPTED
    print(report)
    return 0


def _cell(value: Any) -> str:
    """A cell of the summary table: a float to 4 significant digits, a ``(mean, se)`` pair as ``"mean ± se"``, the
    mean alone where the standard error is NaN (a single run)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value):
        kept = [v for i, v in enumerate(value) if i == 0 or v == v]  # v != v: NaN
        return " ± ".join(_cell(v) for v in kept)
    return str(value)


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return lines


def format_summary(summary: Mapping[str, Any], title: str = "") -> list[str]:
    r"""Render an experiment's summary as plain-text tables.

    Scalars become a ``name  value`` table; a mapping of rows to mappings of scalars (``{method:
    {metric: value}}``) becomes one table with a row per key (a row that is a plain string, such as a
    failed method's status, goes into a ``status`` column); a list of flat mappings becomes a table
    with a row per item; deeper nesting gets a titled section per key.

    >>> print("\n".join(format_summary({"map": {"acc": 0.91234, "nll": 0.25}, "mfvi": "failed: NaN loss"})))
    method  acc     nll   status
    ------  ------  ----  ----------------
    map     0.9123  0.25
    mfvi                  failed: NaN loss
    """
    lines: list[str] = [title, ""] if title else []

    def is_row(value: Any) -> bool:  # a flat mapping of scalars
        return isinstance(value, Mapping) and not any(isinstance(x, (Mapping, list)) for x in value.values())

    values = list(summary.values())
    if any(is_row(v) for v in values) and all(is_row(v) or isinstance(v, str) for v in values):
        # {row: {column: value}}, where a row may be a status string instead (a failed method)
        columns = list(dict.fromkeys(c for v in values if is_row(v) for c in v))
        status = any(isinstance(v, str) for v in values)
        rows = [[key, *(_cell(v[c]) if c in v else "" for c in columns), *([""] if status else [])] if is_row(v)
                else [key, *("" for _ in columns), v] for key, v in summary.items()]
        return lines + _text_table(["method", *columns, *(["status"] if status else [])], rows)
    scalars = [[k, _cell(v)] for k, v in summary.items() if not isinstance(v, (Mapping, list))]
    if scalars:
        lines += _text_table(["name", "value"], scalars)
    for key, value in summary.items():
        if isinstance(value, Mapping):
            lines += ([""] if lines else []) + format_summary(value, title=key)
        elif isinstance(value, list) and value and all(isinstance(x, Mapping) for x in value):
            columns = list(dict.fromkeys(c for row in value for c in row))
            table = _text_table(columns, [[_cell(row.get(c, "")) for c in columns] for row in value])
            lines += ([""] if lines else []) + [key, "", *table]
        elif isinstance(value, list):
            lines += ([""] if lines else []) + [f"{key}: {_cell(value)}"]
    return lines


def end_of_run_report(name: str, summary: Mapping[str, Any], output: Path, seconds: float, since: float) -> str:
    """What the end of a benchmark prints: its results as text tables and the files it wrote (those under
    ``output`` modified since the wall-clock time ``since``)."""
    written = sorted(p for p in output.rglob("*") if p.is_file() and p.stat().st_mtime >= since)
    lines = ["", f"benchmark {name} finished in {seconds:.1f} s", ""]
    if summary:
        lines += format_summary(summary) + [""]
    lines.append(f"files written under {output}:" if written else f"no file was written under {output}")
    lines += [f"  {p.relative_to(output)}  ({p.stat().st_size:,} bytes)" for p in written]
    return "\n".join(lines)


def _check_data_dir(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    folder = next((getattr(args, key) for key in ("data_dir", "root", "mnist_root") if getattr(args, key, None)), None)
    if getattr(args, "download", False) and folder is None:
        parser.error("--download needs --data-dir DIR, the folder to download the torchvision files into")


def main(argv: Sequence[str] | None = None, experiments: Mapping[str, ModuleType] | None = None) -> int:
    """Entry point of ``pyro-sdebnn``; returns the process exit code (0; 2 for a user error; 130 after Ctrl-C).

    Ctrl-C while the program starts (importing torch and the benchmark's module, which takes seconds) or before the
    benchmark runs ends it with a one-line message and status 130 too, not a traceback.

    :param argv: the arguments (default ``sys.argv[1:]``).
    :param experiments: the ``benchmark`` sub-commands, ``{name: module}`` (default: those of
        :data:`pyro_sdebnn.experiments.REGISTRY`, each imported only when asked for).
    """
    try:
        return _main(argv, experiments)
    except KeyboardInterrupt:  # outside a benchmark's run (which handles its own): nothing of it to keep
        print("pyro-sdebnn: interrupted (Ctrl-C / SIGINT)", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None, experiments: Mapping[str, ModuleType] | None) -> int:
    parser, bench = _build(experiments)
    args = parser.parse_args(argv)
    if args.command == "datasets":
        return _run_datasets(args)
    if args.command == "benchmark":
        if args.benchmark is None:
            names = sorted(experiments if experiments is not None else REGISTRY)
            bench.error(f"a benchmark NAME is required, one of: {', '.join(names)}")
        _check_data_dir(bench, args)
        return _run_benchmark(args, _benchmark_module(args.benchmark, experiments))
    # No sub-command: the main job.
    _check_data_dir(parser, args)
    if DEFAULT_BENCHMARK not in (experiments if experiments is not None else REGISTRY):
        parser.print_help()
        return 0
    default_args = parser.parse_args(["benchmark", DEFAULT_BENCHMARK])
    for key in ("device", "seed", "output", "quick", "distributed", "dist_timeout"):
        setattr(default_args, key, getattr(args, key))
    return _run_benchmark(default_args, _benchmark_module(DEFAULT_BENCHMARK, experiments))


if __name__ == "__main__":
    raise SystemExit(main())
