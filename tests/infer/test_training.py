# SPDX-License-Identifier: Apache-2.0
"""Learning-rate schedules and whole-gradient clipping in every ``fit`` (SVI and plain PyTorch loops)."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sdebnn.infer import DeepEnsemble, Laplace, MAPEstimate, MCDropout, MeanFieldVI, SamplingFreeBNN
from pyro_sdebnn.infer._training import clip_gradients, clip_gradients_batched, svi_update
from pyro_sdebnn.infer.map_training import train_network
from pyro_sdebnn.nn._mlp import make_mlp
from pyro_sdebnn.nn.mnvi import MNLinear, MNReLU, MNSequential

LRS = [0.1, 0.01, 0.001, 0.001]  # MultiStepLR(milestones=[1, 2], gamma=0.1): the LR of epochs 1, 2, 3, 4


def _pyro_multistep():
    return pyro.optim.MultiStepLR(
        {"optimizer": torch.optim.Adam, "optim_args": {"lr": 0.1}, "milestones": [1, 2], "gamma": 0.1}
    )


def _pyro_lrs(optim):
    """The learning rates of every per-parameter optimiser a Pyro scheduler created."""
    return {group["lr"] for sched in optim.optim_objs.values() for group in sched.optimizer.param_groups}


def _data(n=20, likelihood="normal"):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=gen)
    y = torch.randn(n, generator=gen) if likelihood == "normal" else (x[:, 0] > 0).long()
    return x, y


def _sampling_free_bnn(n=20):
    net = MNSequential(MNLinear(2, 8), MNReLU(), MNLinear(8, 2))
    return SamplingFreeBNN(net, "normal", num_data=n)


# ------------------------------------------------------------------ Pyro schedulers in the SVI fits
def _fit_svi(kind, optim, num_epochs, **kwargs):
    x, y = _data()
    if kind == "sampling_free":
        _sampling_free_bnn().fit(x, y, num_epochs=num_epochs, batch_size=5, optim=optim, **kwargs)
    else:
        cls = MAPEstimate if kind == "map" else MeanFieldVI
        cls(make_mlp([2, 8, 2]), "normal").fit(x, y, num_epochs=num_epochs, batch_size=5, optim=optim, **kwargs)


@pytest.mark.parametrize("kind", ["sampling_free", "map", "mean_field"])
@pytest.mark.parametrize("num_epochs", [1, 2, 3, 4])
def test_pyro_scheduler_stepped_per_epoch(kind, num_epochs):
    pyro.set_rng_seed(0)
    optim = _pyro_multistep()
    _fit_svi(kind, optim, num_epochs)
    # the LR after num_epochs epochs is the one scheduled for epoch num_epochs + 1
    (lr,) = _pyro_lrs(optim)
    assert lr == pytest.approx(LRS[min(num_epochs, 3)])


@pytest.mark.parametrize("kind", ["sampling_free", "map"])
def test_pyro_scheduler_stepped_per_step(kind):
    pyro.set_rng_seed(0)
    optim = _pyro_multistep()
    _fit_svi(kind, optim, 1, scheduler_step="step")  # 20 points, batch 5: 4 steps, so both milestones pass
    (lr,) = _pyro_lrs(optim)
    assert lr == pytest.approx(0.001)
    assert all(sched.last_epoch == 4 for sched in optim.optim_objs.values())


# ------------------------------------------------------------------ torch schedulers in the PyTorch fits
def _torch_factory(made):
    def factory(opt):
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1, 2], gamma=0.1)
        made.append(sched)
        return sched

    return factory


def _fit_torch(kind, num_epochs, **kwargs):
    x, y = _data(likelihood="categorical")
    common = dict(num_epochs=num_epochs, lr=0.1, batch_size=5, **kwargs)
    if kind == "train_network":
        train_network(make_mlp([2, 8, 2]), x, y, "categorical", **common)
    elif kind == "mc_dropout":
        MCDropout(make_mlp([2, 8, 2], dropout=0.1), "categorical").fit(x, y, **common)
    elif kind == "laplace":
        Laplace(make_mlp([2, 4, 2]), "categorical", hessian_structure="diag").fit(
            x, y, tune_prior_precision=False, **common
        )
    else:
        DeepEnsemble(lambda: make_mlp([2, 8, 2]), "categorical", num_members=2).fit(
            x, y, vectorize=(kind == "ensemble_vmap"), **common
        )


TORCH_FITS = ["train_network", "mc_dropout", "laplace", "ensemble", "ensemble_vmap"]


@pytest.mark.parametrize("kind", TORCH_FITS)
@pytest.mark.parametrize("scheduler_step,num_epochs,expected_calls", [("epoch", 4, 4), ("step", 1, 4)])
def test_torch_scheduler_stepped(kind, scheduler_step, num_epochs, expected_calls):
    torch.manual_seed(0)
    made = []
    _fit_torch(kind, num_epochs, scheduler=_torch_factory(made), scheduler_step=scheduler_step)
    assert made and all(s.last_epoch == expected_calls for s in made)
    assert all(g["lr"] == pytest.approx(0.001) for s in made for g in s.optimizer.param_groups)


@pytest.mark.parametrize("kind", TORCH_FITS)
def test_torch_clipping_bounds_every_step(kind):
    """A pre-step hook on the optimiser sees the clipped gradient: its whole norm is at most c."""
    c = 1e-3
    norms = {"l2": [], "inf": []}

    def factory(opt):
        def hook(optimizer, args, kwargs):
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            if kind == "ensemble_vmap":  # stacked members: the bound holds per member
                norms["l2"].append(torch.stack([g.flatten(1).pow(2).sum(1) for g in grads]).sum(0).sqrt().max())
                norms["inf"].append(torch.stack([g.flatten(1).abs().amax(1) for g in grads]).amax())
            else:
                norms["l2"].append(torch.cat([g.flatten() for g in grads]).norm())
                norms["inf"].append(torch.cat([g.flatten() for g in grads]).abs().max())

        opt.register_step_pre_hook(hook)
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1.0)

    for clip in ({"clip_norm": c}, {"clip_inf_norm": c}, {}):
        torch.manual_seed(0)
        norms = {"l2": [], "inf": []}
        _fit_torch(kind, 1, scheduler=factory, **clip)
        l2, inf = torch.stack(norms["l2"]), torch.stack(norms["inf"])
        if "clip_norm" in clip:
            assert (l2 <= c * (1 + 1e-5)).all()
        elif "clip_inf_norm" in clip:
            assert (inf <= c * (1 + 1e-5)).all() and (l2 > c).any()
        else:  # without clipping the bound is violated, so the checks above can fail
            assert (inf > c).all()


# ------------------------------------------------------------------ clipping in the SVI step
def _two_param_model():
    big = pyro.param("big", torch.zeros(3))
    small = pyro.param("small", torch.zeros(2))
    pyro.sample("a", dist.Normal(big, 1.0).to_event(1), obs=torch.full((3,), 100.0))
    pyro.sample("b", dist.Normal(small, 1.0).to_event(1), obs=torch.full((2,), 0.5))


def _guide():
    pass


def _svi_update(clip=None, pyro_clip_args=None, optim=None, steps=1):
    """One SGD(lr=1) step from zero (or ``steps`` of ``optim``): the parameter change is minus the gradient applied."""
    pyro.clear_param_store()
    optim = pyro.optim.SGD({"lr": 1.0}, clip_args=pyro_clip_args) if optim is None else optim
    svi = pyro.infer.SVI(_two_param_model, _guide, optim, pyro.infer.Trace_ELBO())
    for _ in range(steps):
        svi_update(svi, **(clip or {}))
    store = pyro.get_param_store()
    return torch.cat([store["big"].detach(), store["small"].detach()])


def test_svi_global_l2_clipping_differs_from_per_tensor():
    c = 1.0
    raw = _svi_update()
    assert raw == pytest.approx(torch.tensor([100.0] * 3 + [0.5] * 2))
    glob = _svi_update({"clip_norm": c})
    assert glob.norm() == pytest.approx(c, rel=1e-5)
    assert glob == pytest.approx(raw * c / raw.norm(), rel=1e-5)  # direction kept
    per_tensor = _svi_update(pyro_clip_args={"clip_norm": c})
    assert per_tensor.norm() > c  # Pyro's clip_args bound every tensor, not the whole gradient
    assert per_tensor[3:] == pytest.approx(raw[3:])


def test_svi_inf_clipping_and_no_clipping_matches_step():
    c = 2.0
    raw = _svi_update()
    inf = _svi_update({"clip_inf_norm": c})
    assert inf.abs().max() == pytest.approx(c, rel=1e-5)
    assert inf == pytest.approx(raw * c / raw.abs().max(), rel=1e-5)
    both = _svi_update({"clip_norm": 1.0, "clip_inf_norm": 0.1})  # L2 first, then L_inf
    assert both.abs().max() <= 0.1 * (1 + 1e-5) and both.norm() <= 1.0
    pyro.clear_param_store()  # without clipping, svi_update is SVI.step bit for bit (the SVI baselines rely on it)
    svi = pyro.infer.SVI(_two_param_model, _guide, pyro.optim.Adam({"lr": 0.1}), pyro.infer.Trace_ELBO())
    svi.step()
    svi.step()
    store = pyro.get_param_store()
    assert torch.equal(_svi_update(optim=pyro.optim.Adam({"lr": 0.1}), steps=2),
                       torch.cat([store["big"].detach(), store["small"].detach()]))


@pytest.mark.parametrize("kind", ["sampling_free", "map"])
def test_svi_fit_clip_norm_bounds_the_sgd_update(kind):
    """With SGD(lr=1) and one full-batch step, the parameter change is the clipped gradient."""
    c = 1e-3
    x, y = _data()
    pyro.set_rng_seed(0)
    if kind == "sampling_free":
        bnn = _sampling_free_bnn()
        bnn.fit(x, y, num_epochs=1, batch_size=20, optim=pyro.optim.SGD({"lr": 0.0}))  # set the parameters up
        before = torch.cat([p.detach().flatten().clone() for p in bnn.parameters()])
        bnn.fit(x, y, num_epochs=1, batch_size=20, optim=pyro.optim.SGD({"lr": 1.0}), clip_norm=c)
        after = torch.cat([p.detach().flatten() for p in bnn.parameters()])
    else:
        method = MAPEstimate(make_mlp([2, 8, 2]), "normal")
        method.fit(x, y, num_epochs=1, batch_size=None, optim=pyro.optim.SGD({"lr": 0.0}))

        def values():
            with pyro.get_param_store().scope(method._store_state):
                store = pyro.get_param_store()
                return torch.cat([store[k].detach().flatten().clone() for k in sorted(store.keys())])

        before = values()
        method.fit(x, y, num_epochs=1, batch_size=None, optim=pyro.optim.SGD({"lr": 1.0}), clip_norm=c)
        after = values()
    assert (after - before).norm() == pytest.approx(c, rel=1e-4)  # the raw gradient is far larger than c


def test_clip_gradients_batched_matches_per_member():
    torch.manual_seed(0)
    grads = [torch.randn(3, 4, 5) * 10, torch.randn(3, 5)]
    stacked = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, g in zip(stacked, grads):
        p.grad = g.clone()
    clip_gradients_batched(stacked, clip_norm=2.0, clip_inf_norm=0.5)
    for k in range(3):
        alone = [torch.zeros_like(g[k], requires_grad=True) for g in grads]
        for p, g in zip(alone, grads):
            p.grad = g[k].clone()
        clip_gradients(alone, clip_norm=2.0, clip_inf_norm=0.5)
        for p, q in zip(stacked, alone):
            assert torch.allclose(p.grad[k], q.grad)


# ------------------------------------------------------------------ validation and reproducibility
BAD = [-1.0, 0.0, math.nan, math.inf]


@pytest.mark.parametrize("arg", ["clip_norm", "clip_inf_norm"])
@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("kind", ["sampling_free", "map", *TORCH_FITS])
def test_bad_clip_values_raise(kind, arg, value):
    with pytest.raises(ValueError, match=arg):
        if kind in ("sampling_free", "map"):
            _fit_svi(kind, None, 1, **{arg: value})
        else:
            _fit_torch(kind, 1, **{arg: value})


@pytest.mark.parametrize("kind", ["sampling_free", "map", *TORCH_FITS])
def test_bad_scheduler_step_raises(kind):
    with pytest.raises(ValueError, match="scheduler_step"):
        if kind in ("sampling_free", "map"):
            _fit_svi(kind, _pyro_multistep(), 1, scheduler_step="batch")
        else:
            _fit_torch(kind, 1, scheduler=_torch_factory([]), scheduler_step="batch")


def test_torch_fit_rejects_pyro_scheduler():
    with pytest.raises(TypeError, match="scheduler must be a callable optimizer"):
        _fit_torch("train_network", 1, scheduler=_pyro_multistep())


def test_same_seed_same_result():
    def run():
        pyro.set_rng_seed(3)
        x, y = _data()
        method = MeanFieldVI(make_mlp([2, 8, 2]), "normal")
        method.fit(x, y, num_epochs=3, batch_size=5, optim=_pyro_multistep(), scheduler_step="step", clip_norm=0.5)
        return method.losses

    first, second = run(), run()
    assert first == second and all(math.isfinite(v) for v in first)


def test_ensemble_reduce_on_plateau_trains_members_one_by_one():
    x, y = _data(likelihood="categorical")
    made = []

    def factory(opt):
        made.append(torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5))
        return made[-1]

    ens = DeepEnsemble(lambda: make_mlp([2, 8, 2]), "categorical", num_members=2)
    ens.fit(x, y, num_epochs=3, lr=0.1, batch_size=5, scheduler=factory)  # vectorize=None: falls back
    assert len(made) == 3  # the declined vectorised one, then one per member
    assert all(s.last_epoch == 3 for s in made[1:])
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        ens.fit(x, y, num_epochs=1, scheduler=factory, vectorize=True)



def test_a_step_failing_on_a_diverged_parameter_names_it():
    # a learning rate too large leaves finite losses but non-finite parameters; the next step then fails inside
    # Pyro's validation ("Expected parameter loc ... found invalid values"), which names neither the parameter nor
    # the step: svi_update does
    pyro.clear_param_store()
    svi = pyro.infer.SVI(_two_param_model, _guide, pyro.optim.SGD({"lr": 1.0}), pyro.infer.Trace_ELBO())
    svi_update(svi)
    with torch.no_grad():
        pyro.get_param_store()["big"].unconstrained()[1] = math.nan
    with pyro.validation_enabled(True):
        with pytest.raises(FloatingPointError, match=r"parameters \['big'\] are NaN or infinite at epoch 2, batch 5"):
            svi_update(svi, where="epoch 2, batch 5")


def test_a_step_failing_with_finite_parameters_raises_its_own_error():
    def failing_model():
        pyro.param("p", torch.zeros(2))
        raise ValueError("boom")

    pyro.clear_param_store()
    svi = pyro.infer.SVI(failing_model, _guide, pyro.optim.SGD({"lr": 1.0}), pyro.infer.Trace_ELBO())
    with pytest.raises(ValueError, match="boom") as raised:
        svi_update(svi)
    assert type(raised.value) is ValueError  # not turned into a FloatingPointError
