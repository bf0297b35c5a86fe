# SPDX-License-Identifier: Apache-2.0
"""SG-MCMC kernels inside Pyro's MCMC runner, Predictive and ArviZ; bad inputs and divergences."""

import warnings

import arviz as az
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, Predictive
from pyro.nn import PyroModule, PyroSample

from pyro_sdebnn.infer.mcmc import SGHMC, SGLD, to_inference_data
from pyro_sdebnn.infer.mcmc.arviz import (
    function_space_diagnostics,
    get_samples,
    pointwise_log_likelihood,
    posterior_prediction,
)
from pyro_sdebnn.infer.mcmc.diagnostics import SamplerDivergenceError, SamplerWarning
from pyro_sdebnn.infer.mcmc.schedules import PolynomialDecay, StepSizeSchedule
from pyro_sdebnn.predictive import ClassificationPrediction, RegressionPrediction

N = 40


def regression_model(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0))
    sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", x.shape[0]) as idx:
        return pyro.sample("y", dist.Normal(w * x[idx], sigma), obs=None if y is None else y[idx])


def _data(dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, generator=g, dtype=dtype)
    y = 1.5 * x + 0.5 * torch.randn(N, generator=g, dtype=dtype)
    return x, y


class BNN(PyroModule):
    """A tiny Bayesian MLP built from nn.Linear (does not vectorise over posterior draws)."""

    def __init__(self, hidden=5):
        super().__init__()
        self.fc1 = PyroModule[torch.nn.Linear](1, hidden)
        self.fc1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([hidden, 1]).to_event(2))
        self.fc1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        self.fc2 = PyroModule[torch.nn.Linear](hidden, 1)
        self.fc2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, hidden]).to_event(2))
        self.fc2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        f = self.fc2(torch.tanh(self.fc1(x.unsqueeze(-1)))).squeeze(-1)  # weights drawn outside the plate
        with pyro.plate("data", x.shape[0]) as idx:
            return pyro.sample("y", dist.Normal(f[idx], 0.5), obs=None if y is None else y[idx])


@pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")  # a short run: R-hat above 1.1
@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto")  # 60 draws: ArviZ's LOO caveat
def test_two_sequential_chains_arviz_summary_and_loo():
    x, y = _data()
    kernel = SGHMC(regression_model, step_size=1e-2, friction=5.0, num_steps=5, subsample_size=10)
    with pytest.warns(UserWarning, match="drawn sequentially"):
        mcmc = MCMC(kernel, num_samples=60, warmup_steps=40, num_chains=2, disable_progbar=True)
    mcmc.run(x, y)
    samples = mcmc.get_samples(group_by_chain=True)
    assert samples["w"].shape == (2, 60) and samples["sigma"].shape == (2, 60)
    idata = az.from_pyro(mcmc, log_likelihood=True)
    assert idata.log_likelihood["y"].shape == (2, 60, N)  # full data, not a minibatch
    assert idata.sample_stats["diverging"].shape == (2, 60)
    summary = az.summary(idata, var_names=["w", "sigma"])
    assert {"ess_bulk", "r_hat"} <= set(summary.columns)
    assert summary[["ess_bulk", "r_hat"]].notna().all().all()
    loo = az.loo(idata)
    assert torch.isfinite(torch.tensor(loo.elpd_loo))


def test_positive_site_is_sampled_unconstrained_and_returned_constrained():
    x, y = _data()
    kernel = SGLD(regression_model, step_size=1e-3, num_steps=5, subsample_size=10)
    seen = []
    mcmc = MCMC(kernel, num_samples=50, warmup_steps=50, disable_progbar=True,
                hook_fn=lambda k, params, stage, i: seen.append(params["sigma"].clone()))
    mcmc.run(x, y)
    assert len(seen) == 100  # the hook runs at every warm-up and sampling step
    raw = torch.stack(seen)  # the kernel's own parameters: log(sigma), unconstrained
    sigma = mcmc.get_samples()["sigma"]
    torch.testing.assert_close(sigma, raw[50:].exp())
    assert (sigma > 0).all()


