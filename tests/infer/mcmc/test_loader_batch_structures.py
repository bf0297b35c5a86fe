# SPDX-License-Identifier: Apache-2.0
"""SG-MCMC over loaders whose batches are not (x, y) pairs: triples, dicts and single tensors.

One rule (``pyro_sdebnn.data.loaders.batch_arguments``): a tuple or list batch is ``model(*batch)``, a dict batch
``model(**batch)``, a tensor ``model(batch)``.
"""

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, Predictive
from torch.utils.data import DataLoader, Dataset, TensorDataset

from pyro_sdebnn.infer.mcmc import SGHMC, SGLD, resume_run, save_run, to_inference_data
from pyro_sdebnn.infer.mcmc.diagnostics import SamplerWarning

N, BATCH = 10, 4  # batches of 4, 4 and a short last one of 2
U_AT = torch.tensor([0.3, -0.7], dtype=torch.float64)


def model3(x, t, y=None):
    """A model of three arguments: inputs, an offset per data point, targets."""
    w = pyro.sample("w", dist.Normal(x.new_zeros(2), 1.0).to_event(1))
    mean = pyro.deterministic("mean", x @ w + t)
    with pyro.plate("data", len(x)):
        return pyro.sample("y", dist.Normal(mean, 1.0), obs=y)


def model1(y):
    """A model of one argument (``model(batch)`` for a loader of single tensors)."""
    mu = pyro.sample("mu", dist.Normal(y.new_zeros(()), 1.0))
    with pyro.plate("data", len(y)):
        return pyro.sample("y", dist.Normal(mu, 1.0), obs=y)


class DictData(Dataset):
    def __init__(self, **columns):
        self.columns = columns

    def __len__(self):
        return len(next(iter(self.columns.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.columns.items()}


class Rows(Dataset):
    def __init__(self, y):
        self.y = y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.y[i]


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, generator=g, dtype=torch.float64)
    t = torch.randn(N, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -0.5], dtype=torch.float64) + t + torch.randn(N, generator=g, dtype=torch.float64)
    return x, t, y


def _loader(structure, *, shuffle=True, seed=0, batch_size=BATCH):
    x, t, y = _data()
    data = {"tuple": lambda: TensorDataset(x, t, y), "dict": lambda: DictData(x=x, t=t, y=y),
            "tensor": lambda: Rows(y)}[structure]()
    return DataLoader(data, batch_size=batch_size, shuffle=shuffle, generator=torch.Generator().manual_seed(seed))


def _model(structure):
    return model1 if structure == "tensor" else model3


def _hand_potential(structure, rows, u):
    """-(N/b sum_B log p(y_i | ...) + log p(w)): the minibatch potential written out for the batch ``rows``."""
    x, t, y = (v[rows] for v in _data())
    b = len(rows)
    if structure == "tensor":
        log_lik = dist.Normal(u[0], 1.0).log_prob(y).sum()
        prior = dist.Normal(0.0, 1.0).log_prob(u[0])
    else:
        log_lik = dist.Normal(x @ u + t, 1.0).log_prob(y).sum()
        prior = dist.Normal(0.0, 1.0).log_prob(u).sum()
    return -(N / b * log_lik + prior)


@pytest.mark.parametrize("structure", ["tuple", "dict", "tensor"])
def test_the_minibatch_potential_is_scaled_by_n_over_b_also_on_the_short_last_batch(structure):
    kernel = SGLD(_model(structure), step_size=1e-3, map_steps=0, backend="eager")
    kernel.setup(0, _loader(structure, shuffle=False))
    u = U_AT[:1] if structure == "tensor" else U_AT
    for rows in (range(0, 4), range(4, 8), range(8, 10)):  # the loader's three batches, the last of 2 points
        data = kernel._next_data()
        assert data[0].shape[0] == len(rows)
        with kernel.potential.bound_data(data):
            value = kernel.potential(u)
        torch.testing.assert_close(value, _hand_potential(structure, torch.tensor(list(rows)), u),
                                   rtol=1e-12, atol=1e-12)


def _run(structure, make, *, num_chains=1, num_samples=6, loader_seed=0):
    pyro.set_rng_seed(1)
    mcmc = MCMC(make(), num_samples=num_samples, warmup_steps=4, num_chains=num_chains, disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplerWarning)  # a few draws do not mix: R-hat would warn
        mcmc.run(_loader(structure, seed=loader_seed))
    return mcmc


