# SPDX-License-Identifier: Apache-2.0
"""SDEBNN: the user-facing API, likelihoods, fused solve, bad input, toy and digits smoke tests."""

import pyro
from pyro import poutine
import pytest
import torch
from pyro.infer import SVI, Predictive
from pyro.infer.autoguide import AutoMultivariateNormal, AutoNormal
from pyro.optim import Adam

from pyro_sdebnn.infer import ClassificationPrediction, NeuralSDEGuide, RegressionPrediction, TracePathKL_ELBO
from pyro_sdebnn.nn import SDEBNN, MultiScaleSDEBNN, ODENet
from pyro_sdebnn.nn.continuous_depth import LIKELIHOODS


def _data(n=20):
    x = torch.linspace(-1, 1, n).unsqueeze(-1)
    return x, torch.sin(3 * x).squeeze(-1)


def test_plain_user_code_trains_and_predicts():
    x, y = _data()
    net = SDEBNN(in_dim=1, out_dim=1, hidden=32, augment=2, sigma=0.2, t_span=(0.0, 1.0), dt=0.05)
    guide = NeuralSDEGuide(net, drift_hidden=64)
    svi = SVI(net.model, guide, Adam({"lr": 1e-3}), loss=TracePathKL_ELBO(estimator="stl"))
    losses = [svi.step(x, y) for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
    parallel = Predictive(net.model, guide=guide, num_samples=7, parallel=True, return_sites=["obs", "f"])(x[:5])
    assert parallel["obs"].shape == (7, 5) and parallel["f"].shape == (7, 5, 1)
    pred = Predictive(net.model, guide=guide, num_samples=7)(x[:5])
    assert pred["obs"].shape == (7, 5) and pred["f"].shape == (7, 5, 1)
    assert pred["w_path"].shape[-2:] == (20, net.num_weights)
    names = set(pyro.get_param_store().keys())
    assert {"w0", "obs_scale", "head$$$weight"} <= names and any("drifts" in n for n in names)


def test_shapes_vector_and_image():
    net = SDEBNN(3, 2, hidden=8, augment=1, dt=0.25)
    assert net.num_weights == (4 + 1) * 8 + 8 + 8 * 4 + 4
    path = net.prior().sample((5,))
    assert net(torch.randn(7, 3), path).shape == (5, 7, 2)
    img = SDEBNN((1, 8, 8), 10, hidden=4, augment=1, dt=0.5, likelihood="categorical", name="img")  # a second net
    path = img.prior().sample((3,))
    assert img(torch.randn(6, 1, 8, 8), path).shape == (3, 6, 10)
    assert img(torch.randn(6, 1, 8, 8), path[0]).shape == (6, 10)


@pytest.mark.parametrize("likelihood", LIKELIHOODS)
def test_likelihoods_train_step(likelihood):
    x, y = _data()
    out_dim = 3 if likelihood == "categorical" else 1
    if likelihood == "categorical":
        y = (x.squeeze(-1) > 0).long() + (x.squeeze(-1) > 0.5).long()
    net = SDEBNN(1, out_dim, hidden=8, augment=1, dt=0.25, likelihood=likelihood)
    guide = NeuralSDEGuide(net, drift_hidden=8)
    svi = SVI(net.model, guide, Adam({"lr": 1e-2}), TracePathKL_ELBO())
    assert torch.isfinite(torch.tensor(svi.step(x, y)))
    pred = net.predict(x, guide, num_samples=4)
    expected = ClassificationPrediction if likelihood == "categorical" else RegressionPrediction
    assert isinstance(pred, expected)


def _net_and_guide(n=20, hidden=8, augment=2, dt=0.1, drift_hidden=8):
    """A float64 SDEBNN with a set-up guide whose drift is not zero (so that every drift parameter gets a gradient)."""
    x, y = _data(n)
    x, y = x.double(), y.double()
    net = SDEBNN(1, 1, hidden=hidden, augment=augment, dt=dt).double()
    guide = NeuralSDEGuide(net, drift_hidden=drift_hidden)
    guide(x, y)
    with torch.no_grad():
        for p in guide.drifts["w_path"].out.parameters():
            p.normal_(0, 0.1)
    return x, y, net, guide


@pytest.mark.parametrize("num_samples", [1, 3])  # 3: vectorised particles (the likelihood counted once per particle)
@pytest.mark.parametrize("kl_scale", [1.0, 0.5])
@pytest.mark.parametrize("estimator", ["analytic", "full_mc", "stl"])
def test_fused_loss_equals_pyro_elbo(estimator, kl_scale, num_samples):
    # same random stream -> same Brownian increments (S > 1: vectorised particles draw one (S, K, D) tensor, as
    # the fused solve does); the fused one-pass solve and the Pyro path agree in value and in gradient w.r.t. the
    # network and drift parameters (for stl the value equals full_mc's: only the gradient sees the detach).
    # float64; the two differ only in summation order, hence rtol 1e-10.
    x, y, net, guide = _net_and_guide()
    params = list(net.parameters()) + list(guide.drifts.parameters())
    elbo = TracePathKL_ELBO(num_particles=num_samples, vectorize_particles=num_samples > 1, max_plate_nesting=1,
                            estimator=estimator, kl_scale=kl_scale)
    pyro.set_rng_seed(11)
    pyro_loss = elbo.differentiable_loss(net.model, guide, x, y, num_data=50)
    pyro_grads = torch.autograd.grad(pyro_loss, params)
    pyro.set_rng_seed(11)
    fused = net.fused_loss(x, y, guide, num_samples=num_samples, estimator=estimator, num_data=50, kl_scale=kl_scale)
    fused_grads = torch.autograd.grad(fused, params)
    assert torch.allclose(fused, pyro_loss, rtol=1e-10, atol=0)
    for p, g_pyro, g_fused in zip(params, pyro_grads, fused_grads):
        assert g_pyro.abs().max() > 0
        assert torch.allclose(g_fused, g_pyro, rtol=1e-10, atol=1e-12 * g_pyro.abs().max()), p.shape


def _torchsde_gradients(dt, seed):
    """Gradients of fused_loss w.r.t. w0 and the drift: torchsde backprop vs stochastic adjoint, same Brownian path."""
    x, y, net, guide = _net_and_guide(n=8, hidden=4, augment=1, dt=dt, drift_hidden=4)
    params = [net.w0] + list(guide.drifts.parameters())
    out = {}
    # Milstein equals Euler for the additive noise [sigma I; 0; 0]: exact backprop through torchsde's Euler solve
    for method, adjoint in (("milstein", False), ("euler", True)):
        pyro.set_rng_seed(seed)  # the BrownianInterval draws its entropy from numpy: same path in both solves
        loss = net.fused_loss(x, y, guide, estimator="analytic", method=method, adjoint=adjoint, num_samples=2, dt=dt)
        grads = torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True)  # cut: zeros
        out[adjoint] = loss.detach(), grads[0], torch.cat([g.reshape(-1) for g in grads[1:]])
    return out[False], out[True]