def test_initial_params_and_save_params_are_honoured():
    x, y = _data()
    kernel = SGLD(regression_model, step_size=1e-4, num_steps=1, subsample_size=10)
    init = {"w": torch.tensor(0.3, dtype=torch.float64), "sigma": torch.tensor(0.0, dtype=torch.float64)}
    mcmc = MCMC(kernel, num_samples=3, warmup_steps=0, initial_params=init, disable_progbar=True, save_params=["w"])
    mcmc.run(x, y)
    samples = mcmc.get_samples()
    assert set(samples) == {"w"}
    # three steps of size 1e-4 move w by O(sqrt(3e-4) + 3e-4 |grad|) from its initial value
    assert (samples["w"] - 0.3).abs().max() < 0.2


def test_predictive_with_samples():
    x, y = _data()
    mcmc = MCMC(SGLD(regression_model, step_size=1e-3, num_steps=2, subsample_size=10), num_samples=20,
                warmup_steps=20, disable_progbar=True)
    mcmc.run(x, y)
    x_new = torch.linspace(-2, 2, 7, dtype=torch.float64)
    pred = Predictive(regression_model, mcmc.get_samples())(x_new)
    assert pred["y"].shape == (20, 7)
    reg = posterior_prediction(regression_model, mcmc.get_samples(), x_new)
    assert isinstance(reg, RegressionPrediction) and reg.loc.shape == (20, 7)
    torch.testing.assert_close(reg.loc, mcmc.get_samples()["w"][:, None] * x_new)


@pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")  # a short run: R-hat above 1.1
def test_non_vectorising_pyromodule_gets_log_likelihood_and_loo():
    x, y = _data(torch.float32)
    model = BNN()
    kernel = SGLD(model, step_size=1e-3, num_steps=2, subsample_size=10, vectorized_chains=2)
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=20, disable_progbar=True)
    mcmc.run(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ warns that it cannot vectorise this model
        plain = az.from_pyro(mcmc, log_likelihood=True)
    assert "log_likelihood" not in plain.groups()  # the ArviZ limitation we work around
    idata = to_inference_data(mcmc)
    assert idata.posterior["fc1.weight"].shape == (2, 30, 5, 1)
    assert idata.log_likelihood["y"].shape == (2, 30, N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LOO may warn about high Pareto k on 60 draws of a toy
        loo = az.loo(idata)
    assert torch.isfinite(torch.tensor(loo.elpd_loo))
    samples = get_samples(mcmc)
    ll = pointwise_log_likelihood(model, samples, x, y)
    assert ll["y"].shape == (60, N)
    pred = posterior_prediction(model, samples, torch.linspace(-1, 1, 9))
    diag = function_space_diagnostics(pred, num_chains=2)
    assert diag["ess"].shape == (9,) and diag["r_hat"].shape == (9,)


def test_classification_prediction_from_bernoulli_model():
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]) as idx:
            return pyro.sample("y", dist.Bernoulli(logits=w * x[idx]), obs=None if y is None else y[idx])

    pred = posterior_prediction(model, {"w": torch.tensor([0.0, 1.0])}, torch.tensor([0.0, 2.0]))
    assert isinstance(pred, ClassificationPrediction)
    torch.testing.assert_close(pred.probs[1, 1], torch.tensor([1 - torch.sigmoid(torch.tensor(2.0)),
                                                             torch.sigmoid(torch.tensor(2.0))]))


@pytest.mark.parametrize("backend", ["eager", "fx", pytest.param("compile", marks=pytest.mark.slow)])
def test_backends_agree_on_the_potential_gradient_path(backend):
    x, y = _data()
    kernel = SGLD(regression_model, step_size=1e-3, subsample_size=10, backend=backend, temperature=0.0)
    init = {"w": torch.tensor(0.3, dtype=torch.float64), "sigma": torch.tensor(0.1, dtype=torch.float64)}
    kernel.initial_params = init
    kernel.setup(0, x, y)
    idx = torch.arange(10)
    # temperature 0: the step is w - eta/2 * grad; compare with autograd on the potential
    flat = kernel.potential.pack(init)
    u = flat.clone().requires_grad_()
    (grad,) = torch.autograd.grad(kernel.potential(u, idx), u)
    state, value = kernel.build_step_fn()(kernel._init_state(flat), idx, torch.tensor(1e-3, dtype=torch.float64))
    torch.testing.assert_close(state[0], flat - 0.5e-3 * grad)
    torch.testing.assert_close(value, kernel.potential(flat, idx))
    assert kernel.backend_used == backend


def test_divergence_raises_with_step():
    x, y = _data()
    kernel = SGLD(regression_model, step_size=1e3, num_steps=5, subsample_size=10)
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=5, disable_progbar=True)
    with pytest.raises(SamplerDivergenceError, match="inner step .* smaller step_size"):
        mcmc.run(x, y)


