"""The package's code lines stay within the 120 columns that ``setup.cfg`` gives flake8 (CI runs no linter)."""

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pyro_sdebnn"
MAX_COLUMNS = 120


def test_package_lines_at_most_120_columns():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50  # the walk found the package
    too_long = [f"{path.relative_to(PACKAGE.parent)}:{number}: {len(line)} columns"
                for path in files
                for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                if len(line) > MAX_COLUMNS]
    assert not too_long, "lines longer than 120 columns:\n" + "\n".join(too_long)
