# SPDX-License-Identifier: Apache-2.0
"""Parameter names in Pyro's param store: ``name=`` of the networks and guides, two models in one process.

Pyro names a root ``PyroModule``'s parameters by its name and attribute path, one param store per process. Two
networks of the same name used to share their parameters silently (the second trained the first's ``w0``, head and
drift networks, or, for another shape, was left untrained); now each network and guide takes a ``name=``, and a
second live module of the same names raises a ``ValueError`` naming it.
"""

import pyro
import pytest
import torch
from pyro.infer import MCMC, SVI
from pyro.optim import Adam

from pyro_sdebnn.infer import NeuralSDEGuide, SamplingFree_ELBO, SamplingFreeBNN, TracePathKL_ELBO, train_svi
from pyro_sdebnn.infer.mcmc import SGLD
from pyro_sdebnn.nn import SDEBNN, MultiScaleSDEBNN, ODENet, ResNet, _param_store
from pyro_sdebnn.nn.mnvi import MNLinear, MNReLU, MNSequential

SAME_NAME = r"another live {kind} of the same name.*{kind}\(\.\.\., name='a'\)"


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 2, generator=g)
    return x, x[:, 0] - 0.5 * x[:, 1]


def _net(name="", hidden=4):
    return SDEBNN(2, 1, hidden=hidden, augment=1, dt=0.5, name=name)


def _fit(net, guide, steps=3):
    svi = SVI(net.model, guide, Adam({"lr": 0.05}), TracePathKL_ELBO())
    x, y = _data()
    return [svi.step(x, y) for _ in range(steps)]


def _values(*modules):
    return [p.detach().clone() for m in modules for p in m.parameters()]


def _bnn(name="bnn"):
    return SamplingFreeBNN(MNSequential(MNLinear(2, 4), MNReLU(), MNLinear(4, 2)), "normal", num_data=8, name=name)


def test_documented_names():
    x, y = _data()
    net = _net()
    _fit(net, NeuralSDEGuide(net, drift_hidden=4), steps=1)
    keys = set(pyro.get_param_store().keys())
    assert {k for k in keys if not k.startswith("NeuralSDEGuide.")} == {"w0", "head$$$weight", "head$$$bias",
                                                                         "obs_scale"}  # the names of earlier versions
    assert "NeuralSDEGuide.drifts$$$w_path.layers.0.weight" in keys
    pyro.clear_param_store()
    net = _net("a")
    guide = NeuralSDEGuide(net, drift_hidden=4)
    _fit(net, guide, steps=1)
    assert guide._pyro_name == "a.NeuralSDEGuide"  # under the network's name
    keys = set(pyro.get_param_store().keys())
    assert {k for k in keys if not k.startswith("a.NeuralSDEGuide.")} == {"a.w0", "a.head$$$weight",
                                                                           "a.head$$$bias", "a.obs_scale"}
    assert "a.NeuralSDEGuide.drifts$$$w_path.layers.0.weight" in keys
    assert NeuralSDEGuide(net, name="g")._pyro_name == "g"
    pyro.clear_param_store()
    for net in (ODENet(2, 1, hidden=4, dt=0.5, name="o"), ResNet(2, 1, hidden=4, blocks=2, name="o")):
        net.model(x, y)
        assert set(pyro.get_param_store().keys()) == {"o.head$$$weight", "o.head$$$bias", "o.obs_scale"}
        pyro.clear_param_store()
    multi = MultiScaleSDEBNN((1, 4, 4), 3, blocks=1, hidden=2, dt=0.5, name="m")
    multi.model(torch.randn(2, 1, 4, 4), torch.tensor([0, 2]))
    assert set(pyro.get_param_store().keys()) == {"m.w0s$$$0", "m.head$$$weight", "m.head$$$bias"}


@pytest.mark.parametrize("build", [
    lambda name: _net(name), lambda name: ODENet(2, 1, name=name), lambda name: ResNet(2, 1, blocks=2, name=name),
    lambda name: MultiScaleSDEBNN((1, 4, 4), 3, blocks=1, name=name), lambda name: NeuralSDEGuide(_net(), name=name),
    lambda name: _bnn(name),
])
def test_bad_names_are_named(build):
    with pytest.raises(TypeError, match="name must be a string"):
        build(3)
    with pytest.raises(ValueError, match=r"name must not contain '\$\$\$'"):
        build("a$$$b")


def test_two_named_networks_train_independently():
    a, b = _net("a"), _net("b")
    guide_a, guide_b = NeuralSDEGuide(a, drift_hidden=4), NeuralSDEGuide(b, drift_hidden=4)
    _fit(b, guide_b, steps=1)  # b's parameters exist in the store before a is trained
    b_before, a_before = _values(b, guide_b), _values(a, guide_a)
    train_svi(SVI(a.model, guide_a, Adam({"lr": 0.05}), TracePathKL_ELBO()), _data(), num_epochs=3)
    assert all(torch.equal(v, p) for v, p in zip(b_before, _values(b, guide_b)))  # b untouched
    assert not any(torch.equal(v, p) for v, p in zip(a_before[:1], _values(a)[:1]))  # a's w0 trained
    store = pyro.get_param_store()
    assert store["a.w0"] is a.w0 and store["b.w0"] is b.w0 and a.w0 is not b.w0
    assert next(guide_a.drifts.parameters()) is not next(guide_b.drifts.parameters())
    a_after = _values(a, guide_a)
    _fit(b, guide_b)
    assert all(torch.equal(v, p) for v, p in zip(a_after, _values(a, guide_a)))  # and a untouched by b's fit


