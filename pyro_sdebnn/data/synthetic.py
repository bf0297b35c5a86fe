# SPDX-License-Identifier: Apache-2.0
"""Synthetic toy problems: Two Moons classification and two 1-D regression problems.

All loaders are deterministic functions of ``seed``; the training and test sets are drawn from
independent child seeds of ``seed`` (numpy ``SeedSequence.spawn``), so no test point is a copy of a
training point and different seeds give different data.
"""

from __future__ import annotations

import numpy as np
import torch

from .split import DataSplit, _check_dtype, _check_positive_int, _child_seeds, _standardize_columns, _to_split

__all__ = ["gap_regression_1d", "toy_regression_1d", "two_moons"]


def two_moons(
    n_train: int = 200, n_test: int = 500, noise: float = 0.2, seed: int = 0, *, dtype: torch.dtype = torch.float32
) -> DataSplit:
    """Two interleaving half circles in :math:`\\mathbb R^2` (scikit-learn ``make_moons``), binary labels.

    The setting of the BNN tutorial [1]: isotropic Gaussian noise of standard deviation ``noise``
    (0.2). Training and test sets come from two different random states. Features are not
    standardised (they lie roughly in :math:`[-1.5, 2.5] \\times [-1, 1.5]`).

    :param int n_train: number of training points (classes balanced up to one point).
    :param int n_test: number of test points.
    :param float noise: standard deviation of the Gaussian noise added to the points.
    :param int seed: random seed of the split.
    :param torch.dtype dtype: floating dtype of the features.
    :return: :class:`DataSplit` with ``x`` of shape ``(N, 2)`` and int64 labels in ``{0, 1}`` of shape ``(N,)``.

    **References**

    [1] Tutorial "Bayesian Neural Networks", §1 (Two Moons, noise 0.2).

    >>> split = two_moons(n_train=10, n_test=4)
    >>> split.x_train.shape, split.y_train.dtype, split.x_test.shape
    (torch.Size([10, 2]), torch.int64, torch.Size([4, 2]))
    """
    from sklearn.datasets import make_moons

    n_train = _check_positive_int("n_train", n_train)
    n_test = _check_positive_int("n_test", n_test)
    if not noise >= 0:
        raise ValueError(f"noise must be a non-negative number, got {noise!r}")
    dtype = _check_dtype(dtype)
    train_seed, test_seed = _child_seeds(seed, 2)
    x_train, y_train = make_moons(n_samples=n_train, noise=noise, random_state=train_seed)
    x_test, y_test = make_moons(n_samples=n_test, noise=noise, random_state=test_seed)
    return _to_split(x_train, y_train, x_test, y_test, dtype=dtype, classification=True)


def _toy_function(x: np.ndarray) -> np.ndarray:
    return np.sin(2.0 * x) + 0.2 * x**2


def toy_regression_1d(
    n_train: int = 100,
    n_test: int = 200,
    seed: int = 0,
    *,
    noise: float = 0.1,
    standardize: bool = False,
    dtype: torch.dtype = torch.float32,
) -> DataSplit:
    """A non-monotonic 1-D regression problem (the kind used for the SDE-BNN toy figures [1, 2]).

    .. math::

        f(x) = \\sin(2x) + 0.2\\,x^2, \\qquad y = f(x) + \\varepsilon,\\quad
        \\varepsilon \\sim \\mathcal N(0, \\texttt{noise}^2),

    with training inputs :math:`x \\sim U[-2, 2]` (random order) and test inputs an evenly spaced
    grid on :math:`[-3, 3]` (so the test set also probes extrapolation, and is ready to plot).

    :param int n_train: number of training points.
    :param int n_test: number of test grid points.
    :param int seed: random seed of the inputs and the noise.
    :param float noise: standard deviation of the observation noise.
    :param bool standardize: standardise the targets with the training mean / standard deviation
        (recorded in ``y_loc``/``y_scale``); inputs are never rescaled.
    :param torch.dtype dtype: floating dtype of inputs and targets.
    :return: :class:`DataSplit` with ``x`` of shape ``(N, 1)`` and ``y`` of shape ``(N,)``.

    **References**

    [1] Xu, Chen, Li, Duvenaud (2020), "Continuous-Depth Bayesian Neural Networks", §4.2.

    [2] Xu, Chen, Li, Duvenaud (2022), "Infinitely Deep Bayesian Neural Networks with Stochastic
    Differential Equations", AISTATS, Figure 3.

    >>> split = toy_regression_1d(n_train=8, n_test=5)
    >>> split.x_train.shape, split.y_train.shape, split.x_test[:, 0]
    (torch.Size([8, 1]), torch.Size([8]), tensor([-3.0000, -1.5000,  0.0000,  1.5000,  3.0000]))
    """
    n_train = _check_positive_int("n_train", n_train)
    n_test = _check_positive_int("n_test", n_test)
    if not noise >= 0:
        raise ValueError(f"noise must be a non-negative number, got {noise!r}")
    dtype = _check_dtype(dtype)
    train_seed, test_seed = _child_seeds(seed, 2)
    rng = np.random.default_rng(train_seed)
    x_train = rng.uniform(-2.0, 2.0, size=n_train)
    y_train = _toy_function(x_train) + noise * rng.standard_normal(n_train)
    x_test = np.linspace(-3.0, 3.0, n_test)
    y_test = _toy_function(x_test) + noise * np.random.default_rng(test_seed).standard_normal(n_test)
    return _regression_split(x_train, y_train, x_test, y_test, standardize=standardize, dtype=dtype)


