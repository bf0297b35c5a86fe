# SPDX-License-Identifier: Apache-2.0
"""Shapes, dtypes, splits, determinism and normalisation of the tensor loaders of pyro_sdebnn.data."""

import math

import numpy as np
import pytest
import torch

from pyro_sdebnn import data
from pyro_sdebnn.data import DataSplit

# (loader, kwargs, train x shape, test x shape, task); each row is one parametrized case.
SHAPES = [
    (data.two_moons, {}, (200, 2), (500, 2), "classification"),
    (data.two_moons, dict(n_train=30, n_test=7), (30, 2), (7, 2), "classification"),
    (data.toy_regression_1d, {}, (100, 1), (200, 1), "regression"),
    (data.gap_regression_1d, {}, (20, 1), (200, 1), "regression"),
    (data.gap_regression_1d, dict(n_train=7, n_test=3), (7, 1), (3, 1), "regression"),
    (data.uci_boston, {}, (455, 13), (51, 13), "regression"),
    (data.uci_boston, dict(split=19, test_fraction=0.2), (405, 13), (101, 13), "regression"),
    (data.mnist_subset, {}, (4000, 1, 28, 28), (1000, 1, 28, 28), "classification"),
    (data.mnist_subset, dict(n_test=500), (4500, 1, 28, 28), (500, 1, 28, 28), "classification"),
    (data.digits, {}, (1437, 1, 8, 8), (360, 1, 8, 8), "classification"),
]


def _id(row):
    return f"{row[0].__name__}-{'-'.join(f'{k}={v}' for k, v in row[1].items()) or 'default'}"


@pytest.mark.parametrize("loader, kwargs, train_shape, test_shape, task", SHAPES, ids=[_id(r) for r in SHAPES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_and_dtypes(loader, kwargs, train_shape, test_shape, task, dtype):
    split = loader(**kwargs, dtype=dtype)
    assert isinstance(split, DataSplit)
    assert split.x_train.shape == train_shape and split.x_test.shape == test_shape
    assert split.y_train.shape == train_shape[:1] and split.y_test.shape == test_shape[:1]
    assert split.x_train.dtype == dtype and split.x_test.dtype == dtype
    label_dtype = torch.int64 if task == "classification" else dtype
    assert split.y_train.dtype == label_dtype and split.y_test.dtype == label_dtype
    assert isinstance(split.y_loc, float) and isinstance(split.y_scale, float) and split.y_scale > 0
    if task == "classification":
        assert (split.y_loc, split.y_scale) == (0.0, 1.0)
    for tensor in split[:4]:
        assert torch.isfinite(tensor.double()).all()


SEEDED = [
    (data.two_moons, "seed"),
    (data.toy_regression_1d, "seed"),
    (data.gap_regression_1d, "seed"),
    (data.uci_boston, "split"),
    (data.mnist_subset, "seed"),
    (data.digits, "seed"),
]


@pytest.mark.parametrize("loader, seed_name", SEEDED, ids=[r[0].__name__ for r in SEEDED])
def test_same_seed_same_data_and_different_seed_different_data(loader, seed_name):
    first, again, other = loader(**{seed_name: 3}), loader(**{seed_name: 3}), loader(**{seed_name: 4})
    for a, b in zip(first[:4], again[:4]):
        assert torch.equal(a, b)
    # Random inputs (or a random split of a fixed table) differ between seeds. The 1-D toy problems'
    # test inputs are a fixed grid, so compare the training inputs, which are random everywhere.
    assert not torch.equal(first.x_train, other.x_train)


@pytest.mark.parametrize("loader", [data.two_moons, data.uci_boston, data.mnist_subset], ids=lambda f: f.__name__)
def test_loaders_return_fresh_tensors(loader):
    split = loader()
    split.x_train.fill_(123.0)
    assert not torch.equal(loader().x_train, split.x_train)


def _rows(x):
    return {tuple(row) for row in x.reshape(len(x), -1).double().tolist()}


@pytest.mark.parametrize("loader", [data.uci_boston, data.mnist_subset, data.digits], ids=lambda f: f.__name__)
def test_table_splits_are_disjoint_and_cover_the_table(loader):
    # The underlying tables have no duplicate rows, so disjoint row sets mean disjoint index sets.
    split = loader(**({"standardize": False} if loader is data.uci_boston else {}), dtype=torch.float64)
    train, test = _rows(split.x_train), _rows(split.x_test)
    assert len(train) == len(split.x_train) and len(test) == len(split.x_test)
    assert not train & test
    table_size = {data.uci_boston: 506, data.mnist_subset: 5000, data.digits: 1797}[loader]
    assert len(train) + len(test) == table_size


def test_two_moons_test_set_is_a_different_draw():
    split = data.two_moons(n_train=100, n_test=100, dtype=torch.float64)
    assert not _rows(split.x_train) & _rows(split.x_test)
    # make_moons balances the classes: n // 2 and n - n // 2 points.
    assert torch.bincount(split.y_train).tolist() == [50, 50]


def test_two_moons_noise_level():
    # Without noise every point lies exactly on one of the two unit half circles.
    split = data.two_moons(n_train=50, n_test=50, noise=0.0, dtype=torch.float64)
    x, y = split.x_train, split.y_train
    centre = torch.where(y[:, None] == 0, torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.5]))
    radius = (x - centre).norm(dim=-1)
    assert torch.allclose(radius, torch.ones_like(radius), atol=1e-12)


