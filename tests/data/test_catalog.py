# SPDX-License-Identifier: Apache-2.0
"""describe_datasets() is cheap (constants) and its shapes agree with the real loaders."""

import pytest

from pyro_sdebnn import data
from pyro_sdebnn.data._catalog import describe_datasets


def test_rows_are_string_dicts_with_the_cli_keys():
    rows = describe_datasets()
    assert [row["name"] for row in rows] == [
        "two_moons",
        "toy_regression_1d",
        "gap_regression_1d",
        "uci_boston",
        "mnist_subset",
        "digits",
        "mnist",
        "fashion_mnist",
        "cifar10",
    ]
    for row in rows:
        assert set(row) == {"name", "task", "shapes", "source"}
        assert all(isinstance(value, str) and value for value in row.values())
        assert hasattr(data, row["name"])


def _row(name):
    return next(row for row in describe_datasets() if row["name"] == name)


@pytest.mark.parametrize(
    "name", ["two_moons", "toy_regression_1d", "gap_regression_1d", "uci_boston", "mnist_subset", "digits"]
)
def test_shapes_match_the_loader_defaults(name):
    split = getattr(data, name)()
    shapes = _row(name)["shapes"]
    assert f"train x {tuple(split.x_train.shape)}" in shapes
    assert f"test x {tuple(split.x_test.shape)}" in shapes


@pytest.mark.parametrize(
    "name, train, test",
    [
        ("mnist", (60000, 1, 28, 28), (10000, 1, 28, 28)),
        ("fashion_mnist", (60000, 1, 28, 28), (10000, 1, 28, 28)),
        ("cifar10", (50000, 3, 32, 32), (10000, 3, 32, 32)),
    ],
)
def test_torchvision_rows(name, train, test):
    row = _row(name)
    assert row["source"] == "torchvision (files under ROOT or network)"
    assert f"train {train}" in row["shapes"] and f"test {test}" in row["shapes"]


def test_cli_prints_the_table(capsys):
    from pyro_sdebnn.cli import main

    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    for row in describe_datasets():
        assert row["name"] in out
