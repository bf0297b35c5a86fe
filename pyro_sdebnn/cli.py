# SPDX-License-Identifier: Apache-2.0
"""The ``pyro-sdebnn`` command line (also ``python -m pyro_sdebnn``).

::

    pyro-sdebnn [--device DEV] [--seed N] [--output DIR] COMMAND ...

    pyro-sdebnn datasets                      # list the bundled data sets and their shapes
    pyro-sdebnn benchmark NAME [--quick]      # run one experiment of pyro_sdebnn.experiments
    pyro-sdebnn --quick                       # the main job (the default benchmark) in quick mode
    pyro-sdebnn --data-dir DIR benchmark sdebnn-mnist --dataset cifar10   # full torchvision data from DIR

The common options may also be given after the sub-command. A benchmark's own options (``pyro-sdebnn benchmark NAME
--help`` lists them) go after its ``NAME``; one given before it is a usage error that shows the command line with it
in its place. Without a sub-command the main job runs: ``benchmark two-moons`` when that experiment is installed.
``--data-dir DIR`` points the image benchmarks at the torchvision files in ``DIR`` (nothing is downloaded unless
``--download`` is given); the benchmarks that read no data files refuse it. Under ``torchrun``, ``--distributed``
runs one replicate of the benchmark per rank (:mod:`pyro_sdebnn.distributed`).

The benchmarks are those of :data:`pyro_sdebnn.experiments.REGISTRY` and the sub-commands' work is that of
``COMMANDS`` (``pyro_sdebnn._commands``); each is imported by name only when it runs, so ``--version`` and
``--help`` import no torch and start at once.

Errors the user can fix (an unknown or misplaced option, a value an option does not allow, a missing data file, an
``--output`` that cannot be written, ...) end the program with a one-line message naming the option and exit status
2; every other exception is a bug and propagates with its traceback. Ctrl-C keeps what is finished: every benchmark
writes its table as each method finishes, and an interrupted run exits with status 130.

The full reference -- where each option goes, data folders, several processes, every usage error, Ctrl-C -- is the
page :doc:`/cli` of the documentation.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Sequence

from pyro_sdebnn import __version__
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.experiments import REGISTRY, load
from pyro_sdebnn.experiments._report import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED

DEFAULT_BENCHMARK = "two-moons"

#: The work of each sub-command, ``{command: "module:function"}`` (the form of a console-script entry point). The
#: module imports torch, so it is imported by name only when its command runs -- as a benchmark's module is imported
#: only when that benchmark is asked for (:func:`pyro_sdebnn.experiments.load`) -- and ``--help`` and ``--version``
#: import no torch. The function takes the parsed arguments (and, for ``benchmark``, the experiment's module) and
#: returns the exit status.
COMMANDS = {
    "datasets": "pyro_sdebnn._commands:list_datasets",
    "benchmark": "pyro_sdebnn._commands:run_benchmark",
}


def _command(name: str) -> Callable[..., int]:
    module, _, function = COMMANDS[name].partition(":")
    return getattr(importlib.import_module(module), function)


def _add_common(parser: argparse.ArgumentParser, suppress: bool, quick: str | None = None) -> None:
    default: Callable[[Any], Any] = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    parser.add_argument("--device", default=default("cpu"), help="torch device, e.g. cpu or cuda:0 (default cpu)")
    parser.add_argument("--seed", type=check.seed, default=default(0),
                        help=f"random seed, an integer in [0, {check.MAX_SEED}] (default 0)")
    parser.add_argument("--output", type=check.folder, default=default(Path("outputs")),
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
        "--dist-timeout", type=check.float_range(0.0, 1e9, low_open=True), default=default(86400.0),
        help="with --distributed: seconds rank 0 waits for the slowest rank at the end (default one day)",
    )


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
    parser = argparse.ArgumentParser(
        prog="pyro-sdebnn",
        description="Bayesian neural networks for Pyro: data sets, benchmarks and the head-to-head study.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_common(parser, suppress=False)
    check.add_data_dir_arguments(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    datasets = commands.add_parser("datasets", help="list the bundled data sets with their shapes")
    _add_common(datasets, suppress=True)
    datasets.add_argument("--json", action="store_true", help="print JSON instead of a table")

    bench = commands.add_parser("benchmark", help="run an experiment (see `pyro-sdebnn benchmark --help`)")
    # The global options are accepted here too (`benchmark --seed 2 NAME`); a benchmark's own options go after NAME.
    _add_common(bench, suppress=True)
    check.add_data_dir_arguments(bench)
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


def _names(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    """The sub-commands of ``parser``: ``pyro-sdebnn``'s, or the benchmark names (a :class:`_Benchmarks`)."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _benchmark_parser(bench: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The sub-parser of ``benchmark name`` with its options (imports the benchmark's module if not done yet)."""
    names = _names(bench)
    assert isinstance(names, _Benchmarks)
    fill = names.pending.pop(name, None)
    if fill is not None:
        fill()
    return names.choices[name]


def _known(parser: argparse.ArgumentParser, option: str) -> bool:
    """Whether ``parser`` takes ``option`` (or an unambiguous abbreviation of one of its options, as argparse does)."""
    if option in parser._option_string_actions:
        return True
    return option.startswith("--") and parser.allow_abbrev and any(
        known.startswith(option) for known in parser._option_string_actions)


def _data_option(parser: argparse.ArgumentParser, token: str) -> str | None:
    """``"--data-dir"`` or ``"--download"`` when the command-line token ``token`` is that option of ``parser`` (or an
    abbreviation that argparse reads as it; ``--data-dir=DIR`` included), else ``None``."""
    option, has_value, _ = token.partition("=")
    if not option.startswith("--"):
        return None
    known = [name for name in parser._option_string_actions if name.startswith(option)]
    if option in parser._option_string_actions:
        known = [option]
    if known == ["--data-dir"] or (known == ["--download"] and not has_value):  # --download takes no value
        return known[0]
    return None


def _sub_command_at(argv: Sequence[str], command: str, parser: argparse.ArgumentParser) -> int | None:
    """Where the sub-command ``command`` stands in ``argv``, not as an option's value (``--output datasets``)."""
    for i, token in enumerate(argv):
        action = parser._option_string_actions.get(argv[i - 1]) if i else None
        if token == command and (action is None or action.nargs == 0):
            return i
    return None


