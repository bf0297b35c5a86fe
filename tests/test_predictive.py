# SPDX-License-Identifier: Apache-2.0
"""The prediction containers (``pyro_sdebnn.predictive``): the regression mixture's variance decomposition."""

import pytest
import torch

from pyro_sdebnn.infer import RegressionPrediction


@pytest.mark.parametrize("num_components", [1, 4])
def test_regression_prediction_epistemic_variance_is_population_variance(num_components):
    """Var_s[mu_s] with divisor S (0 for a single component), float64 round-off only."""
    loc = torch.randn(num_components, 5, dtype=torch.float64)
    pred = RegressionPrediction(loc, torch.ones_like(loc))
    expected = (loc - loc.mean(0)).pow(2).mean(0)
    torch.testing.assert_close(pred.epistemic_variance, expected, atol=1e-15, rtol=1e-12)
    torch.testing.assert_close(pred.variance, 1 + expected)

