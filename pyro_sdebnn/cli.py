# SPDX-License-Identifier: Apache-2.0
"""The ``pyro-sdebnn`` command line (also ``python -m pyro_sdebnn``).

::

    pyro-sdebnn [--device DEV] [--seed N] [--output DIR] COMMAND ...

    pyro-sdebnn datasets                      # list the bundled data sets and their shapes
    pyro-sdebnn benchmark NAME [--quick]      # run one experiment of pyro_sdebnn.experiments
    pyro-sdebnn --quick                       # the main job (the default benchmark) in quick mode

The common options may also be given after the sub-command. Without a sub-command the main job
runs: ``benchmark two-moons`` when that experiment is installed.

Errors the user can fix end the program with a one-line message and exit status 2: an unknown
command, benchmark or option (argparse), an unavailable ``--device``, a data file that is missing
(``FileNotFoundError`` from the loaders) and a ``ValueError`` whose message starts with the option it
rejects (the experiments' convention, e.g. ``--epochs must be positive``). Every other exception is a
bug and propagates with its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Sequence

__all__ = ["build_parser", "main", "resolve_device"]

DEFAULT_BENCHMARK = "two-moons"


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


def _add_common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    parser.add_argument("--device", default=default("cpu"), help="torch device, e.g. cpu or cuda:0 (default cpu)")
    parser.add_argument("--seed", type=int, default=default(0), help="random seed (default 0)")
    parser.add_argument(
        "--output", type=Path, default=default(Path("outputs")), help="folder for tables and figures (default outputs/)"
    )
    parser.add_argument(
        "--quick", action="store_true", default=default(False), help="small, fast settings (the CI smoke mode)"
    )


def build_parser(experiments: dict[str, ModuleType] | None = None) -> argparse.ArgumentParser:
    """The argument parser; ``experiments`` (default: :func:`pyro_sdebnn.experiments.discover`) become
    the ``benchmark`` sub-commands."""
    from pyro_sdebnn import __version__

    if experiments is None:
        from pyro_sdebnn.experiments import discover

        experiments = discover()
    parser = argparse.ArgumentParser(
        prog="pyro-sdebnn",
        description="Bayesian neural networks for Pyro: data sets, benchmarks and the head-to-head study.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_common(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    datasets = commands.add_parser("datasets", help="list the bundled data sets with their shapes")
    _add_common(datasets, suppress=True)
    datasets.add_argument("--json", action="store_true", help="print JSON instead of a table")

    bench = commands.add_parser("benchmark", help="run an experiment (see `pyro-sdebnn benchmark --help`)")
    names = bench.add_subparsers(dest="benchmark", metavar="NAME")
    for name, module in experiments.items():
        sub = names.add_parser(name, help=module.DESCRIPTION, description=module.DESCRIPTION)
        _add_common(sub, suppress=True)
        module.add_arguments(sub)
    return parser


def _run_datasets(args: argparse.Namespace) -> int:
    from pyro_sdebnn.data import describe_datasets

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
    import pyro

    try:
        args.device = resolve_device(args.device)
    except ValueError as err:
        return _usage_error(err)
    args.output.mkdir(parents=True, exist_ok=True)  # argparse made it a Path
    pyro.set_rng_seed(args.seed)  # seeds torch, numpy and random
    start = time.perf_counter()
    try:
        summary = experiment.run(args)
    except FileNotFoundError as err:  # a data set that is not on this machine
        return _usage_error(err)
    except ValueError as err:
        if not str(err).startswith("--"):  # not an option the user gave: a bug, keep the traceback
            raise
        return _usage_error(err)
    elapsed = time.perf_counter() - start
    print(f"benchmark {args.benchmark} finished in {elapsed:.1f} s; results in {args.output}")
    if summary:
        print(json.dumps(summary, indent=2, default=str))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pyro-sdebnn``; returns the process exit code."""
    from pyro_sdebnn.experiments import discover

    experiments = discover()
    parser = build_parser(experiments)
    args = parser.parse_args(argv)
    if args.command == "datasets":
        return _run_datasets(args)
    if args.command == "benchmark":
        if args.benchmark is None:
            parser.parse_args(["benchmark", "--help"])
        return _run_benchmark(args, experiments[args.benchmark])  # argparse accepts only known names
    # No sub-command: the main job.
    if DEFAULT_BENCHMARK not in experiments:
        parser.print_help()
        return 0
    default_args = parser.parse_args(["benchmark", DEFAULT_BENCHMARK])
    for key in ("device", "seed", "output", "quick"):
        setattr(default_args, key, getattr(args, key))
    return _run_benchmark(default_args, experiments[DEFAULT_BENCHMARK])


if __name__ == "__main__":
    raise SystemExit(main())
