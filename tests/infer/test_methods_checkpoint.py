# SPDX-License-Identifier: Apache-2.0
"""Checkpoints of the baselines: round trip, bitwise resume, and clear errors for the wrong file."""

import pyro
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pyro_sdebnn.infer import DeepEnsemble, Laplace, MAPEstimate, MCDropout, MeanFieldVI
from pyro_sdebnn.nn._mlp import make_mlp

N, BATCH = 20, 5
NAMES = ["map", "mfvi", "mc-dropout", "ensemble", "ensemble-dropout", "laplace", "laplace-kron"]


def _data(likelihood="categorical"):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, generator=gen)
    y = (x[:, 0] > 0).long() if likelihood == "categorical" else x[:, 0] + 0.1 * torch.randn(N, generator=gen)
    return x, y


def _build(name, likelihood="categorical", hidden=8, init_seed=42):
    torch.manual_seed(init_seed)
    sizes = [2, hidden, 2]
    if name == "map":
        return MAPEstimate(make_mlp(sizes), likelihood)
    if name == "mfvi":
        return MeanFieldVI(make_mlp(sizes), likelihood)
    if name == "mc-dropout":
        return MCDropout(make_mlp(sizes, dropout=0.2), likelihood, num_samples=4)
    if name == "ensemble":
        return DeepEnsemble(lambda: make_mlp(sizes), likelihood, num_members=2)
    if name == "ensemble-dropout":
        return DeepEnsemble(lambda: make_mlp(sizes, dropout=0.1), likelihood, num_members=2)
    if name.startswith("laplace"):
        return Laplace(make_mlp(sizes), likelihood, hessian_structure=name.partition("-")[2] or "full")
    raise KeyError(name)


def _weights(method):
    if isinstance(method, (MAPEstimate, MeanFieldVI)):
        return {k: v.detach().clone() for k, v in method._store_state["params"].items()}
    if isinstance(method, DeepEnsemble):
        return {f"{k}.{n}": p.detach().clone() for k, m in enumerate(method.members) for n, p in m.named_parameters()}
    return {n: p.detach().clone() for n, p in method.net.named_parameters()}


def _predict(method, x):
    torch.manual_seed(5)
    pred = method.predict(x)
    return pred.probs if hasattr(pred, "probs") else torch.stack([pred.loc, pred.scale])


def _fit(method, data, **kwargs):
    x, y = data
    if isinstance(x, DataLoader):
        return method.fit(x, lr=0.05, **kwargs)
    return method.fit(x, y, lr=0.05, batch_size=BATCH, **kwargs)


@pytest.mark.parametrize("likelihood", ["categorical", "normal"])
@pytest.mark.parametrize("name", NAMES)
def test_round_trip_in_a_fresh_object(name, likelihood, tmp_path):
    x, y = _data(likelihood)
    method = _fit(_build(name, likelihood), (x, y), num_epochs=2)
    path = tmp_path / "ckpt.pt"
    method.save(path)
    raw = torch.load(path, weights_only=True)  # plain tensors and containers only
    assert raw["method"] == type(method).__name__ and raw["epoch"] == 2 and len(raw["losses"]) == 2
    fresh = _build(name, likelihood, init_seed=123).load(path)
    assert fresh.losses == method.losses and fresh.epoch == 2
    for key, value in _weights(method).items():
        assert torch.equal(_weights(fresh)[key], value), key
    torch.testing.assert_close(_predict(fresh, x), _predict(method, x), rtol=0, atol=0)
    if isinstance(method, Laplace):
        assert fresh.prior_precision == method.prior_precision
        torch.testing.assert_close(fresh.log_marginal_likelihood(), method.log_marginal_likelihood(), rtol=0, atol=0)
    state = method.state_dict()
    assert _build(name, likelihood, init_seed=7).load_state_dict(state).epoch == 2


