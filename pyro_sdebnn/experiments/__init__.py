# SPDX-License-Identifier: Apache-2.0
"""Experiments run by ``pyro-sdebnn benchmark NAME``.

Each benchmark is one module of this package, listed in :data:`REGISTRY` (one line per benchmark: its
sub-command name, its module and its one-line description). A module defines

- ``NAME``: the sub-command name (``"two-moons"``),
- ``DESCRIPTION``: one line for ``--help`` (the same as its :data:`REGISTRY` entry),
- ``add_arguments(parser)``: its own options (the common ones -- ``--device``, ``--seed``,
  ``--output``, ``--quick`` -- are added by the CLI),
- ``run(args) -> dict``: does the work, writes its files under ``args.output`` and returns a
  summary dict of the figures it measured,

and optionally ``QUICK``, a phrase saying what ``--quick`` does there (shown by ``--help``).

Adding a benchmark means adding its module and one line to :data:`REGISTRY`. The command line imports a
benchmark's module only when that benchmark is asked for (:func:`load`), so that ``pyro-sdebnn --help`` does not
pay for importing every experiment.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import NamedTuple


class Benchmark(NamedTuple):
    """One entry of :data:`REGISTRY`: the module (relative to this package) and the one-line description."""

    module: str
    description: str


#: ``{name: Benchmark(module, description)}``: the benchmarks of ``pyro-sdebnn benchmark NAME``, one line each.
REGISTRY: dict[str, Benchmark] = {
    "fsgmcmc-gap": Benchmark("fsgmcmc_gap", "1-D gap toy: predictive bands and coverage of SGLD, SGHMC, fSGLD, "
                                            "fSGHMC (Wu et al. 2024, Sec. 5.1)"),
    "mnvi-mnist": Benchmark("mnvi_mnist", "MNIST: deterministic / MC-dropout / MFVI / MNVI, the protocol of Schmitt "
                                          "& Roth 2021, Table 2"),
    "mnvi-uci": Benchmark("mnvi_uci", "MNVI vs MFVI vs MC-dropout vs deep ensemble on UCI Boston (Schmitt & Roth "
                                      "2021, Table 1)"),
    "realdata-nuts": Benchmark("realdata_nuts", "SGLD / SGHMC defaults against NUTS on scikit-learn's diabetes and "
                                                "breast-cancer data"),
    "sdebnn-mnist": Benchmark("sdebnn_mnist", "SDE-BNN (+STL) vs ODE-Net, mean-field ODE-Net and ResNet±MFVI: "
                                              "accuracy, ECE, curves, solver tolerance"),
    "sdebnn-toy": Benchmark("sdebnn_toy", "SDE-BNN on the 1-D toy: predictive bands, weight paths, STL vs analytic "
                                          "vs full-MC gradient variance"),
    "sgmcmc-uci": Benchmark("sgmcmc_uci", "UCI Boston: RMSE and test log-likelihood of SGLD, SGHMC, fSGLD, fSGHMC "
                                          "(Wu et al. 2024, Sec. 5.2)"),
    "two-moons": Benchmark("two_moons", "Head-to-head calibration of every BNN method on Two Moons: the main job"),
}

_REQUIRED = ("NAME", "DESCRIPTION", "add_arguments", "run")


def load(name: str) -> ModuleType:
    """Import the module of the benchmark ``name`` of :data:`REGISTRY` and check its interface.

    :raises KeyError: for a name that is not in :data:`REGISTRY`.
    :raises TypeError: when the module lacks one of ``NAME``, ``DESCRIPTION``, ``add_arguments``, ``run`` or its
        ``NAME`` is not ``name``.
    """
    module = importlib.import_module(f"{__name__}.{REGISTRY[name].module}")
    missing = [attr for attr in _REQUIRED if not hasattr(module, attr)]
    if missing:
        raise TypeError(f"experiment module {module.__name__} lacks {missing}")
    if module.NAME != name:
        raise TypeError(f"experiment module {module.__name__} is registered as {name!r} but its NAME is "
                        f"{module.NAME!r}")
    return module


def discover() -> dict[str, ModuleType]:
    """Return ``{name: module}`` for every benchmark of :data:`REGISTRY`, sorted by name (imports them all)."""
    return {name: load(name) for name in sorted(REGISTRY)}