def test_fused_loss_torchsde_adjoint_gradients_match_backprop():
    # the stochastic adjoint solves a discretised backward SDE: its gradient differs from the exact gradient of
    # the forward Euler solve by O(dt). Measured relative gaps (w0 | drift) over 3 seeds: 2.5-21 % | 3.9-5.7 % at
    # dt = 0.05 and 0.7-4.6 % | 0.7-1.3 % at dt = 0.01. Tolerance: 10 % at dt = 0.01, and the gap must shrink.
    seed = int(torch.randint(0, 2 ** 31 - 1, ()))
    gaps = {}
    for dt in (0.05, 0.01):
        (loss_bp, w0_bp, drift_bp), (loss_adj, w0_adj, drift_adj) = _torchsde_gradients(dt, seed)
        assert torch.allclose(loss_adj, loss_bp, rtol=1e-10, atol=0)  # same Brownian path, same forward solve
        assert all(g.abs().max() > 0 for g in (w0_bp, drift_bp, w0_adj, drift_adj))
        gaps[dt] = [((adj - bp).norm() / bp.norm()).item() for adj, bp in ((w0_adj, w0_bp), (drift_adj, drift_bp))]
    for fine, coarse in zip(gaps[0.01], gaps[0.05]):
        assert fine < 0.1
        assert fine < coarse