def test_divergence_marked_and_reported_to_arviz():
    x, y = _data()
    kernel = SGLD(regression_model, step_size=1e3, num_steps=5, subsample_size=10, on_divergence="continue")
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=2, disable_progbar=True)
    with pytest.warns(SamplerWarning, match=r"SGLD: 5 divergence\(s\)"):
        mcmc.run(x, y)
    assert mcmc.diagnostics()["divergences"]["chain 0"] == [0, 1, 2, 3, 4]
    idata = to_inference_data(mcmc, log_likelihood=False)
    assert bool(idata.sample_stats["diverging"].all())


# ----- bad inputs --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kernel_cls, kwargs, match",
    [
        (SGLD, {"step_size": -1e-3}, "step_size"),
        (SGLD, {"step_size": 0.0}, "step_size"),
        (SGLD, {"num_steps": 0}, "num_steps"),
        (SGLD, {"subsample_size": 0}, "subsample_size"),
        (SGLD, {"temperature": -1.0}, "temperature"),
        (SGLD, {"backend": "gpu"}, "backend"),
        (SGLD, {"on_divergence": "ignore"}, "on_divergence"),
        (SGLD, {"step_size": PolynomialDecay(a=1e-3), "adapt_mass_matrix": True}, r"needs a constant step_size"),
        (SGHMC, {"step_size": 0.1, "friction": 10.0}, r"friction must lie in \(0, 1/step_size\)"),
        (SGHMC, {"friction": 0.0}, "friction"),
        (SGHMC, {"friction": 1.0, "noise_estimate": 2.0}, "noise_estimate"),
    ],
)
def test_bad_kernel_arguments(kernel_cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        kernel_cls(regression_model, **kwargs)


@pytest.mark.parametrize(
    "kernel_cls, kwargs, error, match",
    [
        # an infinite temperature passed the check and surfaced as a "divergence" at the first step
        (SGLD, {"temperature": float("inf")}, ValueError, "temperature must be a non-negative finite"),
        (SGHMC, {"temperature": float("nan")}, ValueError, "temperature must be a non-negative finite"),
        # these reached Python's '>' or an attribute lookup deep inside the set-up
        (SGLD, {"map_lr": "0.1"}, TypeError, "map_lr must be a float"),
        (SGLD, {"map_lr": float("inf")}, ValueError, "map_lr must be positive and finite"),
        (SGLD, {"transforms": [1]}, TypeError, "transforms must be a dict"),
        (SGHMC, {"transforms": {"sigma": 3}}, TypeError, r"transforms\['sigma'\] must be a torch Transform"),
        (SGLD, {"sample_writer": "samples/"}, TypeError, "sample_writer must be None or a SampleWriter"),
        # a truthy string silently switched on pSGLD
        (SGLD, {"preconditioned": "yes"}, TypeError, "preconditioned must be a bool"),
    ],
)
def test_bad_kernel_argument_types_are_named(kernel_cls, kwargs, error, match):
    with pytest.raises(error, match=match):
        kernel_cls(regression_model, **kwargs)


@pytest.mark.parametrize("bad", [0.0, -1e-3, float("nan"), float("inf")])
def test_schedule_returning_a_bad_step_size_is_named(bad):
    # a user's schedule returning 0 froze the chain silently; a negative, NaN or infinite step was reported as a
    # divergence of the sampler ("use a smaller step_size")
    class Broken(StepSizeSchedule):
        def __call__(self, t):
            return 1e-3 if t < 3 else bad

    x, y = _data()
    mcmc = MCMC(SGLD(regression_model, step_size=Broken(), subsample_size=10, map_steps=0), num_samples=4,
                warmup_steps=2, disable_progbar=True)
    with pytest.raises(ValueError, match=r"step_size schedule .* returned .* at inner step 3: a step size must be"):
        mcmc.run(x, y)


def _setup(model, **kwargs):
    x, y = _data()
    SGLD(model, step_size=1e-3, **kwargs).setup(0, x, y)


def test_subsample_without_data_plate_raises():
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.Normal(w * x, 1.0).to_event(1), obs=y)

    with pytest.raises(ValueError, match="no plate over the data"):
        _setup(model, subsample_size=10)