def _shuffled_loader(x, y, own_generator):
    gen = torch.Generator().manual_seed(3) if own_generator else None
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, generator=gen)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("source", ["tensors", "shuffled-loader", "loader-with-generator"])
def test_resume_is_bitwise_equal_to_an_uninterrupted_run(name, source, tmp_path):
    x, y = _data()

    def data():
        if source == "tensors":
            return x, y
        return _shuffled_loader(x, y, source == "loader-with-generator"), None

    schedulers = {
        "mc-dropout": lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, [1, 3], 0.5),  # state with a Counter
        "laplace": lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, 0.5),
    }
    extra = {"scheduler": schedulers[name]} if name in schedulers else {}
    pyro.set_rng_seed(0)
    uninterrupted = _fit(_build(name), data(), num_epochs=4, **extra)

    pyro.set_rng_seed(0)
    first = _fit(_build(name), data(), num_epochs=2, **extra)
    first.save(tmp_path / "ckpt.pt")
    del first
    pyro.set_rng_seed(999)  # a new process: anything may have happened to the random state
    torch.randn(10)
    resumed = _build(name, init_seed=5).load(tmp_path / "ckpt.pt")
    _fit(resumed, data(), num_epochs=2, resume=True, **extra)

    assert resumed.losses == uninterrupted.losses and resumed.epoch == 4
    expected = _weights(uninterrupted)
    for key, value in _weights(resumed).items():
        assert torch.equal(value, expected[key]), key
    if name.startswith("laplace"):
        assert resumed.prior_precision == uninterrupted.prior_precision


def test_resume_in_the_same_object_and_a_pyro_scheduler(tmp_path):
    x, y = _data()

    def optim():
        return pyro.optim.MultiStepLR(
            {"optimizer": torch.optim.Adam, "optim_args": {"lr": 0.1}, "milestones": [2], "gamma": 0.1}
        )

    pyro.set_rng_seed(0)
    uninterrupted = _build("mfvi").fit(x, y, num_epochs=3, batch_size=BATCH, optim=optim())
    pyro.set_rng_seed(0)
    method = _build("mfvi").fit(x, y, num_epochs=1, batch_size=BATCH, optim=optim())
    state = method.state_dict()
    torch.randn(3)  # e.g. a prediction in between
    method.fit(x, y, num_epochs=2, batch_size=BATCH, optim=optim(), resume=True)
    assert method.losses == uninterrupted.losses
    for key, value in _weights(method).items():
        assert torch.equal(value, _weights(uninterrupted)[key]), key
    # The same through a file: the scheduler's state (milestones in a Counter) is read with weights_only=True.
    torch.save(state, tmp_path / "ckpt.pt")
    loaded = _build("mfvi", init_seed=1).load(tmp_path / "ckpt.pt")
    loaded.fit(x, y, num_epochs=2, batch_size=BATCH, optim=optim(), resume=True)
    assert loaded.losses == uninterrupted.losses
    # Without resume a new fit starts a fresh optimiser: the result differs.
    pyro.set_rng_seed(0)
    restarted = _build("mfvi").fit(x, y, num_epochs=1, batch_size=BATCH, optim=optim())
    restarted.fit(x, y, num_epochs=2, batch_size=BATCH, optim=optim())
    assert any(not torch.equal(v, _weights(uninterrupted)[k]) for k, v in _weights(restarted).items())


def test_resume_without_a_run_is_an_error():
    x, y = _data()
    with pytest.raises(ValueError, match="resume=True continues an interrupted run"):
        _build("mc-dropout").fit(x, y, num_epochs=1, resume=True)
    with pytest.raises(TypeError, match="resume must be True or False"):
        _build("mc-dropout").fit(x, y, num_epochs=1, resume="yes")


@pytest.mark.parametrize("name", NAMES)
def test_wrong_or_broken_checkpoints_raise_and_change_nothing(name, tmp_path):
    x, y = _data()
    method = _fit(_build(name), (x, y), num_epochs=1)
    before, losses = _weights(method), list(method.losses)
    prediction = _predict(method, x)

    other_class = "map" if name != "map" else "mfvi"
    _fit(_build(other_class), (x, y), num_epochs=1).save(tmp_path / "other_class.pt")
    _fit(_build(name, hidden=5), (x, y), num_epochs=1).save(tmp_path / "other_shape.pt")
    _fit(_build(name, likelihood="normal"), _data("normal"), num_epochs=1).save(tmp_path / "other_lik.pt")
    good = tmp_path / "good.pt"
    _fit(_build(name), (x, y), num_epochs=2).save(good)
    data = good.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    torch.save({**torch.load(good, weights_only=True), "version": 2}, tmp_path / "other_version.pt")

    cases = {
        "other_class.pt": "not of a",
        "other_shape.pt": "has shape|do not match|does not fit",
        "other_lik.pt": "likelihood",
        "truncated.pt": "not a readable checkpoint",
        "garbage.pt": "not a readable checkpoint",
        "foreign.pt": "is not a checkpoint, expected format 'pyro_sdebnn/baseline' version 1",
        "other_version.pt": "version 2, expected format 'pyro_sdebnn/baseline' version 1",
    }
    for filename, message in cases.items():
        with pytest.raises(ValueError, match=message):
            method.load(tmp_path / filename)
        assert method.losses == losses, filename
        for key, value in _weights(method).items():
            assert torch.equal(value, before[key]), (filename, key)
    torch.testing.assert_close(_predict(method, x), prediction, rtol=0, atol=0)
    with pytest.raises(FileNotFoundError):
        method.load(tmp_path / "missing.pt")