def test_fused_loss_adjoint_default_step_is_accurate():
    # fused_loss(adjoint=True) solves with dt = min(net.dt, ADJOINT_DT) = 0.01, where the adjoint gradient is within
    # a few percent of the exact gradient of the same discretised solve (the gap is O(dt)): tolerance 5 %
    from pyro_sdebnn.ops.sde_solve import ADJOINT_DT

    x, y, net, guide = _net_and_guide(n=8, hidden=4, augment=1, dt=0.05, drift_hidden=4)
    params = [net.w0] + list(guide.drifts.parameters())
    losses, grads = [], []
    for kwargs in (dict(adjoint=True), dict(method="milstein", dt=ADJOINT_DT)):  # Milstein = Euler, exact backprop
        pyro.set_rng_seed(5)
        loss = net.fused_loss(x, y, guide, estimator="stl", num_samples=2, **kwargs)
        losses.append(loss.detach())
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    assert ADJOINT_DT == 0.01
    assert torch.allclose(losses[0], losses[1], rtol=1e-8)  # same grid, same Brownian path
    assert (grads[0] - grads[1]).norm() < 0.05 * grads[1].norm()


@pytest.mark.parametrize("method, adjoint", [("srk", False), ("euler", True)])
@pytest.mark.parametrize("estimator", ["full_mc", "stl"])
def test_fused_loss_torchsde_every_estimator(estimator, method, adjoint):
    # the Itô KL term reaches torchsde solves and the adjoint: at q = p (zero drift) the stl KL is exactly zero
    # and its gradient too, while full_mc's is a random non-zero number
    x, y = _data(8)
    net = SDEBNN(1, 1, hidden=4, augment=1, dt=0.25)
    guide = NeuralSDEGuide(net, drift_hidden=4)
    guide(x, y)
    drift = list(guide.drifts.parameters())
    grads = []
    for kl_scale in (1.0, 0.0):  # same Brownian path: the difference is the KL's gradient
        pyro.set_rng_seed(3)
        loss = net.fused_loss(x, y, guide, estimator=estimator, method=method, adjoint=adjoint, num_samples=2,
                              kl_scale=kl_scale)
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, drift)]))
    kl_grad = (grads[0] - grads[1]).abs().max()
    assert (kl_grad == 0) if estimator == "stl" else (kl_grad > 1e-4)


def test_predict_adaptive():
    x, _ = _data(8)
    net = SDEBNN(1, 1, hidden=4, augment=1, dt=0.25)
    guide = NeuralSDEGuide(net, drift_hidden=4)
    pred = net.predict(x, guide, num_samples=3, method="srk", adaptive=True, rtol=1e-2, atol=1e-2)
    assert pred.loc.shape == (3, 8)


