# SPDX-License-Identifier: Apache-2.0
"""The one likelihood vocabulary of the package: Pyro's distribution names, lower-cased.

Every model, baseline and network that takes a ``likelihood=`` argument names the observation distribution as
:mod:`pyro.distributions` does (``"normal"`` for :class:`~pyro.distributions.Normal`, ``"bernoulli"``,
``"categorical"``, ``"cauchy"``, ``"laplace"``, ``"studentt"`` for :class:`~pyro.distributions.StudentT`), and
accepts no other spelling. Each component supports a subset (a baseline: ``"normal"`` and ``"categorical"``) and
checks a name with :func:`check_likelihood`, whose error lists the names it accepts.
"""

from __future__ import annotations

from typing import Sequence

#: Every likelihood name used in the package, in the order of the docs.
LIKELIHOODS = ("normal", "bernoulli", "categorical", "cauchy", "laplace", "studentt")


def check_likelihood(likelihood: object, allowed: Sequence[str]) -> str:
    """Return ``likelihood`` if it is one of ``allowed``; otherwise raise a ``ValueError`` listing them.

    >>> check_likelihood("normal", ("normal", "categorical"))
    'normal'
    >>> check_likelihood("gaussian", ("normal", "categorical"))
    Traceback (most recent call last):
    ...
    ValueError: likelihood must be one of ('normal', 'categorical') (Pyro's distribution names), got 'gaussian'
    """
    if not set(allowed) <= set(LIKELIHOODS):  # pragma: no cover - a programming error in the caller
        raise AssertionError(f"{tuple(allowed)} is not a subset of {LIKELIHOODS}")
    if not isinstance(likelihood, str) or likelihood not in allowed:
        raise ValueError(f"likelihood must be one of {tuple(allowed)} (Pyro's distribution names), got {likelihood!r}")
    return likelihood
