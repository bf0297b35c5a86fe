# SPDX-License-Identifier: Apache-2.0
"""Experiments run by ``pyro-sdebnn benchmark NAME``.

Each public module in this package is one benchmark. It defines

- ``NAME``: the sub-command name (``"two-moons"``),
- ``DESCRIPTION``: one line for ``--help``,
- ``add_arguments(parser)``: its own options (the common ones -- ``--device``, ``--seed``,
  ``--output``, ``--quick`` -- are added by the CLI),
- ``run(args) -> dict``: does the work, writes its files under ``args.output`` and returns a
  summary dict of the figures it measured.

Adding a benchmark means adding a file here; :func:`discover` finds it.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

__all__ = ["discover"]

_REQUIRED = ("NAME", "DESCRIPTION", "add_arguments", "run")


def discover() -> dict[str, ModuleType]:
    """Return ``{name: module}`` for every experiment module in this package, sorted by name."""
    found: dict[str, ModuleType] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        missing = [attr for attr in _REQUIRED if not hasattr(module, attr)]
        if missing:
            raise TypeError(f"experiment module {module.__name__} lacks {missing}")
        if module.NAME in found:
            raise ValueError(f"two experiment modules claim the name {module.NAME!r}")
        found[module.NAME] = module
    return dict(sorted(found.items()))
