# SPDX-License-Identifier: Apache-2.0
"""The baselines' ``fit`` and ``predict`` on a loader give what they give on the tensors.

Two ways to feed both paths the same minibatches: a full-batch ``DataLoader`` (with its own
``generator``, so iterating it draws nothing from torch's global generator) against ``batch_size=None``,
and :class:`EpochPermutationLoader`, which yields the minibatches in the order the tensor path draws
them (one ``torch.randperm(N)`` per epoch).
"""

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from pyro_sdebnn.infer import DeepEnsemble, Laplace, MAPEstimate, MCDropout, MeanFieldVI
from pyro_sdebnn.infer.map_training import train_network
from pyro_sdebnn.nn._mlp import make_mlp

N, BATCH = 20, 5
ATOL = 1e-6  # float32 sums over the same examples in another order (about 10 ulp of O(1) values)


class EpochPermutationLoader:
    """``(x, y)`` minibatches of ``batch_size`` in the order of one ``torch.randperm(N)`` per pass."""

    def __init__(self, x, y, batch_size):
        self.x, self.y, self.batch_size = x, y, batch_size
        self.dataset = TensorDataset(x, y)

    def __iter__(self):
        perm = torch.randperm(len(self.x))
        for start in range(0, len(perm), self.batch_size):
            idx = perm[start : start + self.batch_size]
            yield self.x[idx], self.y[idx]


def _data(likelihood="categorical", n=N):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=gen)
    y = (x[:, 0] > 0).long() if likelihood == "categorical" else x[:, 0] + 0.1 * torch.randn(n, generator=gen)
    return x, y


def _full_loader(x, y, batch_size=None):
    return DataLoader(TensorDataset(x, y), batch_size=batch_size or len(x), generator=torch.Generator().manual_seed(1))


def _build(name, likelihood="categorical"):
    torch.manual_seed(42)
    out = 2
    if name == "map":
        return MAPEstimate(make_mlp([2, 8, out]), likelihood)
    if name == "mfvi":
        return MeanFieldVI(make_mlp([2, 8, out]), likelihood)
    if name == "mc-dropout":
        return MCDropout(make_mlp([2, 8, out], dropout=0.2), likelihood, num_samples=4)
    if name == "ensemble":
        return DeepEnsemble(lambda: make_mlp([2, 8, out]), likelihood, num_members=2)
    if name == "ensemble-dropout":  # members with dropout: trained one by one
        return DeepEnsemble(lambda: make_mlp([2, 8, out], dropout=0.1), likelihood, num_members=2)
    if name.startswith("laplace"):
        return Laplace(make_mlp([2, 8, out]), likelihood, hessian_structure=name.partition("-")[2] or "full")
    raise KeyError(name)


def _weights(method):
    """Every fitted tensor of a method, by name."""
    if isinstance(method, (MAPEstimate, MeanFieldVI)):
        return {k: v.detach() for k, v in method._store_state["params"].items()}
    if isinstance(method, DeepEnsemble):
        return {f"{k}.{n}": p.detach() for k, m in enumerate(method.members) for n, p in m.named_parameters()}
    return {n: p.detach() for n, p in method.net.named_parameters()}


def _assert_same_weights(a, b, atol=ATOL):
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=atol, rtol=0, msg=name)


@pytest.mark.parametrize("likelihood", ["categorical", "normal"])
@pytest.mark.parametrize("name", ["map", "mfvi", "ensemble"])
def test_full_batch_loader_fits_like_tensors(name, likelihood):
    x, y = _data(likelihood)
    torch.manual_seed(7)
    on_tensors = _build(name, likelihood).fit(x, y, num_epochs=4, batch_size=None)
    torch.manual_seed(7)
    on_loader = _build(name, likelihood).fit(_full_loader(x, y), num_epochs=4)
    _assert_same_weights(on_tensors, on_loader)
    torch.testing.assert_close(torch.tensor(on_tensors.losses), torch.tensor(on_loader.losses), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["mc-dropout", "ensemble-dropout", "laplace"])
def test_minibatch_loader_fits_like_tensors(name):
    x, y = _data()
    torch.manual_seed(7)
    on_tensors = _build(name).fit(x, y, num_epochs=3, batch_size=BATCH)
    torch.manual_seed(7)
    on_loader = _build(name).fit(EpochPermutationLoader(x, y, BATCH), num_epochs=3)
    _assert_same_weights(on_tensors, on_loader)
    assert len(on_loader.losses) == 3


