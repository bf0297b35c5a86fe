# SPDX-License-Identifier: Apache-2.0
"""PyroBNN (priors, subsampling) and what every SVI baseline shares: its own param-store scope, argument checks
before ``weight_decay`` replaces the prior, and the prior scale ``weight_decay`` sets."""

import math

import pyro
import pytest
import torch

from pyro_sdebnn.infer import MAPEstimate, MeanFieldVI
from pyro_sdebnn.infer._svi_baseline import PyroBNN
from pyro_sdebnn.nn._mlp import make_mlp


def _blobs(n=64, spread=0.3):
    torch.manual_seed(0)
    y = torch.arange(n) % 2
    x = torch.randn(n, 2) * spread + (2.0 * y - 1.0).unsqueeze(-1)
    return x, y


def test_pyro_bnn_priors_and_subsampling():
    model = PyroBNN(make_mlp([2, 4, 2]), "categorical", prior_scale=0.5)
    x, y = _blobs(10)
    trace = pyro.poutine.trace(model).get_trace(x, y, subsample_size=3)
    weight = trace.nodes["net.0.weight"]
    assert weight["fn"].base_dist.scale.unique().tolist() == [0.5]
    assert weight["cond_indep_stack"] == ()  # weights are sampled outside the data plate
    obs = trace.nodes["obs"]
    # The subsampled plate rescales the likelihood by N / b.
    assert obs["value"].shape == (3,) and obs["scale"] == pytest.approx(10 / 3)
    frame = obs["cond_indep_stack"][0]
    assert frame.size == 3 and frame.full_size == 10


def test_two_svi_baselines_coexist():
    """Each baseline has its own param-store scope: fitting a second one leaves the first unchanged."""
    x, y = _blobs(16)
    first = MAPEstimate(make_mlp([2, 4, 2]), "categorical").fit(x, y, num_epochs=5)
    before = first.predict_outputs(x)
    MAPEstimate(make_mlp([2, 4, 2]), "categorical").fit(x, y, num_epochs=5)
    torch.testing.assert_close(first.predict_outputs(x), before)


def test_weight_decay_sets_prior_scale():
    x, y = _blobs(40)
    fit = MeanFieldVI(make_mlp([2, 4, 2]), "categorical").fit(x, y, num_epochs=1, weight_decay=1e-2)
    assert math.isclose(fit.model.prior_scale, 1 / math.sqrt(40 * 1e-2))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_epochs=-1), "num_epochs"),
        (dict(lr=0.0), "lr"),
        (dict(batch_size=0), "batch_size"),
        (dict(num_particles=0), "num_particles"),
        (dict(weight_decay=0.0), "weight_decay"),
    ],
)
def test_svi_bad_fit_arguments_leave_the_prior_unchanged(kwargs, match):
    """Arguments are validated before weight_decay replaces the prior."""
    x, y = _blobs(16)
    vi = MeanFieldVI(make_mlp([2, 4, 2]), "categorical", prior_scale=0.5)
    with pytest.raises(ValueError, match=match):
        vi.fit(x, y, **{"num_epochs": 1, "weight_decay": 1e-2, **kwargs})
    assert vi.model.prior_scale == 0.5
    trace = pyro.poutine.trace(vi.model).get_trace(x, y)
    assert trace.nodes["net.0.weight"]["fn"].base_dist.scale.unique().tolist() == [0.5]



def test_fit_runs_on_train_svi_callback_epochs_and_losses():
    """The epochs of every fit go through train_svi: its callback gets the epoch counted over the fits
    (``first_epoch``) and the loss per data point that ``losses`` records."""
    x, y = _blobs(20)
    seen = []
    method = MAPEstimate(make_mlp([2, 4, 2]), "categorical")
    method.fit(x, y, num_epochs=2, batch_size=8, callback=lambda epoch, loss: seen.append((epoch, loss)))
    method.fit(x, y, num_epochs=1, batch_size=8, callback=lambda epoch, loss: seen.append((epoch, loss)))
    assert seen == list(enumerate(method.losses)) and [e for e, _ in seen] == [0, 1, 2]


def test_fit_tensors_equal_train_svi_with_a_subsampling_plate():
    """On tensors the fit is train_svi with ``subsample_size``: the model's plate draws each minibatch from the
    whole data, ceil(N / b) steps an epoch, the loss the mean step loss divided by N; same seed, same bits."""
    x, y = _blobs(20)
    pyro.set_rng_seed(3)
    method = MeanFieldVI(make_mlp([2, 4, 2]), "categorical").fit(x, y, num_epochs=2, batch_size=8)
    pyro.set_rng_seed(3)
    twin = MeanFieldVI(make_mlp([2, 4, 2]), "categorical").fit(x, y, num_epochs=0, batch_size=8)  # set up alike
    steps = []
    with pyro.get_param_store().scope(twin._store_state) as after:
        svi = pyro.infer.SVI(twin.model, twin.guide, pyro.optim.Adam({"lr": 1e-2}), pyro.infer.TraceMeanField_ELBO())
        for _ in range(2 * 3):  # ceil(20 / 8) = 3 steps an epoch
            steps.append(svi.step(x, y, subsample_size=8))
    for name, value in method._store_state["params"].items():
        assert torch.equal(value, after["params"][name]), name
    assert method.losses == [sum(steps[:3]) / (3 * 20), sum(steps[3:]) / (3 * 20)]


def test_a_non_finite_step_stops_the_fit_before_the_update():
    """train_svi checks every step's loss: an infinite one raises before any parameter changes (the losses of the
    finished epochs and the last finite parameters are kept)."""
    x = torch.randn(16, 2, generator=torch.Generator().manual_seed(0))
    method = MAPEstimate(make_mlp([2, 4, 2]), "normal").fit(x, x[:, 0], num_epochs=1, batch_size=8)
    before = {name: value.detach().clone() for name, value in method._store_state["params"].items()}
    with pytest.raises(FloatingPointError, match="became inf at epoch 1, batch 0"):
        method.fit(x, torch.full((16,), 1e30), num_epochs=2, batch_size=8)  # (y - mean)^2 overflows float32
    assert len(method.losses) == 1
    for name, value in method._store_state["params"].items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("cls", [MAPEstimate, MeanFieldVI])
@pytest.mark.parametrize("likelihood,width,match", [
    ("categorical", 1, "C >= 2 logit columns"),
    ("normal", 3, "2 output columns"),
    ("normal", 1, "2 output columns"),
])
def test_wrong_output_width_raises_naming_the_network(cls, likelihood, width, match):
    """As for the other baselines: a network of the wrong output width is named, not left to Pyro's unpacking or
    support errors deep inside the trace."""
    x, y = _blobs(8)
    y = y if likelihood == "categorical" else x[:, 0]
    with pytest.raises(ValueError, match=match):
        cls(make_mlp([2, 4, width]), likelihood).fit(x, y, num_epochs=1)
