# SPDX-License-Identifier: Apache-2.0
"""The UCI Boston housing splits (``data.uci``): standardised on the training split, the mlxtend table, 20 splits."""

import numpy as np
import pytest
import torch

from pyro_sdebnn import data


def _rows(x):
    return {tuple(row) for row in x.reshape(len(x), -1).double().tolist()}


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

