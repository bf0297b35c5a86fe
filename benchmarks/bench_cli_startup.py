# SPDX-License-Identifier: Apache-2.0
"""Start-up time of the ``pyro-sdebnn`` command: ``--version``, ``--help`` and ``benchmark NAME --help``.

Each command runs as a fresh process (``sys.executable -m pyro_sdebnn ...``, the same code as the ``pyro-sdebnn``
script), interleaved in every repeat with the floor that any command importing the library's models pays,
``python -c "import torch, pyro"``, so that load drift hits all alike. ``--version`` and ``--help`` import neither torch
nor an experiment module; ``benchmark two-moons --help`` imports the one experiment it describes (and torch with it).
The interpreter's own start (``python -c pass``) is timed alongside: on a loaded machine every figure grows, and
``--version`` / ``--help`` should stay close to it.

Usage::

    python benchmarks/bench_cli_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from pyro_sdebnn.experiments import _arg_types as check

COMMANDS = {
    "pyro-sdebnn --version": [sys.executable, "-m", "pyro_sdebnn", "--version"],
    "pyro-sdebnn --help": [sys.executable, "-m", "pyro_sdebnn", "--help"],
    "pyro-sdebnn benchmark two-moons --help": [sys.executable, "-m", "pyro_sdebnn", "benchmark", "two-moons",
                                               "--help"],
    "python -c 'import torch, pyro' (floor)": [sys.executable, "-c", "import torch, pyro"],
    "python -c pass (the interpreter alone)": [sys.executable, "-c", "pass"],
}


def _seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=check.positive_int, default=5)
    args = parser.parse_args(argv)
    for command in COMMANDS.values():  # warm the file cache once
        _seconds(command)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):
        for name, command in COMMANDS.items():
            times[name].append(_seconds(command))
    for name, values in times.items():
        print(f"{name:45s} median {statistics.median(values):.3f} s  (min {min(values):.3f}, max {max(values):.3f}, "
              f"{args.repeats} runs)")


if __name__ == "__main__":
    main()