def test_a_second_network_of_the_same_name_raises():
    x, y = _data()
    a = _net()
    guide_a = NeuralSDEGuide(a, drift_hidden=4)
    _fit(a, guide_a, steps=1)
    fitted = _values(a, guide_a)
    for other in (_net(), _net(hidden=6)):  # same shape (was shared), another shape (was left untrained)
        with pytest.raises(ValueError, match=r"'w0' for " + SAME_NAME.format(kind="SDEBNN")):
            _fit(other, NeuralSDEGuide(other, drift_hidden=4, name="other"), steps=1)
    with pytest.raises(ValueError, match=SAME_NAME.format(kind="SDEBNN")):
        other.predict(x)
    with pytest.raises(ValueError, match=SAME_NAME.format(kind="SDEBNN")):
        pyro.infer.Predictive(other.model, num_samples=2)(x)
    assert all(torch.equal(v, p) for v, p in zip(fitted, _values(a, guide_a)))
    assert pyro.get_param_store()["w0"] is a.w0
    # two guides of one name (given explicitly, for differently named networks)
    guide_c = NeuralSDEGuide(_net("c"), drift_hidden=4, name="a")
    guide_c(x)
    with pytest.raises(ValueError, match=SAME_NAME.format(kind="NeuralSDEGuide")):
        NeuralSDEGuide(_net("d"), drift_hidden=4, name="a")(x)


def test_second_ode_net_and_sampling_free_bnn_of_the_same_name_raise():
    x, y = _data()
    first, second = ODENet(2, 1, hidden=4, dt=0.5), ODENet(2, 1, hidden=4, dt=0.5)
    first(x)
    with pytest.raises(ValueError, match=SAME_NAME.format(kind="ODENet")):
        second(x)
    bnn = _bnn()
    bnn.fit(x, y, num_epochs=1)
    with pytest.raises(ValueError, match=SAME_NAME.format(kind="SamplingFreeBNN")):
        _bnn().fit(x, y, num_epochs=1)  # before: silently not trained (the optimiser saw the first's tensors)
    other = _bnn("other")
    before = _values(other)
    SVI(other.model, other.guide, Adam({"lr": 0.05}), SamplingFree_ELBO()).step(x, y)
    assert not any(torch.equal(v, p) for v, p in zip(before, _values(other)))  # all its parameters trained


def test_a_network_built_after_another_of_its_name_was_deleted_starts_from_its_fit():
    # Pyro's PyroModule behaviour: a module's tensors left in the store with no live module are adopted. The first
    # network sits in a reference cycle (alive until the next garbage collection): it does not count as live.
    a = _net("a")
    guide = NeuralSDEGuide(a, drift_hidden=4)
    _fit(a, guide)
    fitted = a.w0.detach().clone()
    a.cycle = [a]
    key = id(a)
    assert _param_store._LIVE[key]() is a
    del a, guide
    b = _net("a")
    assert not torch.equal(b.w0, fitted)
    b.model(*_data())
    assert torch.equal(b.w0, fitted) and pyro.get_param_store()["a.w0"] is b.w0
    assert key not in _param_store._LIVE or _param_store._LIVE[key]() is b  # the record of a went with it


def test_a_store_of_another_model_raises(tmp_path):
    a = _net("a")
    a.model(*_data())
    pyro.get_param_store().save(tmp_path / "store.pt")
    pyro.clear_param_store()
    pyro.get_param_store().load(tmp_path / "store.pt")
    wider = _net("a", hidden=6)
    with pytest.raises(ValueError, match=r"'a.w0' with shape \(35,\).*this module's is \(51,\).*name='a'"):
        wider.model(*_data())


def test_named_param_store_round_trip(tmp_path):
    x, _ = _data()
    nets = [_net("a"), _net("b")]
    guides = [NeuralSDEGuide(net, drift_hidden=4) for net in nets]
    for net, guide in zip(nets, guides):
        _fit(net, guide)
    expected = []
    for net, guide in zip(nets, guides):
        torch.manual_seed(3)
        expected.append(net.predict(x, guide, num_samples=2).loc)
    assert not torch.allclose(expected[0], expected[1])
    pyro.get_param_store().save(tmp_path / "store.pt")
    pyro.clear_param_store()
    torch.manual_seed(11)  # other initial weights: only the store can restore the fits
    fresh = [_net("a"), _net("b")]
    fresh_guides = [NeuralSDEGuide(net, drift_hidden=4) for net in fresh]
    pyro.get_param_store().load(tmp_path / "store.pt")
    for net, guide, want in zip(fresh, fresh_guides, expected):
        torch.manual_seed(3)
        torch.testing.assert_close(net.predict(x, guide, num_samples=2).loc, want, rtol=0, atol=0)