def gap_regression_1d(
    n_train: int = 20,
    n_test: int = 200,
    seed: int = 0,
    *,
    standardize: bool = False,
    dtype: torch.dtype = torch.float32,
) -> DataSplit:
    """The cubic regression problem with a gap in the training inputs.

    .. math::

        y = x^3 + \\varepsilon, \\quad \\varepsilon \\sim \\mathcal N(0, 3^2), \\qquad
        x_\\text{train} \\sim U([-4, -1] \\cup [1, 4]), \\quad x_\\text{test} \\in [-6, 6].

    Half of the training inputs (rounded down) are uniform on :math:`[-4, -1]`, the rest uniform on
    :math:`[1, 4]`, in random order. The test inputs are an evenly spaced grid on :math:`[-6, 6]`
    (covering the gap and both extrapolation regions) with noisy targets.

    :param int n_train: number of training points.
    :param int n_test: number of test grid points.
    :param int seed: random seed of the inputs and the noise.
    :param bool standardize: standardise the targets with the training mean / standard deviation
        (recorded in ``y_loc``/``y_scale``); inputs are never rescaled.
    :param torch.dtype dtype: floating dtype of inputs and targets.
    :return: :class:`DataSplit` with ``x`` of shape ``(N, 1)`` and ``y`` of shape ``(N,)``.

    >>> split = gap_regression_1d()
    >>> split.x_train.shape, split.x_test.shape
    (torch.Size([20, 1]), torch.Size([200, 1]))
    >>> bool((split.x_train.abs() >= 1).all() and (split.x_train.abs() <= 4).all())
    True
    """
    n_train = _check_positive_int("n_train", n_train)
    n_test = _check_positive_int("n_test", n_test)
    dtype = _check_dtype(dtype)
    train_seed, test_seed = _child_seeds(seed, 2)
    rng = np.random.default_rng(train_seed)
    n_left = n_train // 2
    magnitude = rng.uniform(1.0, 4.0, size=n_train)
    sign = np.where(np.arange(n_train) < n_left, -1.0, 1.0)
    x_train = rng.permutation(sign * magnitude)
    y_train = x_train**3 + 3.0 * rng.standard_normal(n_train)
    x_test = np.linspace(-6.0, 6.0, n_test)
    y_test = x_test**3 + 3.0 * np.random.default_rng(test_seed).standard_normal(n_test)
    return _regression_split(x_train, y_train, x_test, y_test, standardize=standardize, dtype=dtype)


def _regression_split(x_train, y_train, x_test, y_test, *, standardize: bool, dtype: torch.dtype) -> DataSplit:
    y_loc, y_scale = 0.0, 1.0
    if standardize:
        y_train, y_test, y_loc, y_scale = _standardize_columns(y_train, y_test)
    return _to_split(
        x_train[:, None],
        y_train,
        x_test[:, None],
        y_test,
        dtype=dtype,
        classification=False,
        y_loc=float(y_loc),
        y_scale=float(y_scale),
    )
