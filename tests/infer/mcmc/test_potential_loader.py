# SPDX-License-Identifier: Apache-2.0
"""SG-MCMC on plain Pyro models (no plate indices), over tensors and over a DataLoader."""

import warnings

import arviz as az
import pyro
import pyro.contrib.gp as gp
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, Predictive
from pyro.ops.stats import effective_sample_size
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from pyro_sdebnn.infer.mcmc import FSGLD, SGHMC, SGLD, to_inference_data
from pyro_sdebnn.infer.mcmc.arviz import get_samples, pointwise_log_likelihood
from pyro_sdebnn.infer.mcmc.potential import MinibatchPotential
from pyro_sdebnn.testing import ConjugateLinearRegression

PROBLEM = ConjugateLinearRegression(dim=2, prior_scale=1.0, noise_scale=1.0)
N = 60
BATCH = 20


def plain_model(x, y=None):
    """The model as written for NUTS: no plate indices."""
    w = pyro.sample("w", dist.Normal(x.new_zeros(2), 1.0).to_event(1))
    with pyro.plate("data", len(x)):
        return pyro.sample("y", dist.Normal(x @ w, 1.0), obs=y)


def _data():
    return PROBLEM.generate(N, seed=1, dtype=torch.float64)


def _loader(x, y, *, shuffle=True, batch_size=BATCH, **kwargs):
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle, **kwargs)


def _chains(mcmc):
    return get_samples(mcmc, group_by_chain=True)["w"]  # (chains, draws, D)


@pytest.mark.parametrize("kernel_name", ["sgld", "sghmc"])
@pytest.mark.parametrize("through", ["tensors", "loader"])
def test_plain_model_recovers_the_conjugate_posterior(kernel_name, through):
    x, y = _data()
    mean, cov = PROBLEM.posterior(x, y)
    sd = cov.diagonal().sqrt()
    subsample = BATCH if through == "tensors" else None
    # the chains start from their prior draws (map_steps=0; the warm-up carries them to the posterior): the MAP warm
    # start, which runs chain by chain, is tested with a loader in test_kernel_adaptation.py
    if kernel_name == "sgld":
        kernel = SGLD(plain_model, step_size=2e-3, num_steps=10, subsample_size=subsample, vectorized_chains=16,
                      backend="fx", map_steps=0)
    else:
        kernel = SGHMC(plain_model, step_size=2e-2, friction=10.0, num_steps=10, subsample_size=subsample,
                       vectorized_chains=16, backend="fx", map_steps=0)
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=150, warmup_steps=60, disable_progbar=True)
    mcmc.run(*((x, y) if through == "tensors" else (_loader(x, y),)))
    assert kernel.potential.minibatch_mode == ("slice" if through == "tensors" else "batch")
    w = _chains(mcmc)
    ess = effective_sample_size(w, chain_dim=0, sample_dim=1)
    # the bounds below are meaningful only with enough effective draws: the Monte Carlo error of the mean is then
    # sd / sqrt(ESS) <= 0.07 sd (0.35 sd is 5 of those) and that of the variance sqrt(2 / ESS) <= 0.1
    assert (ess > 200).all(), ess
    flat = w.reshape(-1, 2)
    assert ((flat.mean(0) - mean).abs() < 0.35 * sd).all(), (flat.mean(0), mean, sd)
    ratio = flat.var(0) / cov.diagonal()
    assert ((ratio > 0.6) & (ratio < 1.6)).all(), ratio


def test_plain_and_indexed_models_have_the_same_minibatch_potential():
    x, y = _data()
    idx = torch.tensor([3, 17, 4, 40, 59])
    u = torch.tensor([0.3, -0.7], dtype=torch.float64)
    plain = MinibatchPotential(plain_model, (x, y), subsample_size=5)
    indexed = MinibatchPotential(PROBLEM.model, (x, y), subsample_size=5)
    assert plain.minibatch_mode == "slice" and indexed.minibatch_mode == "index"
    torch.testing.assert_close(plain(u, idx), indexed(u, idx), rtol=1e-12, atol=1e-12)
    # a batch of a loader: the model runs on it, the likelihood scaled by N / b (b = 5 here, the batch's size)
    batch = MinibatchPotential(plain_model, (x[idx], y[idx]), data_size=N)
    assert batch.minibatch_mode == "batch" and batch.data_size == N
    torch.testing.assert_close(batch(u), indexed(u, idx), rtol=1e-12, atol=1e-12)
    expected = -(N / 5 * dist.Normal(x[idx] @ u, 1.0).log_prob(y[idx]).sum() + dist.Normal(0.0, 1.0).log_prob(u).sum())
    torch.testing.assert_close(batch(u), expected, rtol=1e-12, atol=1e-12)