def _misplaced_options(argv: Sequence[str], parser: argparse.ArgumentParser, bench: argparse.ArgumentParser,
                       names: Sequence[str]) -> tuple[argparse.ArgumentParser, str] | None:
    """The usage error for a benchmark's own options given before the benchmark's name, or given to ``datasets``:
    ``(parser, message)``, the parser whose level the first of them was given at, or ``None``.

    ``pyro-sdebnn --n-train 50 benchmark two-moons`` and ``pyro-sdebnn benchmark --n-train 50 two-moons`` would get
    argparse's ``invalid choice: '50'``; this names the options, says where they go and shows the command line with
    them there. Only an option unknown where it stands and known to the benchmark named (or to the default benchmark,
    without a sub-command; or, with ``datasets``, to any benchmark: the line shown then leaves it out) is moved;
    anything else is left to argparse.
    """
    argv = list(argv)
    end = argv.index("--") if "--" in argv else len(argv)
    name: str | None
    benchmark_at = _sub_command_at(argv[:end], "benchmark", parser)
    datasets_at = _sub_command_at(argv[:end], "datasets", parser)
    if benchmark_at is not None:
        at = benchmark_at
        name_at = next((i for i in range(at + 1, end) if argv[i] in names), None)
        if name_at is None:
            return None
        name = argv[name_at]
    elif datasets_at is not None:
        at, name_at, name = datasets_at, end, None  # `pyro-sdebnn --n-train 5 datasets`: the option is no sub-command's
    elif DEFAULT_BENCHMARK in names:
        at, name_at, name = end, end, DEFAULT_BENCHMARK  # `pyro-sdebnn [options]` runs the default benchmark
    else:
        return None
    # the parser of the options after `at`: `benchmark`'s before NAME; `datasets`', where a global one is not moved
    after = bench if name is not None else _names(parser).choices["datasets"]
    unknown = [i for i in range(name_at) if i != at and argv[i].startswith("-") and argv[i] != "-"
               and not parser._negative_number_matcher.match(argv[i])  # a value, as argparse reads it
               and not _known(parser if i < at else after, argv[i].split("=", 1)[0])
               and (name is not None or not _known(parser, argv[i].split("=", 1)[0]))]
    if not unknown:
        return None
    subs = [_benchmark_parser(bench, n) for n in ([name] if name is not None else names)]
    options: list[int] = []  # the misplaced options' positions
    moved: list[int] = []  # theirs and their values'
    owners: list[str] = []  # with `datasets`: the benchmarks that take them
    for i in unknown:
        flag = argv[i].split("=", 1)[0]
        takers = [sub for sub in subs if flag in sub._option_string_actions]
        if not takers:
            continue  # not an option of that benchmark (of any, with `datasets`) either: argparse says so
        action = takers[0]._option_string_actions[flag]
        owners += [sub.prog.split()[-1] for sub in takers if sub.prog.split()[-1] not in owners]
        options.append(i)
        moved.append(i)
        if "=" in argv[i] or action.nargs == 0:
            continue
        count = action.nargs if isinstance(action.nargs, int) else 1
        j = i + 1
        while j < name_at and j != at and not argv[j].startswith("-") and (count > 0 or action.nargs in ("*", "+")):
            moved.append(j)
            count -= 1
            j += 1
    if not options:
        return None
    kept = [token for i, token in enumerate(argv) if i not in moved]
    flags = [argv[i].split("=", 1)[0] for i in options]
    what = f"{flags[0]} is an option" if len(flags) == 1 else f"{', '.join(flags)} are options"
    if name is None:  # `datasets` takes no benchmark option: the corrected line leaves them out
        return parser if options[0] < at else after, (
            f"{what} of `benchmark NAME` (NAME: {', '.join(sorted(owners))}), not of `pyro-sdebnn` or `datasets`: "
            f"leave {'it' if len(flags) == 1 else 'them'} out, as in: pyro-sdebnn {shlex.join(kept)}")
    if name_at == end:  # no sub-command given: spell out the default benchmark
        insert = end - len(moved)
        kept[insert:insert] = ["benchmark", name]
        insert += 2
    else:
        insert = name_at - sum(1 for i in moved if i < name_at) + 1
    fixed = kept[:insert] + [argv[i] for i in sorted(moved)] + kept[insert:]
    before = options[0] < at
    return parser if before else bench, (
        f"{what} of `benchmark {name}`, not of `pyro-sdebnn{'' if before else ' benchmark'}`: put "
        f"{'it' if len(flags) == 1 else 'them'} after the benchmark name, as in: pyro-sdebnn {shlex.join(fixed)}")


