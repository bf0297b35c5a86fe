# SPDX-License-Identifier: Apache-2.0
"""The fitted state in Pyro's param store: MFVI, MAP and the SDE-BNN saved in one process, restored in another.

One subprocess serves the three method families: it builds each method afresh (other initial weights), loads the
param store saved here with ``pyro.get_param_store().load(path)`` and predicts; the predictions must equal those of
the fitted methods in this process.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyro
import pytest
import torch

import pyro_sdebnn
from pyro_sdebnn.infer import MAPEstimate, MeanFieldVI, NeuralSDEGuide, TracePathKL_ELBO, train_svi
from pyro_sdebnn.nn import SDEBNN
from pyro_sdebnn.nn._mlp import make_mlp

# Builds the three methods; ``predict_all`` returns their predictions under fixed seeds. Run here and in the child.
_COMMON = textwrap.dedent("""
    import torch
    from pyro_sdebnn.infer import MAPEstimate, MeanFieldVI, NeuralSDEGuide
    from pyro_sdebnn.nn import SDEBNN
    from pyro_sdebnn.nn._mlp import make_mlp

    def build(seed):
        torch.manual_seed(seed)
        vi = MeanFieldVI(make_mlp([2, 6, 2]), "categorical")
        map_fit = MAPEstimate(make_mlp([2, 6, 2]), "normal")
        net = SDEBNN(2, 1, hidden=4, augment=1, dt=0.5)
        return vi, map_fit, net, NeuralSDEGuide(net, drift_hidden=4)

    def predict_all(vi, map_fit, net, guide, x):
        torch.manual_seed(1)
        sde = net.predict(x, guide, num_samples=3)
        return {"mfvi": vi.predict(x, num_samples=3).probs, "map": map_fit.predict(x).loc,
                "sdebnn_loc": sde.loc, "sdebnn_scale": sde.scale}
""")

_CHILD = _COMMON + textwrap.dedent("""
    import sys, pyro
    torch.set_num_threads(1)
    store, x_path, out = sys.argv[1:]
    methods = build(seed=123)  # other initial weights than the fit's: only the param store can restore it
    pyro.get_param_store().load(store)
    torch.save(predict_all(*methods, torch.load(x_path)), out)