def _resumable(name):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    net = _net(name)
    svi = SVI(net.model, NeuralSDEGuide(net, drift_hidden=4), Adam({"lr": 0.05}), TracePathKL_ELBO())
    return svi


def test_checkpoint_of_a_named_network_resumes(tmp_path):
    data = _data()
    losses = train_svi(_resumable("a"), data, num_epochs=2, batch_size=4)
    whole = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
    train_svi(_resumable("a"), data, num_epochs=1, batch_size=4, checkpoint=tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert {"a.w0", "a.head$$$weight", "a.obs_scale"} <= set(state["params"])
    resumed = train_svi(_resumable("a"), data, num_epochs=2, batch_size=4, resume=tmp_path / "ckpt.pt")
    assert resumed == losses
    for k, v in pyro.get_param_store().items():
        assert torch.equal(v, whole[k]), k
    with pytest.raises(ValueError, match=r"checkpoint of another model.*'b\.NeuralSDEGuide.*'a\.NeuralSDEGuide.*include the name= of the "
                                         "network and guide"):
        train_svi(_resumable("b"), data, num_epochs=2, batch_size=4, resume=tmp_path / "ckpt.pt")


def test_same_seed_same_fit_whatever_the_name():
    runs = []
    for name in ("", "a"):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        net = _net(name)
        guide = NeuralSDEGuide(net, drift_hidden=4)
        runs.append((_fit(net, guide), _values(net, guide)))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(u, v) for u, v in zip(runs[0][1], runs[1][1]))


def test_sgld_over_two_named_networks():
    x, y = _data()
    nets = [_net("a"), _net("b")]
    for net in nets:
        mcmc = MCMC(SGLD(net.model, step_size=1e-4, subsample_size=4), num_samples=2, warmup_steps=1,
                    disable_progbar=True)
        mcmc.run(x, y)
        assert mcmc.get_samples()["w_path"].shape == (2, 2, net.num_weights)  # (samples, K, D)
    assert {"a.w0", "b.w0"} <= set(pyro.get_param_store().keys())
    same = _net("a")
    with pytest.raises(ValueError, match=SAME_NAME.format(kind="SDEBNN")):
        MCMC(SGLD(same.model, step_size=1e-4, subsample_size=4), num_samples=2, warmup_steps=1,
             disable_progbar=True).run(x, y)


def test_sampling_free_bnn_follows_a_loaded_param_store(tmp_path):
    x, y = _data()
    bnn = _bnn("a")
    bnn.fit(x, y, num_epochs=2, batch_size=4)
    expected = bnn.predict(x).loc
    pyro.get_param_store().save(tmp_path / "store.pt")
    pyro.clear_param_store()
    torch.manual_seed(11)  # other initial weights: only the store can restore the fit
    fresh = _bnn("a")
    assert not torch.allclose(fresh.predict(x).loc, expected)
    assert len(pyro.get_param_store()) == 0  # predict reads the store, it adds nothing to it
    pyro.get_param_store().load(tmp_path / "store.pt")
    torch.testing.assert_close(fresh.predict(x).loc, expected, rtol=0, atol=0)
    # and SVI trains the tensors the network computes with (before: its own, while the optimiser saw the store's)
    before = _values(fresh)
    SVI(fresh.model, fresh.guide, Adam({"lr": 0.05}), SamplingFree_ELBO()).step(x, y)
    assert not any(torch.equal(v, p) for v, p in zip(before, _values(fresh)))
    store = pyro.get_param_store()
    assert all(store[f"a$$${name}"] is p for name, p in fresh.net.named_parameters())


def test_sampling_free_bnn_moments_likelihood_and_kl_follow_a_loaded_param_store(tmp_path):
    # moments, expected_log_likelihood and kl_divergence read the network's own tensors before: after a load in a new
    # process they gave the untrained network's numbers while model, guide and predict gave the fit's. Each is called
    # first on a network built afresh, so that no other method has adopted the store's tensors before it.
    x, y = _data()
    bnn = _bnn("a")
    bnn.fit(x, y, num_epochs=2, batch_size=4)
    probes = {"moments": lambda b: b.moments(x).var, "kl_divergence": lambda b: b.kl_divergence(),
              "expected_log_likelihood": lambda b: b.expected_log_likelihood(x, y)}
    with torch.no_grad():
        expected = {name: probe(bnn) for name, probe in probes.items()}
    pyro.get_param_store().save(tmp_path / "store.pt")
    for name, probe in probes.items():
        pyro.clear_param_store()
        torch.manual_seed(11)  # other initial weights: only the store can restore the fit
        fresh = _bnn("a")
        with torch.no_grad():
            assert not torch.allclose(probe(fresh), expected[name])
        assert len(pyro.get_param_store()) == 0  # reading adds nothing to the store
        pyro.get_param_store().load(tmp_path / "store.pt")
        with torch.no_grad():
            torch.testing.assert_close(probe(fresh), expected[name], rtol=0, atol=0, msg=name)
        store = pyro.get_param_store()
        assert all(store[f"a$$${param}"] is p for param, p in fresh.net.named_parameters())
