# SPDX-License-Identifier: Apache-2.0
"""``type=`` checkers for the options of ``pyro-sdebnn`` and its benchmarks, and the option groups that both the
command line and a benchmark add (:func:`add_data_dir_arguments`).

Each turns the option's text into a value or raises :class:`argparse.ArgumentTypeError` saying what is allowed, so
that a bad value ends the program with argparse's one-line message naming the option and exit status 2 (e.g.
``argument --n-train: expected an integer >= 1, got '0'``) instead of a traceback or a silent fix-up later. No
import of torch here: the parser is built before any experiment is imported.

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> _ = parser.add_argument("--dt", type=positive_float)
>>> parser.parse_args(["--dt", "0.05"]).dt
0.05
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Callable


#: The largest ``--seed``: NumPy's generator takes seeds below 2**32, and the benchmarks add offsets (runs, ranks).
MAX_SEED = 2**31 - 1


def _int(text: str, allowed: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None


def _float(text: str, allowed: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}")
    return value


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """A checker of integers in ``[low, high]`` (``high=None``: no upper bound)."""
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"

    def check(text: str) -> int:
        value = _int(text, allowed)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}")
        return value

    check.__name__ = f"int_range({low}, {high})"
    return check


def float_range(low: float, high: float = math.inf, *, low_open: bool = False,
                high_open: bool = False) -> Callable[[str], float]:
    """A checker of finite floats between ``low`` and ``high``, each end closed unless ``low_open`` /
    ``high_open``."""
    if math.isinf(high):
        allowed = f"a finite number {'>' if low_open else '>='} {low:g}"
    else:
        allowed = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def check(text: str) -> float:
        value = _float(text, allowed)
        if value < low or value > high or (low_open and value == low) or (high_open and value == high):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}")
        return value

    check.__name__ = f"float_range({low}, {high})"
    return check


#: An integer >= 1 (a count of steps, epochs, samples, threads ...).
positive_int = int_range(1)
#: An integer >= 0.
nonnegative_int = int_range(0)
#: A finite float > 0 (a step size, a learning rate, a scale).
positive_float = float_range(0.0, low_open=True)
#: A finite float >= 0.
nonnegative_float = float_range(0.0)
#: A float in [0, 1].
probability = float_range(0.0, 1.0)
#: ``--seed``: an integer in [0, MAX_SEED].
seed = int_range(0, MAX_SEED)


class Distinct(argparse.Action):
    """``action=`` of a list option (``nargs="+"``, e.g. ``--methods``): a value given twice is a usage error, not a
    method run twice whose repeated rows the tables would count as independent runs."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values,
                 option_string: str | None = None) -> None:
        values = list(values)
        repeated = sorted({v for v in values if values.count(v) > 1}, key=values.index)
        if repeated:
            raise argparse.ArgumentError(self, f"{', '.join(repr(v) for v in repeated)} given more than once")
        setattr(namespace, self.dest, values)


def folder(text: str) -> Path:
    """``--output``, ``--data-dir``: a folder path; an empty one (``--output "$UNSET"``, which would use the current
    folder) or an existing file there is an error. Whether the folder can be written (``--output``, checked when the
    run starts, by creating it) or exists (``--data-dir``, checked when the benchmark starts, since ``--download``
    may create it) is not checked here."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a folder, got the empty path {text!r}")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a folder, but {text!r} is an existing file")
    return path


def add_data_dir_arguments(parser: argparse.ArgumentParser, suppress: bool = True) -> None:
    """``--data-dir`` and ``--download``: global options of ``pyro-sdebnn``, repeated (``suppress``: no default, so
    that the global value stays unless given again) by the benchmarks that read data from disk (the image
    benchmarks). A benchmark without these options reads no data folder, and the command line refuses a global
    ``--data-dir`` for it."""
    parser.add_argument("--data-dir", type=folder, default=argparse.SUPPRESS if suppress else None,
                        help="folder with the torchvision files (MNIST/raw, FashionMNIST/raw or cifar-10-batches-py) "
                             "for the image benchmarks: train on the full data set through a DataLoader")
    parser.add_argument("--download", action="store_true", default=argparse.SUPPRESS if suppress else False,
                        help="allow the image benchmarks to download missing files into --data-dir (off by default; "
                             "needs --data-dir)")