def test_minibatch_elbo_and_gradient_scaled_like_the_subsampled_plate():
    """``model(x_b, y_b, data_size=N)`` has the loss and gradient of ``model(x, y, subsample_size=b)``."""
    x, y = _data("normal")
    method = _build("map", "normal")
    elbo = Trace_ELBO()
    with pyro.get_param_store().scope():
        method.guide(x, y)
        params = [p.unconstrained() for p in pyro.get_param_store().values()]
        pyro.set_rng_seed(3)
        idx = pyro.poutine.trace(method.model).get_trace(x, y, subsample_size=BATCH).nodes["data"]["value"]
        pyro.set_rng_seed(3)  # the AutoDelta guide draws nothing: the model's plate draws the same indices
        loss_plate = elbo.differentiable_loss(method.model, method.guide, x, y, subsample_size=BATCH)
        loss_batch = elbo.differentiable_loss(method.model, method.guide, x[idx], y[idx], data_size=N)
        grads_plate = torch.autograd.grad(loss_plate, params)
        grads_batch = torch.autograd.grad(loss_batch, params)
        # The N/b scaling by hand: -log p(w) - (N/b) sum_batch log p(y|x, w).
        weights = method.guide()
        log_prior = sum(
            torch.distributions.Normal(0.0, method.model.prior_scale).log_prob(w).sum() for w in weights.values()
        )
        with pyro.poutine.condition(data=weights):
            out = method.model.net(x[idx])
        log_lik = torch.distributions.Normal(out[:, 0], out[:, 1].mul(0.5).exp()).log_prob(y[idx]).sum()
    assert idx.shape == (BATCH,)
    torch.testing.assert_close(loss_batch, loss_plate)
    torch.testing.assert_close(loss_batch, -(log_prior + N / BATCH * log_lik))
    for g_plate, g_batch in zip(grads_plate, grads_batch):
        torch.testing.assert_close(g_batch, g_plate)


PREDICTORS = ["map", "mfvi", "mc-dropout", "ensemble", "laplace"]


@pytest.mark.parametrize("likelihood", ["categorical", "normal"])
@pytest.mark.parametrize("name", PREDICTORS)
def test_predictions_over_a_loader_equal_those_on_tensors(name, likelihood):
    x, y = _data(likelihood)
    method = _build(name, likelihood).fit(x, y, num_epochs=2, batch_size=BATCH)
    kwargs = [{}] if name != "laplace" else [
        {"pred_type": "glm", "link_approx": "probit"},
        {"pred_type": "glm", "link_approx": "mc", "num_samples": 5},
        {"pred_type": "nn", "num_samples": 5},
    ]
    loaders = [DataLoader(TensorDataset(x, y), batch_size=7), DataLoader(TensorDataset(x), batch_size=6)]
    for kw in kwargs:
        torch.manual_seed(11)
        on_tensors = method.predict(x, **kw)
        for loader in loaders:
            torch.manual_seed(11)
            on_loader = method.predict(loader, **kw)
            assert type(on_loader) is type(on_tensors)
            for field in ("probs",) if likelihood == "categorical" else ("loc", "scale"):
                torch.testing.assert_close(getattr(on_loader, field), getattr(on_tensors, field), atol=ATOL, rtol=1e-6)
    if name in ("mfvi", "mc-dropout"):  # sampled predictives: S different functions, not one repeated
        assert on_tensors.num_samples > 1 if likelihood == "categorical" else on_tensors.loc.shape[0] > 1
        spread = on_tensors.probs.std(0) if likelihood == "categorical" else on_tensors.loc.std(0)
        assert spread.max() > 1e-4