@pytest.mark.parametrize("kwargs, match", [
    (dict(sigma=0.0), "sigma"), (dict(sigma=-1.0), "sigma"), (dict(dt=0.0), "dt"), (dict(dt=-0.1), "dt"),
    (dict(t_span=(1.0, 0.0)), "t_span"), (dict(likelihood="poisson"), "likelihood"), (dict(in_dim=(1, 7, 7)), "in_dim"),
    (dict(obs_scale=0.0), "obs_scale"), (dict(obs_scale="1"), "obs_scale"),
    # accepted before (and a NaN loss at the first step, or a failing Student-t later):
    (dict(sigma=float("inf")), "sigma"), (dict(sigma=True), "sigma"), (dict(theta=float("inf")), "theta"),
    (dict(obs_scale=float("inf")), "obs_scale"), (dict(df=0.0), "df"), (dict(df=float("nan")), "df"),
    (dict(t_span=(0.0, float("inf"))), "t_span"),
])
def test_bad_constructor_arguments(kwargs, match):
    args = dict(in_dim=1, out_dim=1, hidden=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        SDEBNN(**args)


def test_bad_call_arguments():
    net = SDEBNN(2, 1, hidden=4, dt=0.5)
    with pytest.raises(ValueError, match="x must have shape"):
        net.model(torch.randn(5, 3))
    with pytest.raises(ValueError, match="method"):
        net.predict(torch.randn(5, 2), method="rk45")


def _train_toy(augment, steps=300):
    from pyro_sdebnn.data import toy_regression_1d

    data = toy_regression_1d(n_train=100, n_test=200)
    net = SDEBNN(1, 1, hidden=16, augment=augment, sigma=0.2, dt=0.1)
    guide = NeuralSDEGuide(net, drift_hidden=32)
    elbo = TracePathKL_ELBO(num_particles=4, vectorize_particles=True, max_plate_nesting=1)
    svi = SVI(net.model, guide, Adam({"lr": 1e-2}), elbo)
    for _ in range(steps):
        svi.step(data.x_train, data.y_train)
    return data, net.predict(data.x_test, guide, num_samples=100)


@pytest.mark.slow
def test_toy_regression_coverage_and_non_monotonic_samples():
    from pyro_sdebnn.metrics import interval_coverage

    data, pred = _train_toy(augment=2)
    held_out = data.x_test[:, 0].abs() <= 2  # held-out grid points inside the training range [-2, 2]
    coverage = interval_coverage(pred.loc[:, held_out], pred.scale[:, held_out], data.y_test[held_out], level=0.9)
    assert coverage >= 0.8
    steps = pred.loc.diff(dim=1)  # x_test is sorted
    monotone = (steps >= 0).all(1) | (steps <= 0).all(1)
    assert not monotone.any()


@pytest.mark.slow
def test_samples_monotonic_without_augmentation():
    # a 1-D ODE flow is a homeomorphism of R: every weight sample gives a monotone function
    _, pred = _train_toy(augment=0, steps=50)
    steps = pred.loc.diff(dim=1)
    assert ((steps >= 0).all(1) | (steps <= 0).all(1)).all()


@pytest.mark.slow
def test_digits_classification_smoke():
    from pyro_sdebnn.data import digits

    data = digits()
    net = SDEBNN(tuple(data.x_train.shape[1:]), 10, hidden=8, augment=1, sigma=0.1, dt=0.25,
                 likelihood="categorical")
    guide = NeuralSDEGuide(net, drift_hidden=16, bottleneck=2)
    svi = SVI(net.model, guide, Adam({"lr": 1e-2}), TracePathKL_ELBO())
    n = data.x_train.shape[0]
    generator = torch.Generator().manual_seed(0)
    for _ in range(150):
        idx = torch.randint(0, n, (64,), generator=generator)
        svi.step(data.x_train[idx], data.y_train[idx], num_data=n)
    pred = net.predict(data.x_test, guide, num_samples=10)
    accuracy = (pred.mean_probs.argmax(-1) == data.y_test).float().mean()
    assert accuracy > 0.8  # chance is 0.1


def test_multiscale_two_blocks_two_path_sites():
    x = torch.randn(12, 1, 8, 8)
    y = torch.randint(0, 3, (12,))
    net = MultiScaleSDEBNN((1, 8, 8), 3, blocks=2, hidden=2, augment=1, dt=0.5)
    guide = NeuralSDEGuide(net, drift_hidden=8, bottleneck=2)
    svi = SVI(net.model, guide, Adam({"lr": 1e-2}), TracePathKL_ELBO())
    assert torch.isfinite(torch.tensor(svi.step(x, y)))
    assert set(guide.drifts.keys()) == {"w_path_0", "w_path_1"}
    assert net.predict(x, guide, num_samples=3).probs.shape == (3, 12, 3)
    with pytest.raises(ValueError, match="in_shape"):
        MultiScaleSDEBNN((1, 6, 6), 3, blocks=2)
    for num_data in (2.5, 5, 0):  # ran as N = 2 (int(2.5)) or 5 < 12 before (silently wrong), or failed in Pyro's plate
        with pytest.raises(ValueError, match="num_data must be None or an int >= the batch size 12"):
            svi.step(x, y, num_data=num_data)
    with pytest.raises(ValueError, match=r"y must hold class labels in 0..2"):  # Pyro's support message before
        svi.step(x, torch.full((12,), 3))
    with pytest.raises(ValueError, match=r"y must have shape \(12,\)"):
        svi.step(x, y[:, None])
    with pytest.raises(TypeError, match="x must have the network's dtype torch.float32"):  # torch's conv before
        net.model(x.double(), y)


@pytest.mark.parametrize("parallel", [False, True])
def test_multiscale_predictive_with_another_guide_returns_the_logits_at_f(parallel):
    # predict's TypeError for a guide other than NeuralSDEGuide points to Predictive(..., return_sites=["f"]), but the
    # multi-scale model had no site "f": Predictive returned an empty dict
    x, y = torch.randn(6, 1, 4, 4), torch.randint(0, 3, (6,))
    net = MultiScaleSDEBNN((1, 4, 4), 3, blocks=1, hidden=2, dt=0.5)
    guide = AutoNormal(net.model)
    guide(x, y)
    with pytest.raises(TypeError, match=r"return_sites=\['f'\]"):
        net.predict(x, guide)
    out = Predictive(net.model, guide=guide, num_samples=2, parallel=parallel, return_sites=["f", "_RETURN"])(x)
    assert out["f"].shape == (2, 6, 3)
    torch.testing.assert_close(out["f"], out["_RETURN"].reshape(2, 6, 3), rtol=0, atol=0)


def test_integrate_weights_shape_error():
    net = SDEBNN(1, 1, hidden=4, dt=0.5)
    with pytest.raises(ValueError, match="weights must have shape"):
        net.integrate_weights(torch.randn(3, 1), torch.zeros(3, net.num_weights))


def test_forward_path_errors_name_the_path():
    """The network called with targets in place of a weight path (``SVI(net, ...)`` for ``SVI(net.model, ...)``)
    gets a message naming ``path`` and ``net.model``, not an IndexError from the shape check."""
    net = SDEBNN(3, 1, hidden=4, dt=0.5)
    x = torch.randn(5, 3)
    with pytest.raises(ValueError, match=r"path must have shape \(\.\.\., 2, .*net\.model"):
        net(x, torch.randn(5))
    with pytest.raises(ValueError, match="path must have shape"):
        net(x, torch.randn(2, 3))
    with pytest.raises(TypeError, match="path must be a tensor"):
        net(x, None)
    assert net(x, net.prior().sample()).shape == (5, 1)


def test_float64_module_gives_float64_everything():
    x, y = _data()
    net = SDEBNN(1, 1, hidden=4, augment=1, dt=0.25).double()
    guide = NeuralSDEGuide(net, drift_hidden=4)
    svi = SVI(net.model, guide, Adam({"lr": 1e-2}), TracePathKL_ELBO())
    svi.step(x.double(), y.double())
    assert all(p.dtype == torch.float64 for p in guide.parameters())
    assert net.times.dtype == torch.float64
    assert net.predict(x.double(), guide, num_samples=2).loc.dtype == torch.float64


@pytest.mark.parametrize("make", [
    lambda: SDEBNN(in_dim=1, out_dim=1, hidden=4, augment=1, dt=0.25),
    lambda: ODENet(1, 1, hidden=4, augment=1, dt=0.25),
    lambda: MultiScaleSDEBNN((1, 8, 8), 3, blocks=2, hidden=2, augment=1, dt=0.5),
], ids=["sdebnn", "odenet", "multiscale"])
def test_likelihood_batch_shape_under_an_outer_particle_plate(make):
    # weights drawn inside a particle plate (vectorised ELBO particles, Predictive(parallel=True)) carry batch shape
    # (S, 1); the likelihood must be (S, b): one log-likelihood per particle and point, not (S, S, b)
    net = make()
    x = torch.randn(5, *((1, 8, 8) if isinstance(net, MultiScaleSDEBNN) else (1,)))
    y = torch.randint(0, 3, (5,)) if isinstance(net, MultiScaleSDEBNN) else torch.randn(5)
    with pyro.plate("particles", 3, dim=-2):
        trace = poutine.trace(net.model).get_trace(x, y)
    trace.compute_log_prob()
    assert trace.nodes["obs"]["log_prob"].shape == (3, 5)


@pytest.mark.parametrize("in_dim", [1, (1, 4, 4)])
def test_forward_equals_euler_loop_over_path_slices(in_dim):
    # the per-step weights W_k = w_{t_k} (w0, then the path but its last value), vector and conv fields,
    # with a (S, 1) sample shape as under vectorised particles
    torch.manual_seed(0)
    net = SDEBNN(in_dim, 3, hidden=4, augment=1, dt=0.25).double()
    x = torch.randn((5,) + net.in_shape, dtype=torch.float64)
    path = net.prior().sample((2, 1))
    h = net.hidden_init(x)
    if isinstance(in_dim, tuple):
        h = h.expand(2, *h.shape)
    w_prev = torch.cat([net.w0.expand(2, 1, 1, -1), path[..., :-1, :]], -2)
    for k in range(path.shape[-2]):
        w = w_prev[..., k, :].reshape(2, -1) if isinstance(in_dim, tuple) else w_prev[..., k, :]
        h = h + net.field(net.times[k], h, w) * (net.times[k + 1] - net.times[k])
    expected = net._head(h.reshape((2, 1) + h.shape[-4:]) if isinstance(in_dim, tuple) else h)
    assert torch.allclose(net(x, path), expected, rtol=1e-12, atol=1e-12)


def _noisy_line(n=64, noise=0.1):
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-1, 1, n).unsqueeze(-1)
    return x, 2 * x.squeeze(-1) + noise * torch.randn(n, generator=g)