@pytest.mark.parametrize("prior", [dist.Bernoulli(0.5), dist.Categorical(torch.ones(3) / 3)])
def test_discrete_latent_site_is_named(prior):
    # a Bernoulli draws floats: its support says that it is discrete (not an obscure "Cannot transform" from biject_to)
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        z = pyro.sample("z", prior)
        with pyro.plate("data", x.shape[0]) as idx:
            pyro.sample("y", dist.Normal(w * x[idx] + z, 1.0), obs=None if y is None else y[idx])

    with pytest.raises(ValueError, match="latent site 'z' is not continuous"):
        _setup(model, subsample_size=10)


@pytest.mark.parametrize("column", ["targets", "predictions"])
def test_a_likelihood_pairing_every_observation_with_every_prediction_is_named(column):
    # targets (N, 1) against predictions (N,), or predictions (N, 1) inside plate("data", N), which Pyro expands to
    # (N, N): N^2 log-likelihood terms, reported before as a divergence of the sampler (or not at all)
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        f = w * x.unsqueeze(-1) if column == "predictions" else w * x
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(f, 1.0), obs=y)

    x, y = _data()
    y = y.unsqueeze(-1) if column == "targets" else y
    for subsample_size in (None, 10):
        with pytest.raises(ValueError, match="every observation paired with every prediction"):
            SGLD(model, step_size=1e-3, subsample_size=subsample_size).setup(0, x, y)

    def without_plate(x, y=None):  # a scalar prediction for every observation is fine (as for NUTS)
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.Normal(w, 1.0), obs=y)

    SGLD(without_plate, step_size=1e-3).setup(0, x, _data()[1])

    def rows_of_observations(x, y=None):  # a (T, N) value fills its dimension left of the plate: valid, as for NUTS
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[-1]):
            pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)

    x2, y2 = torch.stack([x, 2 * x]), torch.stack([y if y.dim() == 1 else y.squeeze(-1)] * 2)
    SGLD(rows_of_observations, step_size=1e-3).setup(0, x2, y2)


def test_weights_inside_data_plate_raise():
    def model(x, y=None):
        with pyro.plate("data", x.shape[0]) as idx:
            w = pyro.sample("w", dist.Normal(0.0, 1.0))
            pyro.sample("y", dist.Normal(w * x[idx], 1.0), obs=None if y is None else y[idx])

    with pytest.raises(ValueError, match="inside the data plate"):
        _setup(model, subsample_size=10)


def test_pyromodule_weights_drawn_inside_plate_are_explained():
    class Late(BNN):
        def forward(self, x, y=None):
            with pyro.plate("data", x.shape[0]) as idx:
                f = self.fc2(torch.tanh(self.fc1(x[idx].unsqueeze(-1)))).squeeze(-1)
                return pyro.sample("y", dist.Normal(f, 0.5), obs=None if y is None else y[idx])

    with pytest.raises(ValueError, match="PyroSample weights are drawn on first access"):
        _setup(Late().double(), subsample_size=10)


def test_model_that_subsamples_itself_raises():
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0], subsample_size=10) as idx:
            pyro.sample("y", dist.Normal(w * x[idx], 1.0), obs=None if y is None else y[idx])

    with pytest.raises(ValueError, match="Subsampling is a kernel setting"):
        _setup(model, subsample_size=10)


def test_model_not_indexing_the_data_gets_its_data_sliced():
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)

    x, y = _data()
    kernel = SGLD(model, step_size=1e-3, subsample_size=10)
    kernel.setup(0, x, y)  # a plain model: its data arguments are sliced by the minibatch indices
    assert kernel.potential.minibatch_mode == "slice"

    def reshaped(x, y=None):  # no argument has the plate's leading size: neither way applies
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[-1]):
            pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)

    with pytest.raises(ValueError, match="index the data"):
        SGLD(reshaped, step_size=1e-3, subsample_size=10).setup(0, x[None], y[None])


def test_subsample_larger_than_data_raises():
    with pytest.raises(ValueError, match="exceeds the data size"):
        _setup(regression_model, subsample_size=N + 1)


def test_unknown_data_plate_raises():
    with pytest.raises(ValueError, match="not a plate of the model"):
        _setup(regression_model, subsample_size=10, data_plate="batch")


