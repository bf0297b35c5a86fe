# SPDX-License-Identifier: Apache-2.0
"""The public API: the ``__all__`` lists of the public packages, each name exported from one place, a bounded size.

The public names of pyro-sdebnn are those in the ``__all__`` of its packages (``pyro_sdebnn``, ``pyro_sdebnn.nn``,
``pyro_sdebnn.infer`` ...), as in Pyro; a module inside a package may list in its own ``__all__`` only names its
package exports (it steers the API pages), and a private module (``_name``) lists none.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections import defaultdict

import pytest
import torch

import pyro_sdebnn
from pyro_sdebnn.infer import DeepEnsemble, Laplace, MAPEstimate, MCDropout, MeanFieldVI, SamplingFreeBNN
from pyro_sdebnn.infer.mcmc import BayesianMLP
from pyro_sdebnn.nn import SDEBNN, ODENet
from pyro_sdebnn.nn.mnvi import MNLinear, MNSequential

#: Upper bound on the public names of each package. A new public name raises its package's bound here, on purpose.
BUDGET = {
    "pyro_sdebnn": 1,
    "pyro_sdebnn.data": 10,
    "pyro_sdebnn.distributed": 10,
    "pyro_sdebnn.distributions": 5,
    "pyro_sdebnn.experiments": 0,
    "pyro_sdebnn.infer": 16,
    "pyro_sdebnn.infer.mcmc": 10,
    "pyro_sdebnn.kernels": 1,
    "pyro_sdebnn.metrics": 19,
    "pyro_sdebnn.nn": 4,
    "pyro_sdebnn.nn.mnvi": 13,
    "pyro_sdebnn.ops": 19,
    "pyro_sdebnn.testing": 2,
}
TOTAL_BOUND = sum(BUDGET.values())

#: Names exported by two packages whose merge into one is under way elsewhere; each entry must still be a duplicate
#: (the test below fails once it is not, so that the entry is deleted then).
DUPLICATES_BEING_MERGED: dict[str, set[str]] = {}

#: The benchmark programs run by ``pyro-sdebnn benchmark NAME`` list their interface (``NAME``, ``DESCRIPTION``,
#: ``add_arguments``, ``run``) for their API page; the experiments package itself exports nothing.
PROGRAMS = "pyro_sdebnn.experiments."
#: Upper bound on the names that public modules list beyond what their package exports.
MODULE_ONLY_BOUND = 14


def _all_modules() -> dict[str, object]:
    modules = {"pyro_sdebnn": pyro_sdebnn}
    for info in pkgutil.walk_packages(pyro_sdebnn.__path__, "pyro_sdebnn."):
        if info.name.endswith(".conftest"):
            continue
        modules[info.name] = importlib.import_module(info.name)
    return modules


@pytest.fixture(scope="module")
def modules() -> dict[str, object]:
    return _all_modules()


@pytest.fixture(scope="module")
def packages(modules) -> dict[str, list[str]]:
    """``{package: its __all__}`` for every public package (``__init__`` with no private part in its name)."""
    return {
        name: list(getattr(module, "__all__", []))
        for name, module in modules.items()
        if hasattr(module, "__path__") and not any(part.startswith("_") for part in name.split("."))
    }


def test_every_package_has_a_budget(packages):
    assert set(packages) == set(BUDGET)


def test_every_listed_name_exists(modules):
    missing = [f"{name}.{n}" for name, module in modules.items() for n in getattr(module, "__all__", [])
               if not hasattr(module, n)]
    assert not missing, f"names in __all__ that the module does not define: {missing}"


def test_no_name_is_listed_twice_in_one_list(modules):
    repeated = {name: [n for n in set(module.__all__) if module.__all__.count(n) > 1]
                for name, module in modules.items() if hasattr(module, "__all__")}
    assert not {k: v for k, v in repeated.items() if v}


def test_each_public_name_is_exported_once(modules, packages):
    by_name: dict[str, set[str]] = defaultdict(set)
    by_object: dict[int, set[str]] = defaultdict(set)
    for package, names in packages.items():
        for n in names:
            by_name[n].add(package)
            by_object[id(getattr(modules[package], n))].add(f"{package}.{n}")
    twice = {n: where for n, where in by_name.items() if len(where) > 1}
    assert twice == DUPLICATES_BEING_MERGED, (
        "a public name must be exported by one package only (delete an entry of DUPLICATES_BEING_MERGED once its "
        f"merge is done): {twice}"
    )
    same_object = [sorted(where) for where in by_object.values()
                   if len(where) > 1 and not {w.rsplit(".", 1)[1] for w in where} <= set(DUPLICATES_BEING_MERGED)]
    assert not same_object, f"one object exported under two names: {same_object}"


def test_the_number_of_public_names_is_bounded(packages):
    over = {p: (len(names), BUDGET[p]) for p, names in packages.items() if len(names) > BUDGET[p]}
    assert not over, f"(public names, budget) of the packages over budget: {over}"
    assert sum(len(names) for names in packages.values()) <= TOTAL_BOUND


def test_the_top_level_package_exports_its_version_only():
    assert pyro_sdebnn.__all__ == ["__version__"]


def test_module_level_public_names_are_bounded(modules, packages):
    """A private module lists nothing; a public module may list names its package does not re-export (its own API,
    documented on its page, e.g. ``pyro_sdebnn.infer.mcmc.arviz.get_samples``), and those count towards a bound."""
    stray, module_only = {}, {}
    for name, module in modules.items():
        if not hasattr(module, "__all__") or hasattr(module, "__path__"):
            continue
        if name.startswith(PROGRAMS) and not name.rsplit(".", 1)[1].startswith("_"):
            continue
        if any(part.startswith("_") for part in name.split(".")):
            stray[name] = sorted(module.__all__)
            continue
        extra = set(module.__all__) - set(packages.get(name.rsplit(".", 1)[0], []))
        if extra:
            module_only[name] = sorted(extra)
    assert not stray, f"private modules with an __all__: {stray}"
    count = sum(len(v) for v in module_only.values())
    assert count <= MODULE_ONLY_BOUND, f"{count} module-level public names (bound {MODULE_ONLY_BOUND}): {module_only}"


def test_the_0_1_shims_are_gone():
    from pyro_sdebnn.infer import methods

    assert not hasattr(methods, "train_network")
    assert not hasattr(methods, "__getattr__")


def _net():
    return torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


LIKELIHOOD_TAKERS = {
    "MAPEstimate": lambda lik: MAPEstimate(_net(), lik),
    "MeanFieldVI": lambda lik: MeanFieldVI(_net(), lik),
    "Laplace": lambda lik: Laplace(_net(), lik),
    "DeepEnsemble": lambda lik: DeepEnsemble(_net, lik, num_members=2),
    "MCDropout": lambda lik: MCDropout(torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Dropout(0.1),
                                                           torch.nn.Linear(4, 2)), lik),
    "SamplingFreeBNN": lambda lik: SamplingFreeBNN(MNSequential(MNLinear(2, 2)), lik),
    "SDEBNN": lambda lik: SDEBNN(1, 1, hidden=4, dt=0.5, likelihood=lik),
    "ODENet": lambda lik: ODENet(1, 1, hidden=4, dt=0.5, likelihood=lik),
    "BayesianMLP": lambda lik: BayesianMLP([2, 4, 1], likelihood=lik),
}


@pytest.mark.parametrize("name", sorted(LIKELIHOOD_TAKERS))
def test_one_likelihood_vocabulary(name):
    # Pyro's distribution names: "normal" is accepted everywhere a Gaussian likelihood is, "gaussian" nowhere, and
    # the error lists the names that are accepted
    assert LIKELIHOOD_TAKERS[name]("normal").likelihood == "normal"
    with pytest.raises(ValueError, match=r"likelihood must be one of \(.*'normal'.*\).*got 'gaussian'"):
        LIKELIHOOD_TAKERS[name]("gaussian")