def test_mc_dropout_masks_shared_by_all_inputs():
    """One thinned network per sample: an input repeated in the batch gets the same output in each sample."""
    torch.manual_seed(0)
    method = MCDropout(make_mlp([2, 16, 2], dropout=0.5), "categorical", num_samples=6)
    x = torch.randn(1, 2).expand(4, 2)
    probs = method.predict(x).probs
    torch.testing.assert_close(probs, probs[:, :1].expand_as(probs))
    assert probs[:, 0].std(0).max() > 1e-3  # and the masks differ between samples


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
@pytest.mark.parametrize("subset", ["all", "last_layer"])
def test_laplace_curvature_over_a_loader_equals_tensors(structure, subset):
    x, y = _data(n=30)
    torch.manual_seed(0)
    net = make_mlp([2, 8, 3])
    on_tensors = Laplace(net, "categorical", hessian_structure=structure, subset=subset)
    on_tensors.fit(x, y, num_epochs=0, tune_prior_precision=False)
    on_loader = Laplace(net, "categorical", hessian_structure=structure, subset=subset)
    on_loader.fit(DataLoader(TensorDataset(x, y), batch_size=7), num_epochs=0, tune_prior_precision=False)
    assert on_loader.prior_precision == on_tensors.prior_precision == 30 * 1e-4
    deltas = torch.tensor([0.1, 1.0, 10.0], dtype=torch.float64)
    torch.testing.assert_close(on_loader.log_marginal_likelihood(deltas), on_tensors.log_marginal_likelihood(deltas),
                               rtol=1e-6, atol=0)
    if structure == "full":  # the curvature itself, float32 sums in another order
        h_loader, h_tensors = ((v * e) @ v.T for e, v in (on_loader._eig, on_tensors._eig))
        torch.testing.assert_close(h_loader, h_tensors, rtol=1e-5, atol=1e-5 * h_tensors.abs().max().item())
    on_loader.prior_precision = on_tensors.prior_precision = 1.0  # a well-conditioned posterior to compare
    torch.testing.assert_close(on_loader.functional_covariance(x), on_tensors.functional_covariance(x),
                               rtol=1e-5, atol=1e-6)


def test_laplace_exact_hessian_over_a_loader_equals_tensors():
    x, y = _data("normal")
    torch.manual_seed(0)
    net = make_mlp([2, 4, 2])
    a = Laplace(net, "normal", curvature="hessian").fit(x, y, num_epochs=0, tune_prior_precision=False)
    b = Laplace(net, "normal", curvature="hessian").fit(_full_loader(x, y, 6), num_epochs=0,
                                                        tune_prior_precision=False)
    torch.testing.assert_close(b.log_marginal_likelihood(), a.log_marginal_likelihood())


def test_loader_batches_follow_the_model_dtype():
    x, y = _data("normal")
    net = make_mlp([2, 8, 2]).double()
    history = train_network(net, DataLoader(TensorDataset(x, y), batch_size=8), likelihood="normal", num_epochs=2)
    assert len(history) == 2 and net[0].weight.dtype == torch.float64
    method = MCDropout(make_mlp([2, 8, 2], dropout=0.1).double(), "normal", num_samples=2)
    pred = method.fit(DataLoader(TensorDataset(x, y), batch_size=8), num_epochs=1).predict(
        DataLoader(TensorDataset(x), batch_size=8))
    assert pred.loc.dtype == torch.float64 and pred.loc.shape == (2, N)


@pytest.mark.parametrize("name", ["map", "mfvi", "mc-dropout", "ensemble", "laplace", "laplace-kron"])
def test_tensors_follow_the_model_dtype_like_loader_batches(name):
    """A float64 network fitted on float32 tensors (and predicting on them) failed with torch's "mat1 and mat2 must
    have the same dtype", while a loader's batches were cast; the tensors are now cast once, and the fit equals the
    one on the same data given in float64."""
    x, y = _data("normal", n=16)
    nets = {"map": lambda: MAPEstimate(make_mlp([2, 4, 2], dtype=torch.float64), "normal"),
            "mfvi": lambda: MeanFieldVI(make_mlp([2, 4, 2], dtype=torch.float64), "normal"),
            "mc-dropout": lambda: MCDropout(make_mlp([2, 4, 2], dropout=0.2, dtype=torch.float64), "normal",
                                            num_samples=2),
            "ensemble": lambda: DeepEnsemble(lambda: make_mlp([2, 4, 2], dtype=torch.float64), "normal", num_members=2),
            "laplace": lambda: Laplace(make_mlp([2, 4, 2], dtype=torch.float64), "normal"),
            "laplace-kron": lambda: Laplace(make_mlp([2, 4, 2], dtype=torch.float64), "normal",
                                            hessian_structure="kron")}
    preds = []
    for xs, ys in ((x, y), (x.double(), y.double())):
        torch.manual_seed(0)
        method = nets[name]().fit(xs, ys, num_epochs=2, batch_size=8)
        torch.manual_seed(1)
        preds.append(method.predict(xs[:5]))
    assert preds[0].loc.dtype == torch.float64
    torch.testing.assert_close(preds[0].loc, preds[1].loc, rtol=0, atol=0)
    torch.testing.assert_close(preds[0].scale, preds[1].scale, rtol=0, atol=0)