def test_user_transforms_define_the_sampling_space():
    from torch.distributions.transforms import AffineTransform, ExpTransform, ComposeTransform

    x, y = _data()
    # sample sigma on log(sigma) / 2 instead of log(sigma): constrained -> unconstrained
    transform = ComposeTransform([ExpTransform().inv, AffineTransform(0.0, 0.5)])
    kernel = SGLD(regression_model, step_size=1e-3, num_steps=2, subsample_size=10, transforms={"sigma": transform})
    mcmc = MCMC(kernel, num_samples=10, warmup_steps=5, disable_progbar=True)
    mcmc.run(x, y)
    assert kernel.transforms["sigma"] is transform
    sigma = mcmc.get_samples()["sigma"]
    assert (sigma > 0).all()
    raw = kernel.potential.split(kernel._state[0])["sigma"]
    torch.testing.assert_close(sigma[-1], torch.exp(2 * raw))


def test_mcmc_transforms_that_are_not_the_kernels_are_refused():
    from torch.distributions.transforms import SoftplusTransform

    # MCMC maps the kernel's unconstrained samples back through MCMC(transforms=...): the kernel sampled sigma on
    # log(sigma) and MCMC took softplus^-1 for it, so the samples came back wrong without an error
    x, y = _data()
    softplus = SoftplusTransform().inv
    mcmc = MCMC(SGLD(regression_model, step_size=1e-3, subsample_size=10), num_samples=4, warmup_steps=2,
                disable_progbar=True, transforms={"sigma": softplus})
    with pytest.raises(ValueError, match=r"MCMC\(transforms=...\) would map the samples back through other "
                                         r"transforms.*'sigma': MCMC's .*Softplus.*pass them to the kernel instead "
                                         r"\(SGLD\(model, transforms=...\)\)"):
        mcmc.run(x, y)
    # the same transforms given to both: the run is the kernel-only run (w, real-valued, left out of MCMC's)
    samples = []
    for mcmc_transforms in (None, {"sigma": softplus}):
        pyro.set_rng_seed(0)
        kernel = SGLD(regression_model, step_size=1e-3, subsample_size=10, transforms={"sigma": softplus})
        mcmc = MCMC(kernel, num_samples=4, warmup_steps=2, disable_progbar=True, transforms=mcmc_transforms)
        mcmc.run(x, y)
        samples.append(mcmc.get_samples())
    for name in ("w", "sigma"):
        assert torch.equal(samples[0][name], samples[1][name])


@pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")  # a short run: R-hat above 1.1
def test_a_second_run_of_one_mcmc_keeps_its_vectorised_chains_transforms():
    # MCMC keeps the transforms of its first run; the kernel builds its own again at the second run's set-up, and
    # they are equal (not the same objects), so the check above lets the run through
    x, y = _data()
    mcmc = MCMC(SGLD(regression_model, step_size=1e-3, subsample_size=10, vectorized_chains=2), num_samples=3,
                warmup_steps=2, disable_progbar=True)
    for _ in range(2):
        mcmc.run(x, y)
        assert mcmc.get_samples(group_by_chain=True)["sigma"].shape == (2, 3)
        assert (mcmc.get_samples()["sigma"] > 0).all()


def test_sghmc_momentum_resampling():
    # temperature 0: a resampled momentum is exactly 0, so after one step v = -eta * grad U(w) at the step's start
    x, y = _data()
    eta = 1e-3
    kernel = SGHMC(regression_model, step_size=eta, friction=1.0, num_steps=1, temperature=0.0,
                   resample_momentum_every=1)
    kernel.initial_params = {"w": torch.tensor(0.3, dtype=torch.float64),
                             "sigma": torch.tensor(0.1, dtype=torch.float64)}
    kernel.setup(0, x, y)
    kernel._state = (kernel._state[0], torch.ones_like(kernel._state[1]))  # a non-zero momentum to be discarded
    params = kernel.sample(kernel.initial_params)  # sample 0: not resampled, v = (1 - eta c) * 1 - eta * grad
    assert (kernel._state[1].abs() > 0.5).all()
    start = kernel._state[0].clone().requires_grad_()
    (grad,) = torch.autograd.grad(kernel.potential(start), start)
    kernel.sample(params)  # sample 1: momentum resampled to 0 before the step
    torch.testing.assert_close(kernel._state[1], -eta * grad)


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_a_run_stopped_by_hook_fn_leaves_no_start_for_the_next_run(error):
    # Pyro does not call kernel.cleanup() when hook_fn raises (Ctrl-C, an error): the next run must still draw its own
    # start and warm-start from it, as a fresh kernel does, not take the stopped chain's start for a user's
    x, y = _data()
    settings = dict(step_size=1e-3, num_steps=2, subsample_size=10, backend="eager")

    def stop(kernel, params, stage, i):
        if stage == "Sample" and i == 2:
            raise error

    kernel = SGLD(regression_model, **settings)
    pyro.set_rng_seed(1)
    with pytest.raises(error):
        MCMC(kernel, num_samples=5, warmup_steps=3, hook_fn=stop, disable_progbar=True).run(x, y)
    runs = []
    for k in (kernel, SGLD(regression_model, **settings)):
        pyro.set_rng_seed(0)
        mcmc = MCMC(k, num_samples=5, warmup_steps=3, disable_progbar=True)
        mcmc.run(x, y)
        runs.append((mcmc.get_samples(), mcmc.diagnostics()["warm start steps"]["chain 0"]))
    (again, steps_again), (fresh, steps_fresh) = runs
    assert steps_again == steps_fresh > 0
    for name in fresh:
        assert torch.equal(again[name], fresh[name])


@pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")  # a short run: R-hat above 1.1
@pytest.mark.parametrize("backend, chains", [("eager", 1), ("fx", 1), ("fx", 2), ("auto", 1)])
def test_a_second_run_with_the_same_seed_repeats_the_first(backend, chains):
    # a rerun on the same kernel builds its potential and traces its step again, drawing what a fresh kernel draws
    x, y = _data()
    kernel = SGHMC(regression_model, step_size=1e-3, num_steps=2, subsample_size=10, backend=backend,
                   vectorized_chains=chains)
    runs = []
    for _ in range(2):
        pyro.set_rng_seed(0)
        mcmc = MCMC(kernel, num_samples=60 if backend == "auto" else 4, warmup_steps=3, disable_progbar=True)
        mcmc.run(x, y)
        runs.append(mcmc.get_samples())
    assert kernel.diagnostics()["backend"] == ("fx" if backend == "auto" else backend)
    for name in runs[0]:
        assert torch.equal(runs[0][name], runs[1][name])


def test_sample_writer_after_a_run_stopped_early(tmp_path):
    # the stopped run's samples are in the writer's buffer (flush writes them); a directory holding that short chain and
    # a full one is a ValueError naming the lengths, not torch.stack's size mismatch
    from pyro_sdebnn.infer.mcmc.arviz import SampleWriter, load_samples

    x, y = _data()
    writer = SampleWriter(tmp_path, chunk_size=4)
    kernel = SGLD(regression_model, step_size=1e-3, subsample_size=10, backend="eager", sample_writer=writer)

    def stop(kernel, params, stage, i):
        if stage == "Sample" and i == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        MCMC(kernel, num_samples=10, warmup_steps=2, save_params=[], hook_fn=stop, disable_progbar=True).run(x, y)
    writer.flush()
    assert load_samples(tmp_path)["w"].shape == (1, 7)
    MCMC(kernel, num_samples=10, warmup_steps=2, save_params=[], disable_progbar=True).run(x, y)
    with pytest.raises(ValueError, match="different numbers of draws"):
        load_samples(tmp_path)


def test_a_kernel_that_has_run_pickles_for_worker_processes():
    # MCMC(num_chains > 1) under the "spawn" context (the default on macOS and Windows) pickles the kernel into each
    # worker: a kernel that had run with a traced step could not be loaded there (the workers died, MCMC.run waited)
    import os
    import pickle
    import subprocess
    import sys

    import pyro_sdebnn
    from pyro_sdebnn.infer.mcmc import BayesianMLP

    x, y = _data()
    x = x.unsqueeze(-1)
    model = BayesianMLP([1, 3, 1]).double()
    settings = dict(step_size=1e-4, num_steps=2, subsample_size=10, backend="fx")
    kernel = SGLD(model, **settings)
    MCMC(kernel, num_samples=2, warmup_steps=1, disable_progbar=True).run(x, y)
    blob = pickle.dumps(kernel)
    package = os.path.dirname(os.path.dirname(pyro_sdebnn.__file__))  # the child loads this copy of the package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"], input=blob,
                   check=True, capture_output=True, timeout=300, env=env)
    runs = []
    for k in (pickle.loads(blob), SGLD(model, **settings)):  # the copy sets up afresh, as a new kernel
        pyro.set_rng_seed(0)
        mcmc = MCMC(k, num_samples=3, warmup_steps=2, disable_progbar=True)
        mcmc.run(x, y)
        runs.append(mcmc.get_samples())
    for name in runs[1]:
        assert torch.equal(runs[0][name], runs[1][name])