def _check_data_dir(parser: argparse.ArgumentParser, args: argparse.Namespace,
                    benchmark: argparse.ArgumentParser | None = None, given: Sequence[str] = ()) -> None:
    """``--download`` needs a folder; ``--data-dir`` is refused for a benchmark (its sub-parser ``benchmark``) that
    reads no data from disk, since it would be ignored and the results would not be those of the user's data.
    ``given``: which of ``--data-dir`` and ``--download`` came after the name of such a benchmark (arguments its
    sub-parser left unparsed), so that they get the same message as before the name."""
    folder = next((getattr(args, key) for key in ("data_dir", "root", "mnist_root") if getattr(args, key, None)), None)
    if (getattr(args, "download", False) or "--download" in given) and folder is None and "--data-dir" not in given:
        parser.error("--download needs --data-dir DIR, the folder to download the torchvision files into")
    if (benchmark is not None and ("--data-dir" in given or getattr(args, "data_dir", None) is not None)
            and "--data-dir" not in benchmark._option_string_actions):
        name = benchmark.prog.split()[-1]
        parser.error(f"--data-dir: benchmark {name} reads no data from disk (it uses generated or bundled data), so "
                     f"the folder would be ignored; leave --data-dir out (the benchmarks that read data files list "
                     f"--data-dir in `pyro-sdebnn benchmark NAME --help`)")


