# SPDX-License-Identifier: Apache-2.0
"""The work of the ``pyro-sdebnn`` sub-commands (see :mod:`pyro_sdebnn.cli`): listing the data sets, and running a
benchmark -- the device, the seed, the output folder, Ctrl-C, ``--distributed``.

This module imports torch; :mod:`pyro_sdebnn.cli` parses the command line without it and loads this module by name
(its ``COMMANDS`` table) only when a sub-command runs, so that ``pyro-sdebnn --help`` starts at once.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import pyro
import torch

from pyro_sdebnn import _comm
from pyro_sdebnn.data._catalog import describe_datasets
from pyro_sdebnn.experiments._report import EXIT_INTERRUPTED, end_of_run_report, usage_error


def resolve_device(name: str):
    """Turn ``--device`` into a :class:`torch.device`, with a clear error when it is unavailable."""
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"--device: {name!r} is not a torch device name ({err})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: {name!r} was asked for but CUDA is not available on this machine")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device: {name!r} was asked for but MPS is not available on this machine")
    return device


def list_datasets(args: argparse.Namespace) -> int:
    """``pyro-sdebnn datasets [--json]``: print the catalogue of the bundled data sets; return the exit status."""
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


def run_benchmark(args: argparse.Namespace, experiment: ModuleType) -> int:
    """``pyro-sdebnn benchmark NAME``: run ``experiment`` (its module) with the parsed ``args``; return the exit
    status (0; 2 for a user error; 130 after Ctrl-C)."""
    try:
        args.device = resolve_device(args.device)
    except ValueError as err:
        return usage_error(err)
    if args.distributed:
        return _run_distributed(args, experiment)
    return _run_once(args, experiment)


def _run_distributed(args: argparse.Namespace, experiment: ModuleType) -> int:
    """``--distributed``: rank ``r`` runs the benchmark with seed ``--seed + r``; rank 0 writes every rank's files.

    Rank 0 runs into ``--output``; every other rank runs into a temporary folder, and its files (its
    ``summary.json`` among them) travel to rank 0, which writes them under ``OUTPUT/rank<r>/``. Only rank 0 prints
    the end-of-run report. Launched without ``torchrun`` this is the plain run (a world of one).
    """
    started = not _comm.is_initialized()  # leave a group the caller started as it is
    try:  # an incomplete torchrun environment (argparse has already checked --dist-timeout)
        device = _comm.init("nccl" if args.device.type == "cuda" else "gloo", timeout=args.dist_timeout)
    except ValueError as err:
        return usage_error(ValueError(f"--distributed: {err}"))
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
    try:
        _prepare_output(args.output)  # argparse made it a Path
    except ValueError as err:
        return usage_error(err)
    pyro.set_rng_seed(args.seed)  # seeds torch, numpy and random
    start, wall_start = time.perf_counter(), time.time() - 1.0  # mtime resolution margin
    interrupted = None
    try:
        summary = experiment.run(args)
    except FileNotFoundError as err:  # a data set that is not on this machine
        return usage_error(err)
    except ValueError as err:
        if not str(err).startswith("--"):  # not an option the user gave: a bug, keep the traceback
            raise
        return usage_error(err)
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
