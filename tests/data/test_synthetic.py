# SPDX-License-Identifier: Apache-2.0
"""The synthetic data sets (``data.synthetic``): two moons, the 1-D toy and gap regressions, their noise and options."""

import math

import pytest
import torch

from pyro_sdebnn import data


def _rows(x):
    return {tuple(row) for row in x.reshape(len(x), -1).double().tolist()}


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