@pytest.mark.parametrize("options", [{"vectorized_chains": 2, "backend": "fx"}, {"num_chains": 2}])
def test_dict_and_tuple_batches_give_the_same_chains(options):
    # the same data as (x, t, y) triples and as {"x", "t", "y"} dicts, the same seeds: the same chains, bit for bit
    chains = options.get("num_chains", 1)
    settings = {k: v for k, v in options.items() if k != "num_chains"}

    def make():
        return SGHMC(model3, step_size=1e-2, num_steps=2, **settings)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "num_chains=2 is more than available_cpu", UserWarning)
        runs = {s: _run(s, make, num_chains=chains) for s in ("tuple", "dict")}
    w = {s: m.get_samples(group_by_chain=True)["w"] for s, m in runs.items()}
    assert w["tuple"].shape == (2, 6, 2) and torch.isfinite(w["tuple"]).all()
    assert not torch.equal(w["tuple"][0], w["tuple"][1])  # two distinct chains
    assert torch.equal(w["tuple"], w["dict"])
    assert "acceptance rate" not in runs["dict"].diagnostics()  # SG-MCMC has no accept/reject step


def test_a_loader_of_single_tensors_samples_the_conjugate_posterior_mean():
    # model1 is y_i ~ N(mu, 1), mu ~ N(0, 1): the posterior of mu is N(sum y / (N + 1), 1 / (N + 1))
    y = _data()[2]
    kernel = SGLD(model1, step_size=2e-2, num_steps=5, vectorized_chains=8, backend="fx")
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=100, warmup_steps=40, disable_progbar=True)
    mcmc.run(_loader("tensor"))
    mu = mcmc.get_samples()["mu"]
    sd = (1 / (N + 1)) ** 0.5
    # 800 autocorrelated draws: the Monte Carlo error of the mean is well below 0.1 sd; 0.5 sd leaves room for the
    # step-size bias of SGLD and the minibatch noise
    assert abs(float(mu.mean()) - float(y.sum()) / (N + 1)) < 0.5 * sd


@pytest.mark.parametrize("structure", ["tuple", "dict", "tensor"])
def test_inference_data_and_predictive_follow_the_data_set_order(structure):
    mcmc = _run(structure, lambda: SGLD(_model(structure), step_size=1e-3, num_steps=2), num_samples=4)
    x, t, y = _data()
    samples = mcmc.get_samples()
    idata = to_inference_data(mcmc)
    assert torch.equal(torch.as_tensor(idata.observed_data["y"].values), y)  # row i is loader.dataset[i]
    if structure == "tensor":
        expected = dist.Normal(samples["mu"][:, None], 1.0).log_prob(y)
    else:
        expected = dist.Normal(samples["w"] @ x.T + t, 1.0).log_prob(y)
    torch.testing.assert_close(torch.as_tensor(idata.log_likelihood["y"].values)[0], expected, rtol=1e-12,
                               atol=1e-12)
    if structure != "tensor":  # the model's deterministic site over the whole loader, in data-set order
        mean = Predictive(mcmc.kernel.model, samples, return_sites=["mean"])(_loader(structure))["mean"]
        assert mean.shape == (4, 1, N)  # Pyro's Predictive keeps a plate dimension for a deterministic site
        torch.testing.assert_close(mean[:, 0], samples["w"] @ x.T + t, rtol=1e-12, atol=1e-12)


def test_resume_over_a_dict_loader_is_bitwise(tmp_path):
    def make():
        return SGLD(model3, step_size=1e-3, num_steps=3, map_steps=0)

    full = _run("dict", make, num_samples=6)
    first = _run("dict", make, num_samples=3)
    save_run(first, tmp_path / "run.pt")
    resumed = resume_run(tmp_path / "run.pt", make(), _loader("dict"), num_samples=3, disable_progbar=True)
    assert torch.equal(resumed.get_samples()["w"], full.get_samples()["w"])


def _run_on(loader, model=model3, **kwargs):
    MCMC(SGLD(model, step_size=1e-3, map_steps=0), num_samples=3, warmup_steps=0, disable_progbar=True).run(
        loader, **kwargs)


