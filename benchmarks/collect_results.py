# SPDX-License-Identifier: Apache-2.0
"""Rebuild BENCHMARKS.md from the summary tables of the per-area result files ``benchmarks/RESULTS_*.md``.

Each area file keeps its full write-up (protocol, per-split tables, diagnoses); its first table with the columns
``what | command | date & machine | measured | target | met?`` is its summary. This script copies those summary
tables, one section per area, into BENCHMARKS.md so that the top-level file has one row per figure.

    python benchmarks/collect_results.py
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AREAS = [  # (file suffix, section title, headings of further sections copied whole)
    ("foundation", "Foundation: data sets and metrics (issue 2)", ()),
    ("distributions", "Distributions and kernels (issue 3)", ()),
    ("mnvi", "MNVI: sampling-free VI (issue 4)", ()),
    ("sdebnn", "SDE-BNN (issue 5)", ()),
    ("sdebnn_baselines", "SDE-BNN baselines: ODE-Net / ResNet (issue 5)", ()),
    ("sgmcmc", "SG-MCMC kernels (issue 6)", ()),
    ("baselines", "Baselines and the Two Moons head-to-head (issue 7)", ("## Two Moons head-to-head, full mode",)),
]
HEADER = """# Benchmarks

One row per measured figure: what, the command that reproduces it, the date and machine, the measured value
(median and spread where repeated), the target, and whether it was met. Built by `python
benchmarks/collect_results.py` from the summary tables of `benchmarks/RESULTS_<area>.md`, which hold the full
write-ups (protocols, per-split tables, diagnoses of every missed target).

**Machine.** All figures were measured on the project's 2-core x86-64 CPU VM (24 GiB, no GPU), torch 2.14.1,
pyro-ppl 1.9.2, torchsde 0.2.6, usually with one intra-op thread. During most runs the machine was shared with
other jobs (load average 2-8), so absolute times are upper bounds; the speed figures are therefore ratios against a
plain-PyTorch equivalent measured in the same run with interleaved repeats. No GPU was available to this work, so
no GPU timing is reported.
"""


def summary_table(text: str) -> list[str]:
    lines = text.splitlines()
    for start, line in enumerate(lines):
        if line.startswith("| what |"):
            end = start
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            return lines[start:end]
    raise ValueError("no summary table (a table whose header starts with '| what |')")


def section(text: str, heading: str) -> list[str]:
    """The lines of the section that starts with ``heading``, up to the next heading of the same level."""
    lines = text.splitlines()
    level = heading.split(" ")[0] + " "
    for start, line in enumerate(lines):
        if line.strip() == heading:
            end = start + 1
            while end < len(lines) and not lines[end].startswith(level):
                end += 1
            return lines[start:end]
    raise ValueError(f"no section {heading!r}")


def main() -> None:
    parts = [HEADER]
    for suffix, title, sections in AREAS:
        path = ROOT / "benchmarks" / f"RESULTS_{suffix}.md"
        text = path.read_text()
        parts.append(f"## {title}\n\nDetails: [`{path.relative_to(ROOT)}`]({path.relative_to(ROOT)}).\n")
        parts.append("\n".join(summary_table(text)) + "\n")
        for heading in sections:
            parts.append("\n".join(["#" + line if line.startswith("#") else line for line in section(text, heading)]))
    (ROOT / "BENCHMARKS.md").write_text("\n".join(parts))


if __name__ == "__main__":
    main()