def test_obs_scale_none_starts_at_the_targets_spread_and_is_learned_towards_the_noise():
    # obs_scale=None: the noise scale starts at std(y) of the first observed batch (here 1.2, far above the true
    # 0.1: the model explains nothing yet), then SVI learns it down towards the true noise
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = _noisy_line()
    net = SDEBNN(1, 1, hidden=8, dt=0.5)
    assert float(net.obs_scale.detach()) == 1.0  # before any data
    guide = NeuralSDEGuide(net, drift_hidden=8)
    svi = SVI(net.model, guide, Adam({"lr": 0.1}), TracePathKL_ELBO())
    svi.step(x, y)
    start = float(y.std())
    assert abs(float(pyro.param("obs_scale").detach()) / start - 1) < 0.11  # one Adam step (lr 0.1) from std(y)
    for _ in range(60):
        svi.step(x, y)
    learned = float(net.obs_scale.detach())
    assert learned == float(pyro.param("obs_scale").detach())
    assert learned < 0.35 < start  # log-distance to the true 0.1: from 2.5 to under 1.25
    # later batches do not re-scale it
    net.model(x, 10 * y)
    assert float(net.obs_scale.detach()) == learned


def test_obs_scale_fixed_start_and_loaded_state_are_not_rescaled():
    pyro.clear_param_store()
    x, y = _noisy_line()
    net = SDEBNN(1, 1, hidden=4, dt=0.5, obs_scale=0.3)
    net.model(x, y)
    assert float(net.obs_scale.detach()) == pytest.approx(0.3)
    trained = SDEBNN(1, 1, hidden=4, dt=0.5)
    trained.obs_scale = torch.tensor(0.07)
    fresh = SDEBNN(1, 1, hidden=4, dt=0.5)
    fresh.load_state_dict(trained.state_dict())
    pyro.clear_param_store()
    fresh.model(x, y)
    assert float(fresh.obs_scale.detach()) == pytest.approx(0.07)


