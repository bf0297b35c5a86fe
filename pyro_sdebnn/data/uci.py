# SPDX-License-Identifier: Apache-2.0
"""UCI regression benchmarks shipped with installed packages (no download)."""

from __future__ import annotations

import functools

import numpy as np
import torch

from .split import DataSplit, _check_dtype, _check_fraction, _standardize_columns, _to_split

__all__ = ["uci_boston"]

#: Number of standard random train/test splits of each UCI data set (the protocol of the UCI tables).
NUM_UCI_SPLITS = 20


@functools.lru_cache(maxsize=None)
def _boston_arrays() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import boston_housing_data

    x, y = boston_housing_data()
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def uci_boston(
    split: int = 0, test_fraction: float = 0.1, standardize: bool = True, *, dtype: torch.dtype = torch.float32
) -> DataSplit:
    """The UCI Boston housing regression data (506 houses, 13 features), from the copy in ``mlxtend``.

    The standard protocol of the UCI regression tables: ``NUM_UCI_SPLITS`` = 20 random splits,
    split ``k`` a random permutation seeded by ``k`` with the last ``round(test_fraction * 506)``
    rows (51 for 10 %) held out. With ``standardize`` the features and the target are standardised
    with the mean and (population) standard deviation of the **training split only**; the target's
    ``y_loc``/``y_scale`` are returned so metrics can be reported in the original units
    (thousands of dollars): :math:`y = y_\\text{std} \\cdot \\texttt{y\\_scale} + \\texttt{y\\_loc}`.

    :param int split: which of the 20 splits, ``0 <= split < 20``.
    :param float test_fraction: fraction of rows in the test set, in ``(0, 1)``.
    :param bool standardize: standardise ``x`` and ``y`` on the training split.
    :param torch.dtype dtype: floating dtype of features and targets.
    :return: :class:`DataSplit` with ``x`` of shape ``(N, 13)`` and ``y`` of shape ``(N,)``.

    >>> split = uci_boston(split=0)
    >>> split.x_train.shape, split.x_test.shape, split.y_train.shape
    (torch.Size([455, 13]), torch.Size([51, 13]), torch.Size([455]))
    >>> abs(float(split.y_train.mean())) < 1e-5, round(split.y_scale, 2) > 0
    (True, True)
    """
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or not 0 <= split < NUM_UCI_SPLITS:
        raise ValueError(f"split must be an integer in [0, {NUM_UCI_SPLITS}), got {split!r}")
    test_fraction = _check_fraction("test_fraction", test_fraction)
    dtype = _check_dtype(dtype)
    x, y = _boston_arrays()
    n = x.shape[0]
    n_test = int(round(test_fraction * n))
    if not 0 < n_test < n:
        raise ValueError(f"test_fraction={test_fraction} leaves an empty train or test set of the {n} rows")
    perm = np.random.default_rng(int(split)).permutation(n)
    train_idx, test_idx = perm[: n - n_test], perm[n - n_test :]
    x_train, x_test, y_train, y_test = x[train_idx], x[test_idx], y[train_idx], y[test_idx]
    y_loc: float | np.ndarray = 0.0  # a 0-d array (the mean of a 1-D column) when standardised
    y_scale: float | np.ndarray = 1.0
    if standardize:
        x_train, x_test, _, _ = _standardize_columns(x_train, x_test)
        y_train, y_test, y_loc, y_scale = _standardize_columns(y_train, y_test)
    return _to_split(
        x_train, y_train, x_test, y_test, dtype=dtype, classification=False, y_loc=float(y_loc), y_scale=float(y_scale)
    )
