# SPDX-License-Identifier: Apache-2.0
"""The ``pyro-sdebnn`` command line (also ``python -m pyro_sdebnn``).

::

    pyro-sdebnn [--device DEV] [--seed N] [--output DIR] COMMAND ...

    pyro-sdebnn datasets                      # list the bundled data sets and their shapes
    pyro-sdebnn benchmark NAME [--quick]      # run one experiment of pyro_sdebnn.experiments
    pyro-sdebnn --quick                       # the main job (the default benchmark) in quick mode

The common options may also be given after the sub-command. Without a sub-command the main job
runs: ``benchmark two-moons`` when that experiment is installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
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


def build_parser() -> argparse.ArgumentParser:
    from pyro_sdebnn import __version__
    from pyro_sdebnn.experiments import discover

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
    for name, module in discover().items():
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


def _run_benchmark(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import torch

    import pyro
    from pyro_sdebnn.experiments import discover

    experiments = discover()
    if args.benchmark not in experiments:
        parser.error(f"unknown benchmark {args.benchmark!r}; choose from {sorted(experiments)}")
    args.device = resolve_device(args.device)
    args.output = Path(args.output)
    args.output.mkdir(parents=True, exist_ok=True)
    pyro.set_rng_seed(args.seed)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    summary = experiments[args.benchmark].run(args)
    elapsed = time.perf_counter() - start
    print(f"benchmark {args.benchmark} finished in {elapsed:.1f} s; results in {args.output}")
    if summary:
        print(json.dumps(summary, indent=2, default=str))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pyro-sdebnn``; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "datasets":
            return _run_datasets(args)
        if args.command == "benchmark":
            if args.benchmark is None:
                parser.parse_args(["benchmark", "--help"])
            return _run_benchmark(args, parser)
        # No sub-command: the main job.
        from pyro_sdebnn.experiments import discover

        if DEFAULT_BENCHMARK not in discover():
            parser.print_help()
            return 0
        default_args = parser.parse_args(["benchmark", DEFAULT_BENCHMARK])
        for key in ("device", "seed", "output", "quick"):
            setattr(default_args, key, getattr(args, key))
        return _run_benchmark(default_args, parser)
    except (ValueError, FileNotFoundError) as err:
        print(f"pyro-sdebnn: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
