# SPDX-License-Identifier: Apache-2.0
"""Deep ensembles on small problems: members, mixture predictive, vectorised training, argument checks."""

import pytest
import torch

from pyro_sdebnn.infer import DeepEnsemble
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
