# SPDX-License-Identifier: Apache-2.0
"""What every registered baseline shares (``infer.methods``): the registry, the likelihood terms and checks, float64
throughout, and ``predict`` built from ``predict_outputs``."""

import pytest
import torch

from pyro_sdebnn.infer import MCDropout
from pyro_sdebnn.infer.methods import METHODS, negative_log_likelihood_terms
from pyro_sdebnn.nn._mlp import make_mlp


def _blobs(n=64):
    torch.manual_seed(0)
    y = torch.arange(n) % 2
    x = torch.randn(n, 2) * 0.3 + (2.0 * y - 1.0).unsqueeze(-1)
    return x, y


def test_registry_names():
    assert {"mc-dropout", "deep-ensemble"} <= set(METHODS)


def test_gaussian_nll_matches_torch_distribution():
    outputs = torch.tensor([[0.3, -0.4], [1.0, 0.7]], dtype=torch.float64)
    y = torch.tensor([0.1, -2.0], dtype=torch.float64)
    expected = -torch.distributions.Normal(outputs[:, 0], outputs[:, 1].mul(0.5).exp()).log_prob(y)
    torch.testing.assert_close(negative_log_likelihood_terms(outputs, y, "normal"), expected)


def test_bad_likelihood_and_labels():
    with pytest.raises(ValueError, match="likelihood"):
        MCDropout(make_mlp([2, 4, 2], dropout=0.1), "poisson")
    x, y = _blobs()
    with pytest.raises(TypeError, match="integer"):
        MCDropout(make_mlp([2, 4, 2], dropout=0.1)).fit(x, y.float(), num_epochs=1)
    with pytest.raises(ValueError, match="2 output columns"):
        MCDropout(make_mlp([2, 4, 3], dropout=0.1), "normal").fit(x, y.float(), num_epochs=1)


@pytest.mark.parametrize("name", ["mc-dropout", "deep-ensemble", "laplace", "map", "mfvi"])
@pytest.mark.parametrize("likelihood", ["categorical", "normal"])
def test_every_baseline_follows_float64(name, likelihood):
    """Same interface for every registered baseline; predictions keep the model's dtype."""
    torch.manual_seed(0)
    x = torch.randn(16, 2, dtype=torch.float64)
    y = torch.randint(0, 2, (16,)) if likelihood == "categorical" else torch.randn(16, dtype=torch.float64)
    net = lambda: make_mlp([2, 8, 2], dropout=0.1 if name == "mc-dropout" else 0.0, dtype=torch.float64)  # noqa: E731
    method = METHODS[name](net if name == "deep-ensemble" else net(), likelihood)
    pred = method.fit(x, y, num_epochs=2, batch_size=8).predict(x[:3])
    values = pred.probs if likelihood == "categorical" else pred.loc
    assert values.dtype == torch.float64 and values.shape[-1 if likelihood == "normal" else -2] == 3
    assert torch.isfinite(values).all()


def test_default_predict_wraps_predict_outputs():
    """BaselineMethod.predict builds the container from predict_outputs, passing its arguments on."""
    x, y = _blobs(16)
    method = MCDropout(make_mlp([2, 8, 2], dropout=0.2), "categorical", num_samples=4).fit(x, y, num_epochs=1)
    torch.manual_seed(5)
    probs = method.predict(x, 3).probs
    torch.manual_seed(5)
    torch.testing.assert_close(probs, method.predict_outputs(x, num_samples=3).softmax(-1))
    assert probs.shape == (3, 16, 2)



@pytest.mark.parametrize("bad", [2, -1])
def test_labels_out_of_range_raise_value_error(bad):
    """A label outside 0..C-1 is named with the valid range, not left as torch's gather IndexError/RuntimeError."""
    with pytest.raises(ValueError, match=r"labels must be class indices in \[0, 1\] for a network with 2 logit"):
        negative_log_likelihood_terms(torch.zeros(3, 2), torch.tensor([0, bad, 1]), "categorical")
    x, y = _blobs(8)
    y[3] = bad
    with pytest.raises(ValueError, match=r"class indices in \[0, 1\]"):
        MCDropout(make_mlp([2, 4, 2], dropout=0.1)).fit(x, y, num_epochs=1)