def test_checkpoint_of_another_network_structure():
    x, y = _data()
    deeper = MAPEstimate(make_mlp([2, 8, 8, 2]), "categorical").fit(x, y, num_epochs=1)
    with pytest.raises(ValueError, match="do not match this model: missing"):
        _build("map").load_state_dict(deeper.state_dict())
    bigger = DeepEnsemble(lambda: make_mlp([2, 8, 2]), "categorical", num_members=3).fit(x, y, num_epochs=1)
    with pytest.raises(ValueError, match="3 ensemble members, this ensemble 2"):
        _build("ensemble").load_state_dict(bigger.state_dict())
    diag = Laplace(make_mlp([2, 8, 2]), "categorical", hessian_structure="diag").fit(x, y, num_epochs=1)
    with pytest.raises(ValueError, match="hessian_structure"):
        _build("laplace").load_state_dict(diag.state_dict())


def test_random_states_of_every_rank_resume_only_on_as_many_ranks():
    x, y = _data()
    pyro.set_rng_seed(0)
    uninterrupted = _fit(_build("mc-dropout"), (x, y), num_epochs=2)
    pyro.set_rng_seed(0)
    state = _fit(_build("mc-dropout"), (x, y), num_epochs=1).state_dict()
    assert state["training"]["world_size"] == 1 and len(state["training"]["rng"]) == 1
    # a checkpoint of a 2-rank data-parallel fit holds 2 random states: resuming on one process is an error
    two = {**state, "training": {**state["training"], "rng": state["training"]["rng"] * 2, "world_size": 2}}
    method = _build("mc-dropout").load_state_dict(two)
    with pytest.raises(ValueError, match="the last fit ran on 2 data-parallel rank.*this fit runs on 1"):
        _fit(method, (x, y), num_epochs=1, resume=True)
    bad = {**state, "training": {**state["training"], "world_size": 3}}
    with pytest.raises(ValueError, match="training state is malformed"):
        _build("mc-dropout").load_state_dict(bad)
    # the training state of an earlier version (one random state, a dict) still resumes
    old = {**state, "training": {k: v for k, v in state["training"].items() if k != "world_size"}}
    old["training"]["rng"] = state["training"]["rng"][0]
    resumed = _fit(_build("mc-dropout").load_state_dict(old), (x, y), num_epochs=1, resume=True)
    assert resumed.losses == uninterrupted.losses


class _InterruptingLoader:
    """A loader whose iteration raises ``KeyboardInterrupt`` (Ctrl-C) at its second batch."""

    def __init__(self, loader):
        self.loader, self.dataset = loader, loader.dataset

    def __iter__(self):
        for i, batch in enumerate(self.loader):
            if i == 1:
                raise KeyboardInterrupt
            yield batch


@pytest.mark.parametrize("name", ["map", "mfvi", "mc-dropout", "ensemble", "laplace"])
def test_resume_after_an_interrupted_fit_is_refused(name):
    # the interrupted fit moved the parameters but kept the training state of the fit before: resume=True went on
    # silently from that mismatch (other numbers than the uninterrupted run)
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    method = _fit(_build(name), (loader, None), num_epochs=1)
    with pytest.raises(KeyboardInterrupt):
        _fit(method, (_InterruptingLoader(loader), None), num_epochs=1)
    with pytest.raises(ValueError, match="the last fit did not finish"):
        _fit(method, (loader, None), num_epochs=1, resume=True)
    state = method.state_dict()
    assert state["training"] is None  # not the training state of these parameters
    with pytest.raises(ValueError, match="call fit.* or load"):
        _fit(_build(name).load_state_dict(state), (loader, None), num_epochs=1, resume=True)
    _fit(method, (loader, None), num_epochs=1)  # a new fit finishes: it can be resumed again
    _fit(method, (loader, None), num_epochs=1, resume=True)
    assert method.state_dict()["training"] is not None