@pytest.mark.parametrize("make_guide", [AutoNormal, AutoMultivariateNormal])
def test_predict_with_another_guide_raises_type_error_pointing_to_predictive(make_guide):
    """The README's guide swap (AutoNormal for NeuralSDEGuide) trains with SVI; net.predict / fused_loss integrate the
    posterior SDE and need a NeuralSDEGuide: another guide is named, with the way to predict with it."""
    pyro.clear_param_store()
    net = SDEBNN(2, 2, hidden=4, augment=1, dt=0.5, likelihood="categorical")
    guide = make_guide(net.model)
    x, y = torch.randn(6, 2), torch.arange(6) % 2
    guide(x, y)  # set up, as after SVI
    with pytest.raises(TypeError, match=f"{make_guide.__name__}.*pyro.infer.Predictive"):
        net.predict(x, guide, num_samples=2)
    with pytest.raises(TypeError, match="pyro.infer.Predictive"):
        net.fused_loss(x, y, guide)
    f = Predictive(net.model, guide=guide, num_samples=2, return_sites=["f"])(x)["f"]  # the way that works
    assert f.shape[-2:] == (6, 2)


def test_targets_as_a_column_and_wrong_target_shapes():
    """SDEBNN.model documents targets (b,) or (b, out_dim): a (b, 1) column for a scalar regression is that, and is
    scored like (b,) (before: a (b, b) log-likelihood, which Pyro rejected under SVI and fused_loss summed without a
    word); any other shape is a ValueError naming y."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    net = SDEBNN(2, 1, hidden=4, augment=1, dt=0.5)
    guide = NeuralSDEGuide(net)
    x, y = torch.randn(6, 2), torch.randn(6)
    net.fused_loss(x, y, guide)  # sets the guide up (its first call draws the drift's initial weights)
    pyro.set_rng_seed(1)
    flat = net.fused_loss(x, y, guide)
    pyro.set_rng_seed(1)
    column = net.fused_loss(x, y[:, None], guide)
    assert torch.equal(flat, column)
    trace = poutine.trace(net.model).get_trace(x, y[:, None])
    assert trace.nodes["obs"]["value"].shape == (6,)
    with pytest.raises(ValueError, match=r"y must have shape \(6,\) \(or a \(b, 1\) column\).*got \(6, 2\)"):
        net.model(x, torch.randn(6, 2))
    with pytest.raises(ValueError, match=r"y must have shape \(6,\) for 6 inputs with likelihood='categorical'"):
        SDEBNN(2, 3, hidden=4, augment=1, dt=0.5, likelihood="categorical", name="cls").model(
            x, torch.zeros(6, 1).long())


def test_predict_on_tensors_follows_the_network_dtype():
    """A float64 SDE-BNN predicting on float32 tensors failed inside the drift ("expected scalar type Double but found
    Float"), while a loader's batches were cast; tensors are now cast too: the same prediction as on float64 inputs."""
    pyro.clear_param_store()
    net = SDEBNN(2, 2, hidden=4, augment=1, dt=0.5, likelihood="categorical").double()
    guide = NeuralSDEGuide(net)
    x = torch.randn(5, 2)
    guide(x.double())  # set up
    preds = []
    for xs in (x, x.double()):
        pyro.set_rng_seed(0)
        preds.append(net.predict(xs, guide, num_samples=3).probs)
    assert preds[0].dtype == torch.float64
    torch.testing.assert_close(preds[0], preds[1], rtol=0, atol=0)


def test_bad_data_and_loss_arguments_are_named():
    """Each of these was a raw error from deep inside (torch's matmul "same dtype", Pyro's plate "size cannot be
    zero", ``'NoneType' object has no attribute 'shape'``, Pyro's/torch's support message that names neither y nor
    the classes) or, worse, a silently wrong number (fused_loss with num_data < b or <= 0, or kl_scale < 0)."""
    pyro.clear_param_store()
    net = SDEBNN(2, 1, hidden=4, augment=1, dt=0.5)
    guide = NeuralSDEGuide(net, drift_hidden=4)
    cls = SDEBNN(2, 3, hidden=4, augment=1, dt=0.5, likelihood="categorical", name="cls")  # a second net
    cls_guide = NeuralSDEGuide(cls, drift_hidden=4)
    x, y, labels = torch.randn(8, 2), torch.randn(8), torch.arange(8) % 3
    svi = SVI(net.model, guide, Adam({"lr": 1e-2}), TracePathKL_ELBO())
    with pytest.raises(TypeError, match=r"x must have the network's dtype torch.float32, got torch.float64"):
        svi.step(x.double(), y.double())
    # integer data (images stored as bytes): the conversion named, not net.to(torch.uint8), a network of no use
    for dtype in (torch.int64, torch.uint8):
        with pytest.raises(TypeError, match=rf"x must be a floating-point tensor of the network's dtype torch.float32, "
                                            rf"got {dtype} \(convert the data with x.to\(torch.float32\); pixels"):
            net.model(torch.ones(8, 2, dtype=dtype), y)
    for num_data in (0, 3, 2.5):
        with pytest.raises(ValueError, match="num_data must be None or an int >= the batch size 8"):
            svi.step(x, y, num_data=num_data)
        with pytest.raises(ValueError, match="num_data must be None or an int >= the batch size 8"):
            net.fused_loss(x, y, guide, num_data=num_data)
    with pytest.raises(ValueError, match="at least one data point"):
        svi.step(torch.randn(0, 2), torch.randn(0))
    for bad in (torch.full((8,), 3), torch.full((8,), -1), torch.full((8,), 0.5)):
        with pytest.raises(ValueError, match=r"y must hold class labels in 0..2 \(out_dim=3\)"):
            cls.model(x, bad)
        with pytest.raises(ValueError, match=r"y must hold class labels in 0..2"):
            cls.fused_loss(x, bad, cls_guide)
    cls.model(x, labels.float())  # integral float labels are labels, as for Pyro's Categorical
    # the label and data checks read a value back (a device sync per step): they run under Pyro's validation only
    calls = []
    import pyro_sdebnn.nn.continuous_depth as cd
    import pyro_sdebnn.nn.sdebnn as sd

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cd, "check_class_labels", lambda *a: calls.append("labels"))
        mp.setattr(sd, "check_finite_batch", lambda *a, **k: calls.append("finite"))
        with pyro.validation_enabled(False):
            cls.model(x, labels)
            cls.fused_loss(x, labels, cls_guide)
        assert calls == []
        with pyro.validation_enabled(True):
            cls.fused_loss(x, labels, cls_guide)
        assert calls == ["finite", "labels"]
    with pytest.raises(TypeError, match="x and y must be tensors"):
        net.fused_loss(x, None, guide)
    with pytest.raises(ValueError, match="kl_scale"):
        net.fused_loss(x, y, guide, kl_scale=-1.0)
    bad_x = x.clone()
    bad_x[2, 1] = float("nan")
    with pytest.raises(ValueError, match=r"x contains NaN at index \(2, 1\)"):
        net.fused_loss(bad_x, y, guide)
    with pytest.raises(ValueError, match=r"x contains NaN at index \(2, 1\)"):
        svi.step(bad_x, y)  # Pyro's own message: "Expected parameter loc ... Normal ... found invalid values"
    bad_y = y.clone()
    bad_y[5] = float("inf")
    with pytest.raises(ValueError, match=r"y contains Inf at index \(5,\)"):
        svi.step(x, bad_y)