class _SequentialBatches(SGLD):
    """SGLD whose tensor minibatches are the consecutive slices of the data (those of an unshuffled loader)."""

    def _next_indices(self):
        if not self.potential.subsample_sizes:
            return None
        b = self.potential.batch_size
        start = (self._batch_pos * b) % self.potential.data_size
        self._batch_pos += 1
        return torch.arange(start, start + b)


def test_loader_and_tensors_with_the_same_batches_give_the_same_samples():
    x, y = _data()
    init = {"w": torch.tensor([0.5, -0.5], dtype=torch.float64)}

    def run(kernel, *args):
        pyro.set_rng_seed(3)
        mcmc = MCMC(kernel, num_samples=10, warmup_steps=5, initial_params=init, disable_progbar=True)
        mcmc.run(*args)
        return mcmc.get_samples()["w"]

    on_tensors = run(_SequentialBatches(plain_model, step_size=1e-3, num_steps=4, subsample_size=BATCH,
                                        backend="fx"), x, y)
    # an unshuffled loader with its own generator: the global random stream drives only the noise, as above
    loader = _loader(x, y, shuffle=False, generator=torch.Generator().manual_seed(0))
    on_loader = run(SGLD(plain_model, step_size=1e-3, num_steps=4, backend="fx"), loader)
    torch.testing.assert_close(on_loader, on_tensors, rtol=1e-12, atol=1e-12)


def test_last_smaller_batch_has_its_own_graph_scaled_by_its_own_size():
    # 60 = 2 x 25 + 10: the batch of 10 gets its own traced graph (traced once, not once per epoch), scaled by 60 / 10
    x, y = _data()
    eager_steps = []

    class Recording(SGLD):
        def _eager_step(self, state, idx, step_size, *extra):
            eager_steps.append(self.potential.model_args[0].shape[0])
            return super()._eager_step(state, idx, step_size, *extra)

    kernel = Recording(plain_model, step_size=1e-3, num_steps=3, backend="fx")
    mcmc = MCMC(kernel, num_samples=4, warmup_steps=0, disable_progbar=True)
    mcmc.run(_loader(x, y, shuffle=False, batch_size=25))
    assert eager_steps == [] and kernel.backend_used == "fx"
    assert sorted(shapes[0][0] for shapes in kernel._graph_modules) == [10, 25]  # four epochs, two graphs
    w = mcmc.get_samples()["w"][0]
    xb, yb = x[50:], y[50:]
    expected = -(6.0 * dist.Normal(xb @ w, 1.0).log_prob(yb).sum() + dist.Normal(0.0, 1.0).log_prob(w).sum())
    _, value = kernel._traced_step(kernel._init_state(w), None, torch.tensor(0.0, dtype=w.dtype), (), (xb, yb))
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)


def test_last_smaller_batch_runs_eagerly_in_the_first_epoch_and_traced_after():
    # a one-epoch run does not pay a trace for its one short batch; from the second epoch on it has its own graph
    x, y = _data()
    eager_steps = []

    class Recording(SGLD):
        def _eager_step(self, state, idx, step_size, *extra):
            eager_steps.append(self._t)
            return super()._eager_step(state, idx, step_size, *extra)

    kernel = Recording(plain_model, step_size=1e-3, num_steps=3, backend="fx", map_steps=0)
    MCMC(kernel, num_samples=1, warmup_steps=0, disable_progbar=True).run(_loader(x, y, shuffle=False, batch_size=25))
    assert eager_steps == [2] and [shapes[0][0] for shapes in kernel._graph_modules] == [25]  # 25, 25, then 10
    MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True).run(_loader(x, y, shuffle=False, batch_size=25))
    assert eager_steps == [2, 2] and sorted(shapes[0][0] for shapes in kernel._graph_modules) == [10, 25]