def test_gap_regression_inputs_targets_and_noise():
    split = data.gap_regression_1d(n_train=2000, n_test=200, dtype=torch.float64)
    x = split.x_train[:, 0]
    assert ((x.abs() >= 1) & (x.abs() <= 4)).all()
    assert int((x < 0).sum()) == 1000  # half of the points on each side of the gap
    grid = split.x_test[:, 0]
    assert grid[0] == -6 and grid[-1] == 6 and (grid.diff() > 0).all()
    residual = split.y_train - x**3
    # The sample sd of n Gaussian residuals has standard error sigma / sqrt(2 n); allow 4 of them.
    sigma, n = 3.0, len(residual)
    assert abs(float(residual.std()) - sigma) < 4 * sigma / math.sqrt(2 * n)
    assert abs(float(residual.mean())) < 4 * sigma / math.sqrt(n)


def test_toy_regression_is_non_monotonic_with_the_stated_noise():
    split = data.toy_regression_1d(n_train=2000, noise=0.1, dtype=torch.float64)
    x = split.x_train[:, 0]
    assert x.min() >= -2 and x.max() <= 2
    truth = torch.sin(2 * x) + 0.2 * x**2
    residual = split.y_train - truth
    sigma, n = 0.1, len(residual)
    assert abs(float(residual.std()) - sigma) < 4 * sigma / math.sqrt(2 * n)
    order = x.argsort()
    slope_signs = torch.sign(truth[order].diff())
    assert (slope_signs > 0).any() and (slope_signs < 0).any()
    grid = split.x_test[:, 0]
    assert grid[0] == -3 and grid[-1] == 3


@pytest.mark.parametrize("loader", [data.toy_regression_1d, data.gap_regression_1d], ids=lambda f: f.__name__)
def test_toy_standardize_option(loader):
    raw, std = loader(dtype=torch.float64), loader(standardize=True, dtype=torch.float64)
    assert abs(float(std.y_train.mean())) < 1e-12
    assert abs(float(std.y_train.std(unbiased=False)) - 1) < 1e-12
    assert torch.allclose(std.to_original_units(std.y_test), raw.y_test, atol=1e-10)
    assert torch.equal(std.x_train, raw.x_train)


def test_uci_boston_standardised_on_the_training_split_only():
    split = data.uci_boston(split=5, dtype=torch.float64)
    assert torch.allclose(split.x_train.mean(0), torch.zeros(13, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(split.x_train.std(0, unbiased=False), torch.ones(13, dtype=torch.float64), atol=1e-10)
    assert abs(float(split.y_train.mean())) < 1e-10
    # The test split is transformed with the training statistics, so it is not exactly standardised.
    assert float(split.x_test.mean(0).abs().max()) > 1e-3
    raw = data.uci_boston(split=5, standardize=False, dtype=torch.float64)
    assert (raw.y_loc, raw.y_scale) == (0.0, 1.0)
    assert split.y_loc == pytest.approx(float(raw.y_train.mean()), rel=1e-12)
    assert split.y_scale == pytest.approx(float(raw.y_train.std(unbiased=False)), rel=1e-12)
    assert torch.allclose(split.to_original_units(split.y_test), raw.y_test, atol=1e-10)
    assert torch.allclose(split.to_original_units(split.y_train), raw.y_train, atol=1e-10)


def test_uci_boston_matches_the_mlxtend_table():
    from mlxtend.data import boston_housing_data

    x, y = boston_housing_data()
    split = data.uci_boston(split=0, standardize=False, dtype=torch.float64)
    targets = torch.cat([split.y_train, split.y_test]).sort().values
    assert np.allclose(targets.numpy(), np.sort(y))
    assert _rows(torch.cat([split.x_train, split.x_test])) == _rows(torch.from_numpy(x))


def test_uci_boston_twenty_distinct_splits():
    test_sets = [frozenset(_rows(data.uci_boston(split=k, standardize=False).y_test[:, None])) for k in range(20)]
    assert len(set(test_sets)) == 20


@pytest.mark.parametrize("loader", [data.mnist_subset, data.digits], ids=lambda f: f.__name__)
def test_image_subsets_are_scaled_and_stratified(loader):
    split = loader()
    for x in (split.x_train, split.x_test):
        assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert set(split.y_train.tolist()) == set(range(10))
    counts = torch.bincount(split.y_test, minlength=10)
    # Stratified: every class has (about) n_test / 10 test images.
    assert int(counts.max() - counts.min()) <= 2
    if loader is data.mnist_subset:
        assert counts.tolist() == [100] * 10


BAD_ARGUMENTS = [
    (data.two_moons, dict(n_train=0), ValueError, "n_train"),
    (data.two_moons, dict(n_test=-3), ValueError, "n_test"),
    (data.two_moons, dict(noise=-0.1), ValueError, "noise"),
    (data.two_moons, dict(seed=-1), ValueError, "seed"),
    (data.two_moons, dict(dtype=torch.int64), TypeError, "dtype"),
    (data.toy_regression_1d, dict(n_train=1.5), ValueError, "n_train"),
    (data.gap_regression_1d, dict(n_test=0), ValueError, "n_test"),
    (data.uci_boston, dict(split=20), ValueError, "split"),
    (data.uci_boston, dict(split=-1), ValueError, "split"),
    (data.uci_boston, dict(test_fraction=1.5), ValueError, "test_fraction"),
    (data.uci_boston, dict(test_fraction=0.0001), ValueError, "test_fraction"),
    (data.mnist_subset, dict(n_test=5000), ValueError, "n_test"),
    (data.digits, dict(test_fraction=0), ValueError, "test_fraction"),
]


@pytest.mark.parametrize(
    "loader, kwargs, error, name",
    BAD_ARGUMENTS,
    ids=[f"{r[0].__name__}-{r[3]}-{i}" for i, r in enumerate(BAD_ARGUMENTS)],
)
def test_bad_arguments_raise_naming_the_argument(loader, kwargs, error, name):
    with pytest.raises(error, match=name):
        loader(**kwargs)
