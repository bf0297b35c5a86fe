# SPDX-License-Identifier: Apache-2.0
"""train_svi over loaders and tensors, streamed prediction, and checkpoints that resume bitwise."""

import math

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal, init_to_value
from torch.utils.data import DataLoader, TensorDataset

from pyro_sdebnn.infer import NeuralSDEGuide, SamplingFree_ELBO, SamplingFreeBNN, TracePathKL_ELBO, train_svi
from pyro_sdebnn.infer.checkpoint import load_checkpoint
from pyro_sdebnn.infer.svi_training import _rank_rng
from pyro_sdebnn.nn import SDEBNN, ODENet
from pyro_sdebnn.nn.mnvi import MNLinear, MNReLU, MNSequential


def _data(n=20, d=2, classes=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


def _sdebnn_svi(optim=None):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    net = SDEBNN(2, 3, hidden=4, dt=0.25, likelihood="categorical")
    guide = NeuralSDEGuide(net)
    svi = SVI(net.model, guide, optim or pyro.optim.Adam({"lr": 1e-2}), TracePathKL_ELBO())
    return net, guide, svi


def _bnn(num_data=None):
    pyro.set_rng_seed(0)
    net = MNSequential(MNLinear(2, 8), MNReLU(), MNLinear(8, 2))
    return SamplingFreeBNN(net, "normal", num_data=num_data)


def _params():
    return {k: v.detach().clone() for k, v in pyro.get_param_store().items()}


def _loader(x, y, **kwargs):
    # A loader's own generator keeps the per-epoch draw of its base seed off the global RNG, which the SDE-BNN
    # uses for its Brownian increments: then a loader and tensors in the same order give the same run.
    return DataLoader(TensorDataset(x, y), generator=torch.Generator().manual_seed(5), **kwargs)


def test_sdebnn_loader_equals_tensors():
    x, y = _data()
    _, _, svi = _sdebnn_svi()
    losses_t = train_svi(svi, (x, y), num_epochs=2, batch_size=8, shuffle=False)
    p_t = _params()
    _, _, svi = _sdebnn_svi()
    losses_l = train_svi(svi, _loader(x, y, batch_size=8), num_epochs=2)
    p_l = _params()
    assert p_t.keys() == p_l.keys()
    for k in p_t:
        torch.testing.assert_close(p_l[k], p_t[k], rtol=0, atol=1e-6)
    assert losses_l == pytest.approx(losses_t, rel=1e-6)


def test_num_data_scales_the_likelihood_like_a_subsampled_plate():
    # One full batch with num_data = 2 N is the ELBO with the log-likelihood counted twice.
    seen = []

    def model(x, y=None, num_data=None):
        seen.append(num_data)
        with pyro.plate("data", num_data, subsample=torch.arange(len(x))):
            pyro.sample("obs", pyro.distributions.Normal(torch.zeros(len(x)), 1.0), obs=y)

    x, y = torch.zeros(6, 1), torch.ones(6)
    pyro.clear_param_store()
    svi = SVI(model, lambda x, y=None, num_data=None: None, pyro.optim.Adam({"lr": 0.1}), Trace_ELBO())
    loss = train_svi(svi, _loader(x, y, batch_size=6), num_epochs=1, num_data=12)[0]
    assert seen == [12]
    assert loss == pytest.approx(12 * 0.5 * (1 + math.log(2 * math.pi)), rel=1e-6)
    seen.clear()
    train_svi(svi, _loader(x, y, batch_size=4), num_epochs=1)
    assert seen == [6, 6]  # default: len(loader.dataset)


def test_sampling_free_bnn_fit_loader_equals_tensors():
    x, _ = _data()
    y = x.sum(-1)
    pyro.clear_param_store()
    bnn = _bnn()
    pyro.set_rng_seed(3)
    losses_t = bnn.fit(x, y, num_epochs=1, batch_size=8)
    p_t = _params()
    pyro.clear_param_store()
    bnn = _bnn()
    pyro.set_rng_seed(3)
    perm = torch.randperm(x.shape[0])  # the order fit draws for tensors
    losses_l = bnn.fit(_loader(x[perm], y[perm], batch_size=8), num_epochs=1)
    assert bnn.num_data == x.shape[0]
    p_l = _params()
    for k in p_t:
        torch.testing.assert_close(p_l[k], p_t[k], rtol=0, atol=1e-6)
    assert losses_l == pytest.approx(losses_t, rel=1e-6)


def test_streamed_predictions_equal_tensor_predictions():
    x, y = _data(n=10)
    net, guide, svi = _sdebnn_svi()
    train_svi(svi, (x, y), num_epochs=1, batch_size=5)
    pyro.set_rng_seed(7)
    full = net.predict(x, guide, num_samples=3)
    after_full = torch.rand(1)
    pyro.set_rng_seed(7)
    streamed = net.predict(DataLoader(TensorDataset(x, y), batch_size=4), guide, num_samples=3)
    torch.testing.assert_close(streamed.probs, full.probs, rtol=0, atol=1e-6)
    assert torch.equal(torch.rand(1), after_full)  # the RNG ends where one call leaves it

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    ode = ODENet(2, 3, hidden=4, dt=0.25, likelihood="categorical")
    ode_guide = AutoNormal(ode.model, init_loc_fn=init_to_value(values={"w": ode.weights.detach()}))
    SVI(ode.model, ode_guide, pyro.optim.Adam({"lr": 1e-2}), TraceMeanField_ELBO()).step(x, y)
    pyro.set_rng_seed(7)
    full = ode.predict(x, ode_guide, num_samples=3)
    pyro.set_rng_seed(7)
    streamed = ode.predict(DataLoader(TensorDataset(x), batch_size=3), ode_guide, num_samples=3)
    torch.testing.assert_close(streamed.probs, full.probs, rtol=0, atol=1e-6)


def test_sampling_free_bnn_streamed_prediction():
    x, _ = _data(n=12)
    bnn = _bnn()
    full = bnn.predict(x)
    streamed = bnn.predict(DataLoader(TensorDataset(x), batch_size=5))
    torch.testing.assert_close(streamed.loc, full.loc, rtol=0, atol=1e-6)
    torch.testing.assert_close(streamed.scale, full.scale, rtol=0, atol=1e-6)
    # classification: fresh logit draws per batch, so equal in distribution; compare the means of S draws
    pyro.set_rng_seed(0)
    cat = SamplingFreeBNN(MNSequential(MNLinear(2, 8), MNReLU(), MNLinear(8, 3)), "categorical")
    s = 4000
    a = cat.predict(x, predictive="mc", num_samples=s).probs
    b = cat.predict(DataLoader(TensorDataset(x), batch_size=5), predictive="mc", num_samples=s).probs
    assert b.shape == a.shape
    se = (a.var(0) / s + b.var(0) / s).sqrt()
    assert ((a.mean(0) - b.mean(0)).abs() <= 5 * se + 1e-7).all()


@pytest.mark.parametrize("scheduler_step, expected_steps", [("epoch", 3), ("step", 9)])
def test_pyro_scheduler_is_stepped(scheduler_step, expected_steps):
    x, y = _data()
    sched = pyro.optim.ExponentialLR({"optimizer": torch.optim.SGD, "optim_args": {"lr": 1e-3}, "gamma": 0.5})
    _, _, svi = _sdebnn_svi(sched)
    train_svi(svi, (x, y), num_epochs=3, batch_size=8, scheduler_step=scheduler_step)  # 3 steps per epoch
    lrs = {s.optimizer.param_groups[0]["lr"] for s in sched.optim_objs.values()}
    assert len(sched.optim_objs) == 9 and lrs == {1e-3 * 0.5 ** expected_steps}  # powers of 2: exact


def _run_sdebnn(x, y, num_epochs, **kwargs):
    sched = pyro.optim.ExponentialLR({"optimizer": torch.optim.Adam, "optim_args": {"lr": 1e-2}, "gamma": 0.9})
    _, _, svi = _sdebnn_svi(sched)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    return train_svi(svi, loader, num_epochs=num_epochs, **kwargs)


def test_resume_is_bitwise_sdebnn(tmp_path):
    x, y = _data()
    full_losses = _run_sdebnn(x, y, 4)
    full = _params()
    path = tmp_path / "ckpt.pt"
    _run_sdebnn(x, y, 2, checkpoint=path)
    torch.rand(3)  # whatever happens in between does not matter
    resumed_losses = _run_sdebnn(x, y, 4, resume=path, checkpoint=path)
    resumed = _params()
    assert resumed_losses == full_losses
    assert full.keys() == resumed.keys()
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    assert load_checkpoint(path, "svi")["epoch"] == 4


def test_resume_is_bitwise_sampling_free_bnn_fit(tmp_path):
    x, _ = _data()
    y = x.sum(-1)
    path = tmp_path / "bnn.pt"

    def fit(num_epochs, **kwargs):
        pyro.clear_param_store()
        bnn = _bnn()
        optim = pyro.optim.MultiStepLR({"optimizer": torch.optim.Adam, "optim_args": {"lr": 1e-2},
                                        "milestones": [1, 2]})
        return bnn.fit(x, y, num_epochs=num_epochs, batch_size=8, optim=optim, **kwargs)

    full_losses = fit(3)
    full = _params()
    fit(1, checkpoint=path)
    assert fit(3, resume=path) == full_losses
    resumed = _params()
    assert all(torch.equal(full[k], resumed[k]) for k in full)


def test_checkpoint_round_trip_weights_only(tmp_path):
    x, y = _data()
    path = tmp_path / "c.pt"
    losses = _run_sdebnn(x, y, 1, checkpoint=path)
    state = torch.load(path, weights_only=True)
    assert state["format"] == "pyro_sdebnn/svi" and state["version"] == 1
    assert state["epoch"] == 1 and state["losses"] == losses
    store = pyro.get_param_store()
    assert set(state["params"]) == set(store.keys())
    assert all(torch.equal(state["params"][k], store._params[k]) for k in store.keys())
    assert set(state["optim"]) == set(store.keys())
    assert state["world_size"] == 1 and torch.equal(state["rng"][0]["torch"], torch.get_rng_state())


def _snapshot():
    return _params(), torch.get_rng_state()


def _assert_unchanged(before):
    params, rng = before
    now = _params()
    assert now.keys() == params.keys() and all(torch.equal(now[k], params[k]) for k in now)
    assert torch.equal(torch.get_rng_state(), rng)


def test_other_models_checkpoint_is_rejected_and_changes_nothing(tmp_path):
    x, y = _data()
    path = tmp_path / "bnn.pt"
    pyro.clear_param_store()
    _bnn().fit(x, x.sum(-1), num_epochs=1, batch_size=8, checkpoint=path)
    net, guide, svi = _sdebnn_svi()
    train_svi(svi, (x, y), num_epochs=1, batch_size=8)
    before = _snapshot()
    with pytest.raises(ValueError, match="another model"):
        train_svi(svi, (x, y), num_epochs=2, batch_size=8, resume=path)
    _assert_unchanged(before)
    # a fresh model (no parameter created yet) is left without parameters
    _, _, svi = _sdebnn_svi()
    with pytest.raises(ValueError, match="another model"):
        train_svi(svi, (x, y), num_epochs=2, batch_size=8, resume=path)
    assert list(pyro.get_param_store().keys()) == []


def test_resume_on_another_data_set_is_rejected_and_changes_nothing(tmp_path):
    x, _ = _data()
    y = x.sum(-1)
    path = tmp_path / "ckpt.pt"
    pyro.clear_param_store()
    svi = SVI(_regression, AutoNormal(_regression), pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    train_svi(svi, (x, y), num_epochs=1, batch_size=8, checkpoint=path)
    assert load_checkpoint(path, "svi")["num_data"] == 20
    before = _snapshot()
    with pytest.raises(ValueError, match=r"trained on a data set of N=20 points, this run's has N=16"):
        train_svi(svi, (x[:16], y[:16]), num_epochs=2, batch_size=8, resume=path)
    _assert_unchanged(before)
    train_svi(svi, (x, y), num_epochs=2, batch_size=8, resume=path)  # the same data: resumes


def test_truncated_or_foreign_file_is_rejected(tmp_path):
    x, y = _data()
    path = tmp_path / "c.pt"
    _run_sdebnn(x, y, 1, checkpoint=path)
    blob = path.read_bytes()
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(blob[: len(blob) // 2])
    _, _, svi = _sdebnn_svi()
    train_svi(svi, (x, y), num_epochs=1, batch_size=8)
    before = _snapshot()
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        train_svi(svi, (x, y), num_epochs=2, batch_size=8, resume=bad)
    foreign = tmp_path / "foreign.pt"
    torch.save({"params": {}}, foreign)
    with pytest.raises(ValueError, match="is not a checkpoint, expected format 'pyro_sdebnn/svi' version 1"):
        train_svi(svi, (x, y), num_epochs=2, batch_size=8, resume=foreign)
    baseline = tmp_path / "baseline.pt"
    torch.save({**torch.load(path, weights_only=True), "format": "pyro_sdebnn/baseline"}, baseline)
    with pytest.raises(ValueError, match="format 'pyro_sdebnn/baseline' version 1, expected format 'pyro_sdebnn/svi'"):
        train_svi(svi, (x, y), num_epochs=2, batch_size=8, resume=baseline)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        train_svi(svi, (x, y), num_epochs=2, batch_size=8, resume=tmp_path / "missing.pt")
    _assert_unchanged(before)


class _NoLength:
    def __iter__(self):
        yield torch.zeros(2, 2), torch.zeros(2, dtype=torch.long)


def test_bad_data():
    x, y = _data()
    _, _, svi = _sdebnn_svi()
    with pytest.raises(TypeError, match="dataset` with a length"):
        train_svi(svi, _NoLength(), num_epochs=1)
    # a batch is passed as model(*batch): a triple does not fit net.model(x, y=None, *, num_data=None)
    with pytest.raises(TypeError, match=r"batch 0 of the loader is a list of length 3, passed as model\(\*batch\)"):
        train_svi(svi, DataLoader(TensorDataset(x, y, y), batch_size=4), num_epochs=1)
    with pytest.raises(ValueError, match="batch_size is for tensor data"):
        train_svi(svi, _loader(x, y, batch_size=4), num_epochs=1, batch_size=4)
    with pytest.raises(ValueError, match="same, non-zero first dimension"):
        train_svi(svi, (x, y[:3]), num_epochs=1)
    with pytest.raises(TypeError, match="pair"):
        train_svi(svi, (x, y, y), num_epochs=1)
    with pytest.raises(ValueError, match="num_epochs"):
        train_svi(svi, (x, y), num_epochs=0)
    with pytest.raises(TypeError, match="num_data"):
        bnn = _bnn(num_data=20)
        train_svi(SVI(bnn.model, bnn.guide, pyro.optim.Adam({"lr": 0.1}), SamplingFree_ELBO()), (x, x.sum(-1)),
                  num_epochs=1, num_data=20)
    with pytest.raises(ValueError, match="y must be None"):
        _bnn().fit(_loader(x, y, batch_size=4), y, num_epochs=1)


def _regression(x, y=None, num_data=None):
    w = pyro.sample("w", pyro.distributions.Normal(torch.zeros(2), 1.0).to_event(1))
    with pyro.plate("data", num_data, subsample=torch.arange(len(x))):
        pyro.sample("obs", pyro.distributions.Normal(x @ w, 0.1), obs=y)


def test_nan_loss_is_a_clear_error_and_keeps_the_parameters():
    x, _ = _data()
    y = x.sum(-1)
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    svi = SVI(_regression, AutoNormal(_regression), pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    train_svi(svi, (x, y), num_epochs=1, batch_size=8)
    y_big = y.clone()
    y_big[11] = 3e38  # finite (a NaN in the data is refused before any step), but its squared residual overflows
    with pytest.raises(FloatingPointError, match="became inf at epoch 0, batch 1"):
        train_svi(svi, (x, y_big), num_epochs=1, batch_size=8, shuffle=False)
    now = _params()
    assert all(torch.isfinite(now[k]).all() for k in now)


def test_resume_is_bitwise_with_constrained_guide_parameters(tmp_path):
    # AutoNormal's scales are positive: the checkpoint holds their unconstrained values
    x, _ = _data()
    y = x.sum(-1)
    path = tmp_path / "auto.pt"

    def run(num_epochs, **kwargs):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        svi = SVI(_regression, AutoNormal(_regression), pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
        return train_svi(svi, (x, y), num_epochs=num_epochs, batch_size=8, **kwargs)

    full_losses = run(3)
    full = _params()
    run(2, checkpoint=path)
    assert run(3, resume=path) == full_losses
    resumed = _params()
    assert full.keys() == resumed.keys() and all(torch.equal(full[k], resumed[k]) for k in full)
    assert pyro.get_param_store().get_param("AutoNormal.scales.w").min() > 0


def test_checkpoint_of_an_earlier_version_resumes_and_one_of_another_world_size_is_refused(tmp_path):
    # earlier versions stored one random state (a dict) and no world_size; this one a list of one state per rank
    x, _ = _data()
    y = x.sum(-1)

    def make():
        pyro.set_rng_seed(0)
        return SVI(_regression, AutoNormal(_regression), pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())

    def run(num_epochs, **kwargs):
        pyro.clear_param_store()
        return train_svi(make(), (x, y), num_epochs=num_epochs, batch_size=8, **kwargs)

    full_losses = run(3)
    full = _params()
    run(1, checkpoint=tmp_path / "new.pt")
    state = torch.load(tmp_path / "new.pt", weights_only=True)
    earlier = {**{k: v for k, v in state.items() if k != "world_size"}, "rng": state["rng"][0]}
    torch.save(earlier, tmp_path / "earlier.pt")
    torch.rand(3)
    assert run(3, resume=tmp_path / "earlier.pt") == full_losses
    resumed = _params()
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    # under several ranks every rank restores the one state of such a file (the earlier behaviour)
    assert _rank_rng(earlier, "earlier.pt", 2, 1) is earlier["rng"]
    # the random states of a run of 2 ranks do not continue a run of 1: refused, nothing changed
    torch.save({**state, "world_size": 2, "rng": [state["rng"][0]] * 2}, tmp_path / "two.pt")
    pyro.clear_param_store()
    svi = make()
    train_svi(svi, (x, y), num_epochs=1, batch_size=8)
    before = _snapshot()
    with pytest.raises(ValueError, match=r"written by a run of 2 rank\(s\) .*, this run has 1 .*resume on 2 rank"):
        train_svi(svi, (x, y), num_epochs=3, batch_size=8, resume=tmp_path / "two.pt")
    torch.save({**state, "world_size": 3, "rng": [state["rng"][0]] * 2}, tmp_path / "inconsistent.pt")
    with pytest.raises(ValueError, match=r"not a list of one state per rank \(of world_size=3\)"):
        train_svi(svi, (x, y), num_epochs=3, batch_size=8, resume=tmp_path / "inconsistent.pt")
    _assert_unchanged(before)


def test_gradients_are_clipped_in_the_order_of_parameter_names(monkeypatch):
    # the whole-gradient norm sums the parameters in a fixed order (by name, not by memory address as a set
    # would), so that the same seed gives bitwise the same run
    import pyro_sdebnn.infer._training as training  # train_svi's step: _training.svi_update

    orders = []
    original = training.clip_gradients

    def recording(params, *args):
        store = pyro.get_param_store()
        orders.append([store.param_name(p) for p in params])
        return original(params, *args)

    monkeypatch.setattr(training, "clip_gradients", recording)
    x, y = _data()
    _, _, svi = _sdebnn_svi()
    train_svi(svi, (x, y), num_epochs=1, batch_size=8, clip_norm=0.05)
    assert len(orders) == 3 and all(order == sorted(pyro.get_param_store().keys()) for order in orders)


def test_a_loss_returning_several_numbers_is_a_clear_error():
    x, _ = _data()
    pyro.clear_param_store()
    guide = AutoNormal(_regression)

    def two_losses(model, guide, *args, **kwargs):
        return Trace_ELBO().differentiable_loss(model, guide, *args, **kwargs), torch.tensor(0.0)

    svi = SVI(_regression, guide, pyro.optim.Adam({"lr": 1e-2}), loss=two_losses)
    with pytest.raises(TypeError, match="one number, got a tuple of 2"):
        train_svi(svi, (x, x.sum(-1)), num_epochs=1, batch_size=8)


def _plate_regression(x, y=None, subsample_size=None, data_size=None):
    """A model written as Pyro's examples write it: its plate draws the minibatch (or marks ``x`` as one)."""
    w = pyro.sample("w", pyro.distributions.Normal(torch.zeros(2), 1.0).to_event(1))
    if data_size is None:
        plate = pyro.plate("data", len(x), subsample_size=subsample_size)
    else:
        plate = pyro.plate("data", data_size, subsample=torch.arange(len(x)))
    with plate as idx:
        pyro.sample("obs", pyro.distributions.Normal(x[idx] @ w, 0.1), obs=None if y is None else y[idx])


def _plate_svi():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    return SVI(_plate_regression, AutoNormal(_plate_regression), pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())


def test_subsample_size_lets_the_models_plate_draw_the_minibatches():
    """``subsample_size=b``: ceil(N / b) steps an epoch on the whole data, as ``svi.step(x, y, subsample_size=b)``
    in a plain loop; ``loss_per_datum``: the mean step loss over N."""
    x, _ = _data()
    y = x @ torch.tensor([1.0, -2.0])
    svi = _plate_svi()
    steps = [svi.step(x, y, subsample_size=8) for _ in range(2 * 3)]
    expected = _params()
    losses = train_svi(_plate_svi(), (x, y), num_epochs=2, subsample_size=8, loss_per_datum=True)
    assert all(torch.equal(v, expected[k]) for k, v in _params().items())
    assert losses == [sum(steps[:3]) / (3 * 20), sum(steps[3:]) / (3 * 20)]
    unweighted = train_svi(_plate_svi(), (x, y), num_epochs=1, subsample_size=8)  # each step weighs b
    assert unweighted[0] == pytest.approx(sum(steps[:3]) / 3, rel=1e-12)


def test_model_kwargs_and_first_epoch_continue_a_run():
    """``model_kwargs`` reach the model at every step; ``first_epoch`` counts the epochs on from an earlier call
    (kl_schedule, callback), and two calls equal one."""
    x, _ = _data()
    y = x @ torch.tensor([1.0, -2.0])
    loader = lambda: _loader(x, y, batch_size=8, shuffle=True)  # noqa: E731
    svi = _plate_svi()
    one = train_svi(svi, loader(), num_epochs=3, model_kwargs={"data_size": 20}, loss_per_datum=True)
    expected = _params()
    svi = _plate_svi()
    data, seen = loader(), []
    two = train_svi(svi, data, num_epochs=1, model_kwargs={"data_size": 20}, loss_per_datum=True)
    two += train_svi(svi, data, num_epochs=3, first_epoch=1, model_kwargs={"data_size": 20}, loss_per_datum=True,
                     callback=lambda epoch, loss: seen.append(epoch))
    assert two == one and seen == [1, 2]
    assert all(torch.equal(v, expected[k]) for k, v in _params().items())


def test_bad_subsampling_arguments():
    x, _ = _data()
    y = x.sum(-1)
    svi = _plate_svi()
    with pytest.raises(ValueError, match="either batch_size"):
        train_svi(svi, (x, y), num_epochs=1, batch_size=4, subsample_size=4)
    with pytest.raises(ValueError, match="subsample_size is for tensor data"):
        train_svi(svi, _loader(x, y, batch_size=4), num_epochs=1, subsample_size=4)
    with pytest.raises(ValueError, match=r"subsample_size must be an int in \[1, 20\]"):
        train_svi(svi, (x, y), num_epochs=1, subsample_size=21)
    with pytest.raises(ValueError, match="model_kwargs must not set"):
        train_svi(svi, (x, y), num_epochs=1, subsample_size=4, model_kwargs={"subsample_size": 2})
    with pytest.raises(TypeError, match="model_kwargs must be a dict"):
        train_svi(svi, (x, y), num_epochs=1, model_kwargs=[("data_size", 20)])
    with pytest.raises(ValueError, match="first_epoch must be"):
        train_svi(svi, (x, y), num_epochs=2, first_epoch=2)
    with pytest.raises(ValueError, match="either first_epoch or resume"):
        train_svi(svi, (x, y), num_epochs=2, first_epoch=1, resume="unused.pt")