def test_loader_run_gives_full_data_log_likelihood_loo_and_predictive():
    x, y = _data()
    kernel = SGHMC(plain_model, step_size=2e-2, friction=10.0, num_steps=5, vectorized_chains=4, backend="fx")
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=40, warmup_steps=40, disable_progbar=True)
    loader = _loader(x, y)
    mcmc.run(loader)
    state = torch.get_rng_state()
    idata = to_inference_data(mcmc)
    assert torch.equal(torch.get_rng_state(), state)  # a shuffling loader's pass leaves the random state alone
    assert idata.posterior["w"].shape == (4, 40, 2)  # vectorised chains as ArviZ chains
    assert idata.log_likelihood["y"].shape == (4, 40, N)  # every data point, not a batch
    assert sorted(idata.observed_data["y"].values.tolist()) == sorted(y.tolist())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LOO may warn about Pareto k on 160 draws
        loo = az.loo(idata)
    assert loo.n_data_points == N
    samples = get_samples(mcmc)
    ll_loader = pointwise_log_likelihood(plain_model, samples, _loader(x, y, shuffle=False))["y"]
    ll_tensors = pointwise_log_likelihood(plain_model, samples, x, y)["y"]
    torch.testing.assert_close(ll_loader, ll_tensors)
    x_new = torch.linspace(-1, 1, 14, dtype=torch.float64).reshape(7, 2)
    assert Predictive(plain_model, samples)(x_new)["y"].shape == (160, 7)


def test_arviz_from_pyro_reads_the_whole_loader():
    # ArviZ's own converter calls kernel.model(*mcmc._args), i.e. with the loader: the kernel's model view runs the
    # model once on all N points (the loader's batches concatenated)
    def model(x, y=None):  # plain_model written so that ArviZ's vectorised log-likelihood can batch the draws
        w = pyro.sample("w", dist.Normal(x.new_zeros(2), 1.0).to_event(1))
        with pyro.plate("data", len(x)):
            return pyro.sample("y", dist.Normal((x * w.unsqueeze(-2)).sum(-1), 1.0), obs=y)

    x, y = _data()
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(model, step_size=1e-3, num_steps=2, backend="fx"), num_samples=10, warmup_steps=5,
                disable_progbar=True)
    mcmc.run(_loader(x, y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        idata = az.from_pyro(mcmc)
    ll = idata.log_likelihood["y"].values  # (chains, draws, N)
    assert ll.shape == (1, 10, N)
    ours = to_inference_data(mcmc).log_likelihood["y"].values
    # the same points, possibly in another order (a shuffling loader): compare each draw's sorted values
    torch.testing.assert_close(torch.as_tensor(ll).sort(-1).values, torch.as_tensor(ours).sort(-1).values)
    assert sorted(idata.observed_data["y"].values.tolist()) == sorted(y.tolist())
    assert mcmc.kernel.model(x[:5], y[:5]).shape == (5,)  # tensors go to the model unchanged
    state = torch.get_rng_state()  # reading a shuffling loader leaves torch's random state alone
    with pyro.poutine.condition(data={"w": x.new_zeros(2)}):
        trace = pyro.poutine.trace(mcmc.kernel.model).get_trace(_loader(x, y))
    assert torch.equal(torch.get_rng_state(), state) and trace.nodes["y"]["value"].shape == (N,)


@pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")  # 5 draws: R-hat above 1.1
def test_vectorised_chains_over_a_loader_are_distinct_chains():
    x, y = _data()
    kernel = SGLD(plain_model, step_size=1e-3, num_steps=2, vectorized_chains=3, backend="fx")
    pyro.set_rng_seed(1)
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=0, disable_progbar=True)
    mcmc.run(_loader(x, y))
    w = _chains(mcmc)
    assert w.shape == (3, 5, 2)
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])