# ---------------------------------------------------------------- schedules and clipping on the loader path
def _torch_lr_after(method, loader, **kwargs):
    seen = []

    def factory(opt):
        seen.append(torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1, 2], gamma=0.1))
        return seen[-1]

    method.fit(loader, num_epochs=3, lr=0.1, scheduler=factory, **kwargs)
    return [s.optimizer.param_groups[0]["lr"] for s in seen], [s.last_epoch for s in seen]


@pytest.mark.parametrize("name", ["mc-dropout", "ensemble", "laplace"])
@pytest.mark.parametrize("step", ["epoch", "step"])
def test_torch_schedulers_step_on_the_loader_path(name, step):
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)  # 4 batches per epoch
    lrs, last = _torch_lr_after(_build(name), loader, scheduler_step=step)
    expected_steps = 3 if step == "epoch" else 12
    assert last and all(e == expected_steps for e in last)
    assert all(abs(lr - 0.1 * 0.1**2) < 1e-12 for lr in lrs)


@pytest.mark.parametrize("step", ["epoch", "step"])
def test_pyro_scheduler_steps_on_the_loader_path(step):
    x, y = _data()
    optim = pyro.optim.MultiStepLR(
        {"optimizer": torch.optim.Adam, "optim_args": {"lr": 0.1}, "milestones": [2, 4], "gamma": 0.1}
    )
    _build("map").fit(DataLoader(TensorDataset(x, y), batch_size=BATCH), num_epochs=1, optim=optim,
                      scheduler_step=step)
    lrs = {g["lr"] for sched in optim.optim_objs.values() for g in sched.optimizer.param_groups}
    assert lrs == ({0.1} if step == "epoch" else {0.1 * 0.1**2})  # 1 epoch step vs 4 batch steps


@pytest.mark.parametrize("clip", [{"clip_norm": 0.05}, {"clip_inf_norm": 0.01}])
@pytest.mark.parametrize("name", ["mc-dropout", "ensemble-dropout", "laplace"])
def test_clipping_on_the_loader_path(name, clip):
    x, y = _data()
    results = []
    for kwargs in (clip, {}):
        torch.manual_seed(7)
        on_tensors = _build(name).fit(x, y, num_epochs=2, lr=0.1, batch_size=BATCH, **kwargs)
        torch.manual_seed(7)
        on_loader = _build(name).fit(EpochPermutationLoader(x, y, BATCH), num_epochs=2, lr=0.1, **kwargs)
        _assert_same_weights(on_tensors, on_loader)
        results.append(on_loader)
    clipped, free = (_weights(m) for m in results)
    assert any((clipped[k] - free[k]).abs().max() > 1e-3 for k in clipped)  # the clipping did act


@pytest.mark.parametrize("clip", [{"clip_norm": 0.05}, {"clip_inf_norm": 0.01}])
def test_svi_clipping_on_the_loader_path(clip):
    x, y = _data()
    torch.manual_seed(7)
    on_tensors = _build("map").fit(x, y, num_epochs=3, lr=0.1, batch_size=None, **clip)
    torch.manual_seed(7)
    on_loader = _build("map").fit(_full_loader(x, y), num_epochs=3, lr=0.1, **clip)
    free = _build("map").fit(_full_loader(x, y), num_epochs=3, lr=0.1)
    _assert_same_weights(on_tensors, on_loader)
    assert any((on_loader._store_state["params"][k] - v).abs().max() > 1e-3
               for k, v in free._store_state["params"].items())


# ---------------------------------------------------------------- bad inputs
class _Batches(IterableDataset):
    def __iter__(self):
        yield torch.randn(4, 2), torch.zeros(4, dtype=torch.long)