@pytest.mark.parametrize("tol", [dict(rtol=-1.0), dict(rtol=0.0, atol=0.0), dict(atol=float("nan"))])
def test_adaptive_prediction_with_a_tolerance_that_never_holds_is_an_error(tol):
    """predict(adaptive=True, rtol=-1) never returned (torchsde shrinks the step for ever)."""
    pyro.clear_param_store()
    net = SDEBNN(2, 1, hidden=4, augment=1, dt=0.5)
    with pytest.raises(ValueError, match="rtol|atol"):
        net.predict(torch.randn(4, 2), None, num_samples=2, adaptive=True, **tol)
    with pytest.raises(TypeError, match="adjoint and adaptive"):
        net.predict(torch.randn(4, 2), None, num_samples=2, adaptive="no")


def test_predict_checks_the_guide_once_before_reading_a_loader():
    """The guide was checked twice per call (and once per batch of a loader, after the batch was read); one check
    now comes first."""
    from pyro_sdebnn.nn import sdebnn

    pyro.clear_param_store()
    net = SDEBNN(2, 1, hidden=4, augment=1, dt=0.5)
    guide = NeuralSDEGuide(net, drift_hidden=4)
    x = torch.randn(6, 2)
    guide(x)
    calls = []
    check = sdebnn._check_path_guide
    sdebnn._check_path_guide = lambda g: calls.append(g) or check(g)
    try:
        net.predict(x, guide, num_samples=2)
        assert len(calls) == 1
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros(6)), batch_size=4)
        calls.clear()
        net.predict(loader, guide, num_samples=2)
        assert len(calls) == 1
    finally:
        sdebnn._check_path_guide = check

    class Unread(torch.utils.data.DataLoader):
        def __iter__(self):
            raise AssertionError("the loader was read before the guide was checked")

    with pytest.raises(TypeError, match="NeuralSDEGuide"):
        net.predict(Unread(torch.utils.data.TensorDataset(x)), "not a guide")