def test_pyromodule_on_float64_gets_float32_batches_in_its_dtype():
    from pyro.nn import PyroModule, PyroSample

    class Scaled(PyroModule):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.ones(2, dtype=torch.float64))  # the module's dtype: float64
            self.w = PyroSample(dist.Normal(torch.zeros(2, dtype=torch.float64), 1.0).to_event(1))

        def forward(self, x, y=None):
            f = (x * self.scale) @ self.w
            with pyro.plate("data", len(x)):
                return pyro.sample("y", dist.Normal(f, 1.0), obs=y)

    x, y = _data()
    kernel = SGLD(Scaled(), step_size=1e-3, num_steps=2, backend="fx")
    mcmc = MCMC(kernel, num_samples=3, warmup_steps=0, disable_progbar=True)
    mcmc.run(_loader(x.float(), y.float()))  # float32 batches, cast to float64 one at a time
    assert kernel.potential.dtype == torch.float64
    assert mcmc.get_samples()["w"].dtype == torch.float64


def _local_latent_model(x, y=None):
    w = pyro.sample("w", dist.Normal(x.new_zeros(2), 1.0).to_event(1))
    with pyro.plate("data", len(x)):
        z = pyro.sample("z", dist.Normal(x.new_zeros(()), 1.0))
        return pyro.sample("y", dist.Normal(x @ w + z, 1.0), obs=y)


@pytest.mark.parametrize("through", ["tensors", "loader"])
def test_local_latent_in_the_data_plate_is_a_clear_error(through):
    x, y = _data()
    subsample = BATCH if through == "tensors" else None
    mcmc = MCMC(SGLD(_local_latent_model, step_size=1e-3, subsample_size=subsample), num_samples=2,
                warmup_steps=0, disable_progbar=True)
    with pytest.raises(ValueError, match="Latent site 'z' is sampled inside the data plate 'data'.*local latent"):
        mcmc.run(*((x, y) if through == "tensors" else (_loader(x, y),)))


