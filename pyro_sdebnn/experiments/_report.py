# SPDX-License-Identifier: Apache-2.0
"""What ``pyro-sdebnn`` prints: the end-of-run report of a benchmark (its summary as plain-text tables and the files
it wrote) and the one-line usage error. No import of torch here: the command line imports this at start-up."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

#: The exit status after Ctrl-C (SIGINT), as a shell reports a process ended by that signal: 128 + 2.
EXIT_INTERRUPTED = 130
#: The exit status when the reader of the output went away (``pyro-sdebnn datasets | head -1``), as a shell reports a
#: process ended by SIGPIPE: 128 + 13.
EXIT_BROKEN_PIPE = 141


def usage_error(err: Exception) -> int:
    """Print ``pyro-sdebnn: error: <err>`` on stderr (argparse's form of a usage error), on one line (a message that
    quotes a library's, such as torchvision's failed download, may hold line breaks); return the exit status 2."""
    print(f"pyro-sdebnn: error: {' '.join(str(err).split())}", file=sys.stderr)
    return 2


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
