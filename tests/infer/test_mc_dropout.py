# SPDX-License-Identifier: Apache-2.0
"""MC-dropout on small problems: predictive spread, train/eval mode, the dropout layers it recognises, errors."""

import pytest
import torch

from pyro_sdebnn.infer import ClassificationPrediction, DeepEnsemble, MCDropout, RegressionPrediction
from pyro_sdebnn.nn._mlp import make_mlp


def _blobs(n=64):
    torch.manual_seed(0)
    y = torch.arange(n) % 2
    x = torch.randn(n, 2) * 0.3 + (2.0 * y - 1.0).unsqueeze(-1)
    return x, y


def test_mc_dropout_variance_positive_and_mode_restored():
    x, y = _blobs()
    net = make_mlp([2, 32, 2], dropout=0.3)
    method = MCDropout(net, "categorical", num_samples=20).fit(x, y, num_epochs=30, lr=1e-2)
    pred = method.predict(x)
    assert isinstance(pred, ClassificationPrediction) and pred.probs.shape == (20, 64, 2)
    torch.testing.assert_close(pred.probs.sum(-1), torch.ones(20, 64))
    # Different masks give different probabilities: the MC variance is strictly positive on average.
    assert pred.probs[..., 1].var(0).mean() > 1e-6
    assert (pred.mean_probs.argmax(-1) == y).float().mean() > 0.9
    assert net.training  # predict() restores the mode it found


def test_mc_dropout_regression_shapes():
    x = torch.linspace(-1, 1, 20).unsqueeze(-1)
    pred = MCDropout(make_mlp([1, 16, 2], dropout=0.2), "normal", num_samples=5).fit(
        x, x.squeeze(-1), num_epochs=2
    ).predict(x)
    assert isinstance(pred, RegressionPrediction) and pred.loc.shape == (5, 20)
    assert (pred.epistemic_variance > 0).all()


def test_mc_dropout_rejects_net_without_dropout():
    with pytest.raises(ValueError, match="dropout"):
        MCDropout(make_mlp([2, 4, 2]), "categorical")


@pytest.mark.parametrize("num_samples", [0, True, 2.0])
def test_mc_dropout_rejects_a_bad_number_of_samples(num_samples):
    with pytest.raises(ValueError, match="num_samples must be a positive integer"):
        MCDropout(make_mlp([2, 4, 2], dropout=0.1), "categorical", num_samples=num_samples)


@pytest.mark.parametrize(
    "layer", [torch.nn.Dropout(0.2), torch.nn.AlphaDropout(0.2), torch.nn.FeatureAlphaDropout(0.2)]
)
def test_every_dropout_kind_is_recognised(layer):
    """MC-dropout and the ensemble's vectorisation check share one notion of a dropout layer."""
    net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.SELU(), layer, torch.nn.Linear(4, 2))
    assert MCDropout(net, "categorical").dropout_layers == [layer]
    factory = lambda: torch.nn.Sequential(torch.nn.Linear(2, 4), type(layer)(0.2), torch.nn.Linear(4, 2))  # noqa: E731
    assert not DeepEnsemble(factory, num_members=2)._vectorizable()