@pytest.mark.parametrize("name", ["map", "mc-dropout", "ensemble", "laplace"])
def test_bad_training_inputs(name):
    x, y = _data()
    method = _build(name)
    with pytest.raises(TypeError, match="dataset with a length|must have a `dataset`"):
        method.fit(DataLoader(_Batches(), batch_size=None), num_epochs=1)
    with pytest.raises(TypeError, match="dataset"):
        method.fit((b for b in [(x, y)]), num_epochs=1)  # a generator: no dataset, no N
    triples = DataLoader(TensorDataset(x, y, y), batch_size=5)
    with pytest.raises(TypeError, match=r"\(x, y\) pair"):
        method.fit(triples, num_epochs=1)
    with pytest.raises(TypeError, match="x must be a torch.Tensor or a loader"):
        method.fit([x, y], num_epochs=1)
    with pytest.raises(TypeError, match="x must be a torch.Tensor or a loader"):
        method.fit(x.numpy(), y, num_epochs=1)
    with pytest.raises(TypeError, match="y must be omitted"):
        method.fit(DataLoader(TensorDataset(x, y), batch_size=5), y, num_epochs=1)
    with pytest.raises(TypeError, match="y is required"):
        method.fit(x, num_epochs=1)
    with pytest.raises(TypeError, match="categorical labels"):
        method.fit(DataLoader(TensorDataset(x, y.float()), batch_size=5), num_epochs=1)


@pytest.mark.parametrize("name", ["map", "mfvi", "mc-dropout", "ensemble", "laplace"])
@pytest.mark.parametrize("kwargs,error,match", [
    ({"lr": "0.01"}, TypeError, "lr must be a number, got str"),
    ({"weight_decay": "0"}, TypeError, "weight_decay must be a number"),
    ({"batch_size": 2.5}, ValueError, "batch_size must be a positive integer or None, got 2.5"),
    ({"batch_size": True}, ValueError, "batch_size must be a positive integer"),
])
def test_training_hyper_parameters_of_the_wrong_type(name, kwargs, error, match):
    """A string learning rate raised Python's "'>' not supported between 'str' and 'int'"; a fractional batch size
    was silently truncated (2.5 -> 2)."""
    x, y = _data()
    with pytest.raises(error, match=match):
        _build(name).fit(x, y, num_epochs=1, **kwargs)


def test_bad_prediction_inputs():
    x, y = _data()
    method = _build("ensemble").fit(x, y, num_epochs=1)
    with pytest.raises(TypeError, match="x must be a torch.Tensor or a loader"):
        method.predict([x])
    with pytest.raises(TypeError, match="batch 0 of the loader"):
        method.predict(DataLoader(TensorDataset(x, y, y), batch_size=5))


@pytest.mark.parametrize("name", ["map", "mc-dropout", "ensemble", "laplace"])
def test_nan_loss_on_the_loader_path_is_a_clear_error(name):
    x, y = _data()  # finite data (a NaN in the data is refused before any step: test_baseline_data_non_finite.py)
    # a diverging fit (lr = 1e30: the outputs overflow after one step). Pyro's distribution validation stops the
    # SVI baselines first (as on tensors); the others check each epoch.
    error, message = (ValueError, "invalid values") if name == "map" else (FloatingPointError, "became nan in epoch 0")
    with pytest.raises(error, match=message):
        _build(name).fit(DataLoader(TensorDataset(x, y), batch_size=BATCH), num_epochs=2, lr=1e30)


def test_a_loader_that_yields_no_batch_is_an_error_in_fit_and_predict():
    # 3 points, batches of 8, drop_last=True: no batch. A vectorised deep ensemble recorded a loss of 0 for members
    # it never trained, and every predict failed in torch.cat
    x, y = torch.randn(3, 2), torch.tensor([0, 1, 1])
    none = DataLoader(TensorDataset(x, y), batch_size=8, drop_last=True)
    with pytest.raises(ValueError, match="x: the loader yielded no batch in an epoch"):
        DeepEnsemble(lambda: make_mlp([2, 4, 2]), "categorical", num_members=2).fit(none, num_epochs=1)
    methods = [MAPEstimate(make_mlp([2, 4, 2]), "categorical"), MeanFieldVI(make_mlp([2, 4, 2]), "categorical"),
               MCDropout(make_mlp([2, 4, 2], dropout=0.1), "categorical"),
               DeepEnsemble(lambda: make_mlp([2, 4, 2]), "categorical", num_members=2),
               Laplace(make_mlp([2, 4, 2]), "categorical", hessian_structure="diag")]
    for method in methods:
        method.fit(x, y, num_epochs=1)
        with pytest.raises(ValueError, match="x: the loader yielded no batch"):
            method.predict(none)