""")


def test_param_store_round_trip_in_a_new_process(tmp_path):
    namespace: dict = {}
    exec(_COMMON, namespace)
    vi, map_fit, net, guide = namespace["build"](seed=0)
    x = torch.randn(12, 2)
    y_class, y_reg = (x[:, 0] > 0).long(), x[:, 1].clone()
    vi.fit(x, y_class, num_epochs=3, batch_size=6)
    map_fit.fit(x, y_reg, num_epochs=3, batch_size=6)
    svi = pyro.infer.SVI(net.model, guide, pyro.optim.Adam({"lr": 0.05}), TracePathKL_ELBO())
    train_svi(svi, (x, y_reg), num_epochs=3, batch_size=6)
    store = pyro.get_param_store()
    assert any(k.startswith("AutoNormal.") for k in store) and any(k.startswith("AutoDelta.") for k in store)
    assert {"w0", "head$$$weight"} <= set(store.keys())
    expected = namespace["predict_all"](vi, map_fit, net, guide, x)
    store.save(tmp_path / "store.pt")
    torch.save(x, tmp_path / "x.pt")
    root = str(Path(pyro_sdebnn.__file__).resolve().parents[1])  # the child imports this same package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "store.pt"), str(tmp_path / "x.pt"),
                    str(tmp_path / "out.pt")], check=True, env=env, timeout=120)
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, msg=f"{name} differs after the param store round trip")
    fresh = namespace["build"](seed=123)  # without the load, the same code predicts something else
    pyro.clear_param_store()
    fresh[0].fit(x, y_class, num_epochs=0)
    assert not torch.allclose(fresh[0].predict(x, num_samples=3).probs, expected["mfvi"])


def test_fresh_method_reads_the_param_store_and_a_fit_never_starts_from_another_instance():
    x, y = torch.randn(8, 2), torch.randint(0, 2, (8,))
    torch.manual_seed(0)
    first = MeanFieldVI(make_mlp([2, 4, 2]), "categorical").fit(x, y, num_epochs=2, batch_size=4)
    torch.manual_seed(1)
    second = MeanFieldVI(make_mlp([2, 4, 2]), "categorical")
    torch.manual_seed(2)
    reference = first.predict(x, num_samples=2).probs
    torch.manual_seed(2)
    torch.testing.assert_close(second.predict(x, num_samples=2).probs, reference)  # the store's fit: first's
    third = MeanFieldVI(make_mlp([2, 4, 2]), "categorical").fit(x, y, num_epochs=0)  # its own initial weights
    assert not torch.equal(third._store_state["params"]["AutoNormal.locs.net.0.weight"],
                           first._store_state["params"]["AutoNormal.locs.net.0.weight"])


def test_predict_without_fit_or_param_store_says_what_to_do():
    method = MAPEstimate(make_mlp([2, 4, 2]), "categorical")
    with pytest.raises(RuntimeError, match=r"call fit\(...\) or load\(path\).*pyro.get_param_store\(\).load"):
        method.predict(torch.randn(3, 2))


def test_sdebnn_predictive_follows_a_loaded_param_store(tmp_path):
    # the Pyro idiom without net.predict: the model and guide read the loaded tensors inside Predictive
    x = torch.randn(6, 2)
    torch.manual_seed(0)
    net = SDEBNN(2, 1, hidden=4, augment=1, dt=0.5)
    guide = NeuralSDEGuide(net, drift_hidden=4)
    guide(x)
    with torch.no_grad():
        for p in guide.parameters():
            p.add_(0.3)
    pyro.get_param_store().save(tmp_path / "store.pt")
    torch.manual_seed(1)
    expected = pyro.infer.Predictive(net.model, guide=guide, num_samples=2, return_sites=["f"])(x)["f"]
    pyro.clear_param_store()
    torch.manual_seed(5)
    net2 = SDEBNN(2, 1, hidden=4, augment=1, dt=0.5)
    guide2 = NeuralSDEGuide(net2, drift_hidden=4)
    guide2(x)  # set up before the load: the modules hold their own initial tensors
    pyro.get_param_store().load(tmp_path / "store.pt")
    torch.manual_seed(1)
    got = pyro.infer.Predictive(net2.model, guide=guide2, num_samples=2, return_sites=["f"])(x)["f"]
    torch.testing.assert_close(got, expected)


def test_ode_net_follows_a_loaded_param_store(tmp_path):
    # SVI with an AutoNormal guide over the weights "w": the head and the guide come back from the store
    from pyro.infer.autoguide import AutoNormal

    from pyro_sdebnn.nn import ODENet

    x = torch.randn(6, 2)
    y = x[:, 0].clone()
    torch.manual_seed(0)
    net = ODENet(2, 1, hidden=4, augment=1, dt=0.5)
    guide = AutoNormal(net.model)
    svi = pyro.infer.SVI(net.model, guide, pyro.optim.Adam({"lr": 0.1}), pyro.infer.Trace_ELBO())
    for _ in range(3):
        svi.step(x, y)
    assert {"head$$$weight", "obs_scale"} <= set(pyro.get_param_store().keys())
    pyro.get_param_store().save(tmp_path / "store.pt")
    torch.manual_seed(1)
    expected = net.predict(x, guide, num_samples=2)
    pyro.clear_param_store()
    torch.manual_seed(5)
    net2 = ODENet(2, 1, hidden=4, augment=1, dt=0.5)
    guide2 = AutoNormal(net2.model)
    pyro.get_param_store().load(tmp_path / "store.pt")
    guide2(x, y)  # set up as for the fit (y observed), its parameters taken from the loaded store
    torch.manual_seed(1)
    got = net2.predict(x, guide2, num_samples=2)
    torch.testing.assert_close(got.loc, expected.loc)
    torch.testing.assert_close(got.scale, expected.scale)


def _build_for_public_reads(seed):
    from pyro_sdebnn.nn import MultiScaleSDEBNN, ODENet

    torch.manual_seed(seed)
    net = SDEBNN(2, 1, hidden=4, augment=1, dt=0.5)
    return (net, NeuralSDEGuide(net, drift_hidden=4), ODENet(2, 1, hidden=4, augment=1, dt=0.5, name="ode"),
            MultiScaleSDEBNN((1, 4, 4), 3, blocks=1, hidden=2, dt=0.5, name="ms"))


def _public_reads(x, y, path):
    """The public methods that read the parameters outside the model and guide: ``(net, guide, ode, ms) -> tensor``."""
    def fused_loss(net, guide, ode, ms):
        torch.manual_seed(1)
        return net.fused_loss(x, y, guide)

    return {
        "prior": lambda net, guide, ode, ms: net.prior().init,
        "integrate": lambda net, guide, ode, ms: net.integrate(x, path),
        "likelihood_dist": lambda net, guide, ode, ms: net.likelihood_dist(net(x, path)).scale,
        "get_posterior": lambda net, guide, ode, ms: guide.get_posterior(x)["w_path"].correction(
            torch.tensor(0.0), path[0]),
        "fused_loss": fused_loss,
        "nll": lambda net, guide, ode, ms: ode.nll(x, y),
        "ode_likelihood_dist": lambda net, guide, ode, ms: ode.likelihood_dist(ode(x)).scale,
        "priors": lambda net, guide, ode, ms: ms.priors()[0].init,
    }


def test_every_public_method_of_the_networks_and_guide_follows_a_loaded_param_store(tmp_path):
    # prior, integrate, fused_loss, likelihood_dist, nll, priors and get_posterior read the modules' own tensors before:
    # after a load they gave the untrained modules' numbers, while model, guide and predict gave the fit's. Each is
    # called first on modules built afresh, so that no other method has adopted the store's tensors before it.
    from pyro.infer.autoguide import AutoNormal

    x = torch.randn(6, 2)
    y = x[:, 0].clone()
    modules = _build_for_public_reads(seed=0)
    net, guide, ode, ms = modules
    svi = pyro.infer.SVI(net.model, guide, pyro.optim.Adam({"lr": 0.1}), TracePathKL_ELBO())
    ode_svi = pyro.infer.SVI(ode.model, AutoNormal(ode.model), pyro.optim.Adam({"lr": 0.1}), pyro.infer.Trace_ELBO())
    for _ in range(3):
        svi.step(x, y)
        ode_svi.step(x, y)
    ms.model(torch.randn(2, 1, 4, 4))  # registers its w0s
    with torch.no_grad():
        for p in ms.parameters():
            p.add_(0.5)
    path = net.prior().sample()
    probes = _public_reads(x, y, path)
    with torch.no_grad():
        expected = {name: probe(*modules) for name, probe in probes.items()}
    pyro.get_param_store().save(tmp_path / "store.pt")
    for name, probe in probes.items():
        pyro.clear_param_store()
        fresh = _build_for_public_reads(seed=5)  # other initial weights: only the store can restore the fit
        fresh[1](x)  # the guide set up before the load: its drift networks hold their own initial tensors
        pyro.get_param_store().load(tmp_path / "store.pt")
        with torch.no_grad():
            torch.testing.assert_close(probe(*fresh), expected[name], msg=f"{name} does not follow the loaded store")