def test_predict_entropy_seeds_every_method():
    """``entropy`` fixed torchsde's Brownian motion but was silently ignored by the default fused Euler solve."""
    pyro.clear_param_store()
    net = SDEBNN(2, 1, hidden=4, augment=1, dt=0.5)
    x = torch.randn(5, 2)
    for method in ("euler", "srk"):
        draws = []
        for seed, entropy in ((0, 7), (1, 7), (0, 8)):
            pyro.set_rng_seed(seed)
            draws.append(net.predict(x, None, num_samples=3, method=method, entropy=entropy).loc)
        torch.testing.assert_close(draws[0], draws[1], rtol=0, atol=0)
        assert not torch.equal(draws[0], draws[2])
    with pytest.raises(TypeError, match="entropy must be an int"):
        net.predict(x, None, num_samples=3, entropy="7")


def test_fused_loss_reports_a_non_finite_loss_without_a_warning():
    """The message read ``float(loss)`` of a tensor that requires grad: torch's UserWarning ("Converting a tensor with
    requires_grad=True to a scalar") came first, an error under ``filterwarnings = error``."""
    pyro.clear_param_store()
    net = SDEBNN(2, 1, hidden=4, augment=1, dt=0.5, obs_scale=1.0)
    guide = NeuralSDEGuide(net, drift_hidden=4)
    with torch.no_grad():
        net.head.bias.fill_(float("inf"))
    with pytest.raises(ValueError, match="SDEBNN.fused_loss: non-finite loss"):
        net.fused_loss(torch.randn(4, 2), torch.randn(4), guide)
