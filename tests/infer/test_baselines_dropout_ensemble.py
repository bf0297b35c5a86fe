# SPDX-License-Identifier: Apache-2.0
"""MC-dropout, deep ensembles and the shared training loop on small problems."""

import pytest
import torch

from pyro_sdebnn.infer import ClassificationPrediction, DeepEnsemble, MCDropout, RegressionPrediction
from pyro_sdebnn.infer.map_training import train_network
from pyro_sdebnn.infer.methods import METHODS, negative_log_likelihood_terms
from pyro_sdebnn.nn._mlp import make_mlp


@pytest.fixture(autouse=True)
def _one_thread():
    """These networks are tiny: one intra-op thread avoids oversubscribing the shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


def test_bad_likelihood_and_labels():
    with pytest.raises(ValueError, match="likelihood"):
        MCDropout(make_mlp([2, 4, 2], dropout=0.1), "poisson")
    x, y = _blobs()
    with pytest.raises(TypeError, match="integer"):
        MCDropout(make_mlp([2, 4, 2], dropout=0.1)).fit(x, y.float(), num_epochs=1)
    with pytest.raises(ValueError, match="2 output columns"):
        MCDropout(make_mlp([2, 4, 3], dropout=0.1), "normal").fit(x, y.float(), num_epochs=1)


def test_deep_ensemble_members_differ_and_mixture():
    x, y = _blobs()
    ens = DeepEnsemble(lambda: make_mlp([2, 16, 2]), "categorical", num_members=3).fit(x, y, num_epochs=20)
    w = [m[0].weight for m in ens.members]
    assert not torch.allclose(w[0], w[1]) and not torch.allclose(w[1], w[2])
    x_far = torch.tensor([[8.0, -8.0], [-8.0, 8.0]])
    probs = ens.predict(x_far).probs
    assert probs.shape == (3, 2, 2)
    # Members disagree somewhere far from the data (independent initialisations).
    assert probs[..., 1].var(0).max() > 1e-6
    torch.testing.assert_close(ens.predict(x).mean_probs, ens.predict_outputs(x).softmax(-1).mean(0))
    total, aleatoric, epistemic = ens.uncertainty(torch.cat([x, x_far]))
    torch.testing.assert_close(total, aleatoric + epistemic)
    assert (epistemic >= -1e-6).all()
    # Mutual information is larger where the members disagree (far away) than on the training data.
    assert epistemic[-2:].max() > epistemic[:-2].mean()


def test_deep_ensemble_regression_decomposition():
    torch.manual_seed(1)
    x = torch.linspace(-2, 2, 40).unsqueeze(-1)
    y = torch.sin(2 * x.squeeze(-1)) + 0.1 * torch.randn(40)
    pred = DeepEnsemble(lambda: make_mlp([1, 16, 2], "tanh"), "normal", num_members=4).fit(
        x, y, num_epochs=50
    ).predict(torch.tensor([[0.0], [6.0]]))
    torch.testing.assert_close(pred.variance, pred.aleatoric_variance + pred.epistemic_variance)
    assert pred.epistemic_variance[1] > pred.epistemic_variance[0]  # spread grows away from the data


def test_deep_ensemble_rejects_module():
    with pytest.raises(TypeError, match="factory"):
        DeepEnsemble(make_mlp([2, 4, 2]))


def test_training_detects_nan():
    x, y = _blobs()
    net = make_mlp([2, 4, 2])
    with torch.no_grad():
        net[0].weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="loss"):
        train_network(net, x, y, "categorical", num_epochs=1)


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


def test_vectorised_ensemble_training_equals_member_by_member():
    """Full-batch Adam is deterministic and elementwise: training all members at once with vmap gives the
    same weights as training them one after the other (float64, round-off only)."""
    torch.manual_seed(0)
    x, y = torch.randn(24, 2, dtype=torch.float64), torch.randint(0, 2, (24,))
    factory = lambda: make_mlp([2, 6, 2], "tanh", dtype=torch.float64)  # noqa: E731
    torch.manual_seed(1)
    looped = DeepEnsemble(factory, "categorical", num_members=3)
    torch.manual_seed(1)
    vectorised = DeepEnsemble(factory, "categorical", num_members=3)
    looped.fit(x, y, num_epochs=25, batch_size=None, vectorize=False)
    vectorised.fit(x, y, num_epochs=25, batch_size=None, vectorize=True)
    for a, b in zip(looped.members.parameters(), vectorised.members.parameters()):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_vectorise_refused_for_dropout_members():
    with pytest.raises(ValueError, match="vectorize"):
        DeepEnsemble(lambda: make_mlp([2, 4, 2], dropout=0.1), num_members=2).fit(
            torch.zeros(4, 2), torch.zeros(4, dtype=torch.long), num_epochs=1, vectorize=True
        )


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lr=0.0), "lr"),
        (dict(lr=float("nan")), "lr"),
        (dict(weight_decay=-1e-3), "weight_decay"),
        (dict(num_epochs=-1), "num_epochs"),
        (dict(num_epochs=2.0), "num_epochs"),
        (dict(batch_size=0), "batch_size"),
    ],
)
def test_ensemble_fit_arguments_checked_on_both_paths(vectorize, kwargs, match):
    """The vectorised path validates exactly like train_network (lr=0 used to train nothing there)."""
    ens = DeepEnsemble(lambda: make_mlp([2, 4, 2]), "categorical", num_members=2)
    before = [p.clone() for p in ens.members.parameters()]
    x, y = _blobs(8)
    with pytest.raises(ValueError, match=match):
        ens.fit(x, y, vectorize=vectorize, **{"num_epochs": 1, **kwargs})
    assert all(torch.equal(a, b) for a, b in zip(before, ens.members.parameters()))


@pytest.mark.parametrize(
    "layer", [torch.nn.Dropout(0.2), torch.nn.AlphaDropout(0.2), torch.nn.FeatureAlphaDropout(0.2)]
)
def test_every_dropout_kind_is_recognised(layer):
    """MC-dropout and the ensemble's vectorisation check share one notion of a dropout layer."""
    net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.SELU(), layer, torch.nn.Linear(4, 2))
    assert MCDropout(net, "categorical").dropout_layers == [layer]
    factory = lambda: torch.nn.Sequential(torch.nn.Linear(2, 4), type(layer)(0.2), torch.nn.Linear(4, 2))  # noqa: E731
    assert not DeepEnsemble(factory, num_members=2)._vectorizable()


def test_default_predict_wraps_predict_outputs():
    """BaselineMethod.predict builds the container from predict_outputs, passing its arguments on."""
    x, y = _blobs(16)
    method = MCDropout(make_mlp([2, 8, 2], dropout=0.2), "categorical", num_samples=4).fit(x, y, num_epochs=1)
    torch.manual_seed(5)
    probs = method.predict(x, 3).probs
    torch.manual_seed(5)
    torch.testing.assert_close(probs, method.predict_outputs(x, num_samples=3).softmax(-1))
    assert probs.shape == (3, 16, 2)


@pytest.mark.parametrize("num_components", [1, 4])
def test_regression_prediction_epistemic_variance_is_population_variance(num_components):
    """Var_s[mu_s] with divisor S (0 for a single component), float64 round-off only."""
    loc = torch.randn(num_components, 5, dtype=torch.float64)
    pred = RegressionPrediction(loc, torch.ones_like(loc))
    expected = (loc - loc.mean(0)).pow(2).mean(0)
    torch.testing.assert_close(pred.epistemic_variance, expected, atol=1e-15, rtol=1e-12)
    torch.testing.assert_close(pred.variance, 1 + expected)