def test_batches_that_cannot_reach_the_model_are_clear_errors():
    x, t, y = _data()
    with pytest.raises(TypeError, match=r"batch 0 of the loader is a dict with keys \['x', 'z', 'y'\], passed as "
                                        r"model\(\*\*batch\).*parameters \(x, t, y=None\)"):
        _run_on(DataLoader(DictData(x=x, z=t, y=y), batch_size=BATCH))
    with pytest.raises(ValueError, match=r"batch 0 of the loader is a dict with the keys \['t'\], which are also "
                                         r"given as keyword arguments"):
        _run_on(DataLoader(DictData(x=x, t=t, y=y), batch_size=BATCH), t=t[:BATCH])

    def uneven(rows):  # a collate_fn that builds tensors of different batch sizes
        x, t, y = (torch.stack(c) for c in zip(*rows))
        return x, t[:-1], y

    with pytest.raises(ValueError, match=r"batch 0 of the loader: its tensors must share their first \(batch\) "
                                         r"dimension.*'x': 4, 't': 3, 'y': 4"):
        _run_on(DataLoader(TensorDataset(x, t, y), batch_size=BATCH, collate_fn=uneven))

    def changing(rows):  # the second batch comes as a dict
        x, t, y = (torch.stack(c) for c in zip(*rows))
        return (x, t, y) if len(rows) == BATCH and float(t[0]) == float(_data()[1][0]) else {"x": x, "t": t, "y": y}

    for run in (_run_on, SGLD(model3, step_size=1e-3).model):  # the sampler's reading and kernel.model(loader)'s
        with pytest.raises(ValueError, match="batch 1 of the loader has another structure than its first batch"):
            run(DataLoader(TensorDataset(x, t, y), batch_size=BATCH, collate_fn=changing))
        with pytest.raises(TypeError, match=r"batch 0 of the loader: argument 'name' holds a str, not a tensor"):
            run(DataLoader(DictData(x=x, t=t, y=y, name=["a"] * N), batch_size=BATCH))
    with pytest.raises(ValueError, match=r"y contains NaN at index \(1,\) of batch 2 of the loader"):
        _run_on(DataLoader(DictData(x=x, t=t, y=torch.where(torch.arange(N) == 9, math.nan, y)), batch_size=BATCH))


@pytest.mark.parametrize("structure", ["tuple", "dict"])
def test_every_batch_is_read_in_one_pass_and_checked_once(structure, monkeypatch):
    import pyro_sdebnn.infer.mcmc.potential as potential

    calls = []
    for name in ("read_batch", "check_finite_tensors"):
        real = getattr(potential, name)
        monkeypatch.setattr(potential, name,
                            lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    # 5 steps over an unshuffled loader of batches of 4, 4 and 2 (kept): batches 0, 1, 2 and, in the next epoch, 0, 1;
    # the potential, built on the first batch at set-up, checks the model's arguments once more
    MCMC(SGLD(model3, step_size=1e-3, map_steps=0), num_samples=5, warmup_steps=0, disable_progbar=True).run(
        _loader(structure, shuffle=False))
    one = ["read_batch", "check_finite_tensors"]
    assert calls == one + ["check_finite_tensors"] + one * 4


def test_a_passed_over_short_batch_is_not_checked():
    x, t, y = _data()
    y = torch.where(torch.arange(N) == 9, math.nan, y)  # in the short last batch (rows 8 and 9)
    loader = DataLoader(TensorDataset(x, t, y), batch_size=BATCH)
    for drop_last in (True, False):
        mcmc = MCMC(SGLD(model3, step_size=1e-3, map_steps=0, drop_last=drop_last), num_samples=5, warmup_steps=0,
                    disable_progbar=True)
        if drop_last:
            mcmc.run(loader)  # batches 0, 1, (2 passed over), 0, 1, (2), 0
            assert mcmc.kernel.diagnostics()["batches passed over"] == 2
        else:
            with pytest.raises(ValueError, match=r"y contains NaN at index \(1,\) of batch 2 of the loader"):
                mcmc.run(loader)


def test_functional_kernel_takes_dict_batches_as_it_takes_tuples():
    # fSGLD concatenates the batch's data arguments with the measurement points': a dict batch's keys are data too
    import pyro.contrib.gp as gp

    from pyro_sdebnn.infer.mcmc import FSGLD
    from pyro_sdebnn.infer.mcmc.functional import MeasurementPoints

    x = _data()[0]
    measurement = {"tuple": lambda p: ((p, p.new_zeros(len(p))), {}),
                   "dict": lambda p: ((), {"x": p, "t": p.new_zeros(len(p))})}

    def make(structure):
        return lambda: FSGLD(model3, step_size=1e-3, num_steps=2, gp_prior=gp.kernels.RBF(2), output_site="mean",
                             measurement_points=MeasurementPoints(x), measurement_args=measurement[structure])

    w = {s: _run(s, make(s), num_samples=4).get_samples()["w"] for s in ("tuple", "dict")}
    assert torch.isfinite(w["tuple"]).all() and torch.equal(w["tuple"], w["dict"])