def main(argv: Sequence[str] | None = None, experiments: Mapping[str, ModuleType] | None = None) -> int:
    """Entry point of ``pyro-sdebnn``; returns the process exit code (0; 2 for a user error; 130 after Ctrl-C; 141
    when the reader of its output left, ``pyro-sdebnn datasets | head -1``).

    Ctrl-C while the program starts (importing torch and the benchmark's module, which takes seconds) or before the
    benchmark runs ends it with a one-line message and status 130 too, not a traceback.

    :param argv: the arguments (default ``sys.argv[1:]``).
    :param experiments: the ``benchmark`` sub-commands, ``{name: module}`` (default: those of
        :data:`pyro_sdebnn.experiments.REGISTRY`, each imported only when asked for).
    """
    try:
        status = _main(argv, experiments)
        sys.stdout.flush()  # here, where a reader that left is caught, rather than at exit
        return status
    except KeyboardInterrupt:  # outside a benchmark's run (which handles its own): nothing of it to keep
        print("pyro-sdebnn: interrupted (Ctrl-C / SIGINT)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader of stdout left (`| head`): end quietly, as a SIGPIPE would
        try:  # what is left in stdout's buffer would raise again when Python flushes it at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # a stdout without a file descriptor (captured): nothing is flushed to a pipe
            pass
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None, experiments: Mapping[str, ModuleType] | None) -> int:
    parser, bench = _build(experiments)
    argv = sys.argv[1:] if argv is None else list(argv)
    names = sorted(experiments if experiments is not None else REGISTRY)
    misplaced = _misplaced_options(argv, parser, bench, names)
    if misplaced is not None:
        misplaced[0].error(misplaced[1])
    args, unparsed = parser.parse_known_args(argv)
    if unparsed:
        given = [option for option in (_data_option(parser, token) for token in unparsed) if option is not None]
        if args.command == "benchmark" and args.benchmark is not None and given:
            # `benchmark two-moons --data-dir X` / `--download`: the message of `--data-dir X benchmark two-moons`
            # / `--download benchmark two-moons`
            _check_data_dir(bench, args, _benchmark_parser(bench, args.benchmark), given=given)
        parser.error(f"unrecognized arguments: {' '.join(unparsed)}")  # as parse_args says it
    if args.command == "datasets":
        return _command("datasets")(args)
    if args.command == "benchmark":
        if args.benchmark is None:
            bench.error(f"a benchmark NAME is required, one of: {', '.join(names)}")
        _check_data_dir(bench, args, _benchmark_parser(bench, args.benchmark))
        return _command("benchmark")(args, _benchmark_module(args.benchmark, experiments))
    # No sub-command: the main job.
    _check_data_dir(parser, args)
    if DEFAULT_BENCHMARK not in names:
        parser.print_help()
        return 0
    default_args = parser.parse_args(["benchmark", DEFAULT_BENCHMARK])
    _check_data_dir(parser, args, _benchmark_parser(bench, DEFAULT_BENCHMARK))
    for key in ("device", "seed", "output", "quick", "distributed", "dist_timeout"):
        setattr(default_args, key, getattr(args, key))
    return _command("benchmark")(default_args, _benchmark_module(DEFAULT_BENCHMARK, experiments))


if __name__ == "__main__":
    raise SystemExit(main())