class _Stream(IterableDataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return iter(zip(self.x, self.y))


def test_bad_loaders_and_arguments_are_named():
    x, y = _data()

    def run(kernel, *args):
        MCMC(kernel, num_samples=1, warmup_steps=0, disable_progbar=True).run(*args)

    with pytest.raises(TypeError, match="must have a `dataset` with a length"):
        run(SGLD(plain_model), DataLoader(_Stream(x, y), batch_size=10))
    with pytest.raises(TypeError, match="must have a `dataset` with a length"):
        run(SGLD(plain_model), ((x[i : i + 10], y[i : i + 10]) for i in range(0, N, 10)))
    triples = DataLoader(TensorDataset(x, y, y), batch_size=10)
    # a triple is passed as model(x, y, y): it does not fit plain_model(x, y=None), which the message shows
    with pytest.raises(TypeError, match=r"batch 0 of the loader is a list of length 3, passed as model\(\*batch\).*"
                                        r"\(x, y=None\): too many positional arguments"):
        run(SGLD(plain_model), triples)
    with pytest.raises(ValueError, match="subsample_size must be None with a loader"):
        run(SGLD(plain_model, subsample_size=10), _loader(x, y))
    with pytest.raises(TypeError, match="a loader must be the only positional argument"):
        run(SGLD(plain_model), _loader(x, y), y)
    with pytest.raises(ValueError, match="fSGLD over a loader needs measurement_points="):
        run(FSGLD(plain_model, gp_prior=gp.kernels.RBF(2)), _loader(x, y))


def test_an_empty_loader_is_named_by_the_run_and_by_kernel_model():
    # both ways into the model refuse a loader over an empty data set with a ValueError that says so (the model view
    # used to fail on the first of no batches, with an IndexError)
    empty = DataLoader(TensorDataset(torch.zeros(0, 2), torch.zeros(0)), batch_size=10)
    kernel = SGLD(plain_model)
    with pytest.raises(ValueError, match=r"the loader's dataset is empty \(len\(loader.dataset\) = 0\)"):
        MCMC(kernel, num_samples=1, warmup_steps=0, disable_progbar=True).run(empty)
    with pytest.raises(ValueError, match=r"kernel.model\(loader\): the loader \(DataLoader\) is empty"):
        kernel.model(empty)
    x, y = _data()  # a loader with data still reaches the model, on all N points
    assert pyro.poutine.trace(kernel.model).get_trace(_loader(x, y)).nodes["y"]["value"].shape == (N,)


def test_plain_model_without_data_arguments_of_the_plate_size_is_explained():
    x, y = _data()

    def model(x, y=None):  # the plate is over len(x), but the data are reshaped: nothing has the leading size N
        w = pyro.sample("w", dist.Normal(x.new_zeros(2), 1.0).to_event(1))
        with pyro.plate("data", len(x)):
            pyro.sample("y", dist.Normal(x @ w, 1.0), obs=y)

    with pytest.raises(ValueError, match="take the data as arguments whose leading dimension is the plate's size 60"):
        MinibatchPotential(model, (x, y.reshape(1, N)), subsample_size=10)


@pytest.mark.parametrize("concatenate_inputs", [None, False])
def test_functional_kernel_takes_a_plain_model_over_tensors(concatenate_inputs):
    x = torch.linspace(-1, 1, 20).unsqueeze(-1)
    y = torch.sin(3 * x[:, 0])

    def model(indexed):
        def fn(x, y=None):
            w = pyro.sample("w", dist.Normal(torch.zeros(1, 5), 1.0).to_event(2))
            with pyro.plate("data", len(x)) as i:
                xs = x[i] if indexed else x
                f = pyro.deterministic("f", torch.tanh(xs @ w).sum(-1))
                pyro.sample("obs", dist.Normal(f, 0.1), obs=None if y is None else (y[i] if indexed else y))

        return fn

    kernels = []
    for indexed in (True, False):
        kernel = FSGLD(model(indexed), gp_prior=gp.kernels.RBF(1), subsample_size=10, num_measurement_data=5,
                       num_measurement_box=5, concatenate_inputs=concatenate_inputs)
        pyro.set_rng_seed(0)
        kernel.setup(0, x, y)
        kernels.append(kernel)
    assert kernels[1].potential.minibatch_mode == "slice"
    u = torch.linspace(-1, 1, kernels[0].potential.dim)
    points, factor = kernels[0]._potential_and_grad_inputs()
    idx = torch.arange(3, 13)
    torch.testing.assert_close(kernels[1]._potential_fn(u, idx, points, factor),
                               kernels[0]._potential_fn(u, idx, points, factor))


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")),
]


@pytest.mark.parametrize("device", DEVICES)
def test_loader_batches_follow_the_module_device(device, tmp_path):
    from pyro.nn import PyroModule, PyroSample

    from pyro_sdebnn.infer.mcmc import resume_run, save_run

    class OnDevice(PyroModule):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.ones(2, dtype=torch.float64, device=device))
            self.w = PyroSample(dist.Normal(torch.zeros(2, dtype=torch.float64, device=device), 1.0).to_event(1))

        def forward(self, x, y=None):
            f = (x * self.scale) @ self.w
            with pyro.plate("data", len(x)):
                return pyro.sample("y", dist.Normal(f, 1.0), obs=y)

    x, y = _data()  # on the CPU: the loader pins them and the kernel moves one batch at a time
    loader = _loader(x, y, pin_memory=device == "cuda")
    model = OnDevice()
    mcmc = MCMC(SGHMC(model, step_size=1e-2, num_steps=2, backend="fx"), num_samples=4, warmup_steps=2,
                disable_progbar=True)
    mcmc.run(loader)
    assert mcmc.get_samples()["w"].device.type == device
    assert to_inference_data(mcmc).log_likelihood["y"].shape == (1, 4, N)
    save_run(mcmc, tmp_path / "run.pt")
    resumed = resume_run(tmp_path / "run.pt", SGHMC(model, step_size=1e-2, num_steps=2, backend="fx"), loader,
                         num_samples=2, disable_progbar=True)
    assert resumed.get_samples()["w"].shape == (6, 2) and resumed.get_samples()["w"].device.type == device


