# SPDX-License-Identifier: Apache-2.0
"""Shipped text cites published work only: no pointers to internal notes, drafts or issue numbers.

Docstrings, docs, tutorials and benchmark reports must cite the published paper (authors, year, title,
venue) or state the equation they use. This test scans every shipped text file for references that a
reader of the released package cannot follow: internal note files, numbered internal source documents
bare issue numbers, commit hashes, and remarks about how the work itself was done (the working session, the
machine it was developed on, the team's shared folder). Each hit is reported as ``path:line: text``.

The patterns are assembled from pieces so that this file does not match itself if it is ever scanned.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Suffixes of the text files that are scanned.
TEXT_SUFFIXES = frozenset({".py", ".md", ".txt", ".cfg", ".toml", ".json", ".rst", ".csv", ".ipynb", ".yaml", ".yml"})

#: Directory names never scanned (build outputs, generated API pages, caches).
SKIPPED_DIRS = frozenset({"_build", "generated", "_autosummary", "__pycache__", ".ipynb_checkpoints", "data_cache"})

#: Directories scanned recursively, and single files, relative to the repository root.
SCANNED_DIRS = ("pyro_sdebnn", "tutorials", "benchmarks", "docs", "tests")
SCANNED_FILES = ("README.md", "BENCHMARKS.md", "CHANGELOG.md", "pyproject.toml", "setup.cfg")

_SEED = "se" + "ed"
_MD = r"\.md\b"
FORBIDDEN = (
    # numbered internal source documents: "<word> 003", "<word>-002", "<word>s 000 and 001", any case
    re.compile(rf"\b{_SEED}s?[ _-]?0{{2}}\d", re.IGNORECASE),
    # internal note files
    re.compile(r"\b" + "METH" + "ODS" + _MD),
    re.compile(r"\b" + "FSG" + "MCMC" + _MD),
    re.compile(r"\b" + "STY" + "LE" + _MD),
    re.compile(r"(?:\.\./)+" + "sha" + "red/"),
    re.compile(r"(?<![\w/.-])" + "sha" + "red/"),
    # an unnamed tutorial the library was not built from in public
    re.compile(r"\bthe BNN " + "tut" + r"orial\b", re.IGNORECASE),
    # bare issue numbers: describe the thing itself instead
    re.compile(r"\b" + "iss" + r"ues? #?\d+", re.IGNORECASE),
    # commit hashes: 7 to 40 hex digits with at least one digit and one letter
    re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    # how the work was done, which a user cannot follow
    re.compile(r"\bthis " + "sess" + r"ion\b", re.IGNORECASE),
    re.compile(r"\bdevelopment " + "mach" + r"ine\b", re.IGNORECASE),
)


def find_forbidden(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of every line of ``text`` that matches a forbidden pattern (1-based)."""
    return [
        (number, line)
        for number, line in enumerate(text.splitlines(), start=1)
        if any(pattern.search(line) for pattern in FORBIDDEN)
    ]


def shipped_text_files(root: Path = REPO_ROOT) -> list[Path]:
    """The shipped text files under ``root``: the scanned directories (recursively) and the single files."""
    files = [root / name for name in SCANNED_FILES if (root / name).is_file()]
    for directory in SCANNED_DIRS:
        base = root / directory
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            relative_parts = path.relative_to(root).parts
            if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in relative_parts):
                continue
            if path.is_file() and path.suffix.lower() in TEXT_SUFFIXES:
                files.append(path)
    return files


def scan(paths, root: Path = REPO_ROOT) -> list[str]:
    """``path:line: text`` for every forbidden reference in ``paths`` (paths shown relative to ``root``)."""
    hits = []
    for path in paths:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        for number, line in find_forbidden(text):
            hits.append(f"{Path(path).relative_to(root)}:{number}: {line.strip()}")
    return hits


def test_shipped_text_cites_published_sources_only():
    files = shipped_text_files()
    # guard against a vacuous pass (wrong root, renamed folders)
    assert any(path.name == "__init__.py" for path in files), f"no package files found under {REPO_ROOT}"
    hits = scan(files)
    assert not hits, (
        f"{len(hits)} reference(s) to internal material in shipped files; cite the published paper "
        "(authors, year, title, venue) or state the equation instead:\n" + "\n".join(hits)
    )


def test_patterns_catch_internal_references_and_accept_citations(tmp_path):
    bad = [
        "update rule as in " + _SEED + " 003, Definition 6.1",
        "S" + _SEED[1:] + "-002 eq. (5)",
        _SEED.upper() + "S 000 and 001",
        "see " + "METH" + "ODS.md §4",
        "rules in " + "FSG" + "MCMC.md",
        "see " + "STY" + "LE.md",
        "../" + "sha" + "red/seeds/INDEX.md",
        "Two Moons from the BNN " + "tut" + "orial",
        "measured in " + "iss" + "ue 5",
        "fixed in " + "Iss" + "ue #12",
        "see " + "sha" + "red/repro/run.py",
        "the same row in the CI build of " + "c50b" + "fe8",
        "measured in " + "this sess" + "ion",
        "on the " + "development mach" + "ine",
    ]
    clean = [
        "same " + _SEED + " same result; " + _SEED + "=0",
        "random " + _SEED + " 42",
        "eq. (4) of Welling & Teh (2011) [1]",
        "Schmitt & Roth (2021), App. A",
        "a tissue 5 mm thick",
        "report an issue on the tracker",
        "the methods.py module",
        "a shared memory segment; /dev/shm/shared/x; lib/shared/util.py",
        "a decade of faced beds; 1e-5 and 12345678",
        "a user's session (Pyro validation on); a machine with two GPUs",
    ]
    for line in bad:
        assert find_forbidden(line) == [(1, line)], line
    for line in clean:
        assert find_forbidden(line) == [], line

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "module.py").write_text('"""Doc.\n\n' + bad[0] + '\n"""\n', encoding="utf-8")
    (tmp_path / "pkg" / "clean.md").write_text("\n".join(clean) + "\n", encoding="utf-8")
    hits = scan(sorted((tmp_path / "pkg").iterdir()), root=tmp_path)
    assert hits == [str(Path("pkg") / "module.py") + ":3: " + bad[0]]