def test_iterable_model_arguments_are_not_taken_for_loaders():
    x, y = _data()
    net = torch.nn.Sequential(torch.nn.Identity()).double()  # iterable, but a model argument

    def model(x, y, net):
        w = pyro.sample("w", dist.Normal(x.new_zeros(2), 1.0).to_event(1))
        with pyro.plate("data", len(x)):
            pyro.sample("y", dist.Normal(net(x) @ w, 1.0), obs=y)

    kernel = SGLD(model, step_size=1e-3, subsample_size=10, backend="eager")
    MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True).run(x, y, net)
    assert kernel._stream is None and kernel.potential.minibatch_mode == "slice"


@pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")  # 6 draws: R-hat above 1.1
def test_log_likelihood_and_observed_data_are_in_data_set_order():
    # a shuffling loader that drops its last batch (60 = 3 x 17 + 9) and draws its order from its own generator:
    # to_inference_data, pointwise_log_likelihood and ArviZ's own converter read every point once, in data-set order,
    # and leave the loader's generator and torch's random state alone
    x, y = _data()
    g = torch.Generator().manual_seed(3)
    loader = _loader(x, y, batch_size=17, drop_last=True, generator=g)
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(plain_model, step_size=1e-3, num_steps=2, vectorized_chains=2, backend="eager"), num_samples=6,
                warmup_steps=3, disable_progbar=True)
    mcmc.run(loader)
    samples = get_samples(mcmc)
    states = torch.get_rng_state(), g.get_state()
    idata = to_inference_data(mcmc)
    ll_loader = pointwise_log_likelihood(plain_model, samples, loader)["y"]
    assert torch.equal(torch.get_rng_state(), states[0]) and torch.equal(g.get_state(), states[1])
    ll_tensors = pointwise_log_likelihood(plain_model, samples, x, y)["y"]
    torch.testing.assert_close(ll_loader, ll_tensors)
    torch.testing.assert_close(torch.as_tensor(idata.log_likelihood["y"].values).flatten(0, 1), ll_tensors)
    assert torch.equal(torch.as_tensor(idata.observed_data["y"].values), y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        theirs = az.from_pyro(mcmc, log_likelihood=False)  # plain_model does not vectorise over draws
    assert torch.equal(torch.as_tensor(theirs.observed_data["y"].values), y)


def test_a_non_finite_batch_is_named_with_its_argument_batch_and_index():
    x, y = _data()
    x = x.clone()
    x[47, 1] = float("nan")  # batch 2 of an unshuffled loader of batches of 20, row 7

    def model(x_train, y_train=None):
        return plain_model(x_train, y_train)

    for kernel in (SGLD(model, step_size=1e-3, num_steps=2), SGHMC(model, step_size=1e-3, num_steps=2)):
        mcmc = MCMC(kernel, num_samples=5, warmup_steps=5, disable_progbar=True)
        with pytest.raises(ValueError, match=r"x_train contains NaN at index \(7, 1\) of batch 2 of the loader"):
            mcmc.run(_loader(x, y, shuffle=False))
    y = y.clone()
    y[3] = float("inf")  # the first batch: found before the potential is built or the warm start runs
    with pytest.raises(ValueError, match=r"y contains Inf at index \(3,\) of batch 0 of the loader"):
        MCMC(SGLD(plain_model, step_size=1e-3), num_samples=2, warmup_steps=0, disable_progbar=True).run(
            _loader(x, y, shuffle=False)
        )


def _fixed_batch_model(x, y=None):
    """A model that subsamples its own plate: Pyro's plate cannot run it on fewer than BATCH points."""
    w = pyro.sample("w", dist.Normal(x.new_zeros(2), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=BATCH) as idx:
        return pyro.sample("y", dist.Normal(x[idx] @ w, 1.0), obs=None if y is None else y[idx])


@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_a_plate_with_its_own_subsample_size_passes_over_the_short_last_batch(backend):
    # 66 = 3 x 20 + 6 points: the batch of 6 is passed over as drop_last=True would (the samples are those of the
    # drop_last loader, bitwise), and the full-data log-likelihood still covers all 66 points in data-set order
    x, y = PROBLEM.generate(66, seed=1, dtype=torch.float64)
    runs = {}
    for drop_last in (False, True):
        pyro.set_rng_seed(0)
        mcmc = MCMC(SGLD(_fixed_batch_model, step_size=1e-3, num_steps=3, backend=backend, map_steps=0),
                    num_samples=6, warmup_steps=3, disable_progbar=True)
        mcmc.run(_loader(x, y, drop_last=drop_last, generator=torch.Generator().manual_seed(0)))
        runs[drop_last] = mcmc
    torch.testing.assert_close(runs[False].get_samples()["w"], runs[True].get_samples()["w"], rtol=0, atol=0)
    assert runs[False].kernel._stream.fixed_batch_size == BATCH
    samples = get_samples(runs[False])
    ll = to_inference_data(runs[False]).log_likelihood["y"].values.reshape(6, 66)
    torch.testing.assert_close(torch.as_tensor(ll), pointwise_log_likelihood(plain_model, samples, x, y)["y"])
    with pytest.raises(ValueError, match=r"already subsamples \(subsample_size=20\)"):  # batches of 21: it does
        MCMC(SGLD(_fixed_batch_model, step_size=1e-3, map_steps=0), num_samples=2, warmup_steps=0,
             disable_progbar=True).run(_loader(x, y, batch_size=BATCH + 1))


def _batch_sizes_seen(loader, **kwargs):
    """The batch sizes of the eager steps of a short SGLD run over ``loader``, and the kernel."""
    sizes = []

    class Recording(SGLD):
        def _eager_step(self, state, idx, step_size, *extra):
            sizes.append(self.potential.model_args[0].shape[0])
            return super()._eager_step(state, idx, step_size, *extra)

    kernel = Recording(plain_model, step_size=1e-3, num_steps=4, backend="eager", map_steps=0, **kwargs)
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=4, warmup_steps=2, disable_progbar=True)
    mcmc.run(loader)
    return sizes, mcmc


def test_a_reshuffling_loader_passes_over_its_short_last_batch_by_default():
    # 66 = 3 x 20 + 6 points, 24 inner steps = 6 epochs of the 3 full batches: the batch of 6 (scaled by 66 / 6) is
    # never a step; the samples are bitwise those of the loader built with drop_last=True
    x, y = PROBLEM.generate(66, seed=1, dtype=torch.float64)
    sizes, default = _batch_sizes_seen(_loader(x, y, generator=torch.Generator().manual_seed(0)))
    assert sizes == [BATCH] * 24
    # once per epoch that the run read to its end: at least the 5 that the steps completed
    assert default.kernel.diagnostics()["batches passed over"] >= 5
    _, dropped = _batch_sizes_seen(_loader(x, y, generator=torch.Generator().manual_seed(0), drop_last=True))
    torch.testing.assert_close(default.get_samples()["w"], dropped.get_samples()["w"], rtol=0, atol=0)
    assert dropped.kernel.diagnostics()["batches passed over"] == 0


def test_the_short_last_batch_is_kept_when_asked_and_for_an_unshuffled_loader():
    x, y = PROBLEM.generate(66, seed=1, dtype=torch.float64)
    kept, mcmc = _batch_sizes_seen(_loader(x, y, generator=torch.Generator().manual_seed(0)), drop_last=False)
    assert kept[:8] == [BATCH, BATCH, BATCH, 6, BATCH, BATCH, BATCH, 6]
    assert mcmc.kernel.diagnostics()["batches passed over"] == 0
    in_order, _ = _batch_sizes_seen(_loader(x, y, shuffle=False))  # passing it over would drop x[60:] every epoch
    assert in_order[:4] == [BATCH, BATCH, BATCH, 6]
    forced, _ = _batch_sizes_seen(_loader(x, y, shuffle=False), drop_last=True)
    assert set(forced) == {BATCH}
    one_batch, _ = _batch_sizes_seen(_loader(x[:15], y[:15]))  # fewer points than batch_size: the only batch
    assert set(one_batch) == {15}
    with pytest.raises(TypeError, match="drop_last must be None"):
        SGLD(plain_model, drop_last="yes")
