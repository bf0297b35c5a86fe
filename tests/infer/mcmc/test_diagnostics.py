# SPDX-License-Identifier: Apache-2.0
"""Divergences of the SG-MCMC kernels on classification models (Two Moons reports), in every backend.

Reports reproduced here: fSGLD at too large a step on Two Moons raised a raw ``ValueError``/``RuntimeError`` from
a Bernoulli op that saw NaN probabilities (the eager step validates the distribution's arguments; a model that
samples with ``torch.bernoulli`` fails inside the traced graph) instead of :class:`SamplerDivergenceError`; fSGHMC
with too little friction collapsed silently (a finite chain, diagnosed by its kinetic temperature).
"""

import math

import pyro
import pyro.contrib.gp as gp
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_sdebnn.data import two_moons
from pyro_sdebnn.infer.mcmc import BayesianMLP, FSGHMC, FSGLD, SGHMC, SGLD, to_inference_data
from pyro_sdebnn.infer.mcmc.diagnostics import SamplerDivergenceError
from pyro_sdebnn.infer.mcmc.schedules import PolynomialDecay

# runs that diverge on purpose (on_divergence='continue'), and short runs: the end-of-run check reports them
pytestmark = pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")

BACKENDS = ("eager", "fx", "compile")


@pytest.fixture(scope="module")
def moons():
    split = two_moons(n_train=64, n_test=1, noise=0.2, seed=0)
    return split.x_train, split.y_train.to(split.x_train.dtype)


def _fsgld(backend, step_size=1e-4, **kwargs):
    model = BayesianMLP([2, 8, 8, 1], likelihood="bernoulli", activation="relu")
    rbf = gp.kernels.RBF(2, variance=torch.tensor(4.0), lengthscale=torch.tensor(0.5))
    return FSGLD(model, gp_prior=rbf, step_size=step_size, num_steps=3, subsample_size=16, backend=backend,
                 num_measurement_data=8, num_measurement_box=8, **kwargs)


def _params_with(kernel, value):
    """The kernel's initial parameters with one coordinate set to ``value``."""
    flat = kernel.potential.pack(kernel.initial_params).clone()
    flat[3] = value
    return kernel.potential.split(flat)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fsgld_two_moons_large_step_raises_divergence(moons, backend):
    # step 1 is far above the stable range (1e-4 on this problem): non-finite within a few samples
    kernel = _fsgld(backend, step_size=1.0)
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=5, disable_progbar=True)
    with pytest.raises(SamplerDivergenceError, match=r"fSGLD diverged at inner step \d+ .*smaller step_size"):
        mcmc.run(*moons)


@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_nan_state_raises_divergence_not_bernoulli_validation_error(moons, backend):
    # eager used to fail in Pyro's argument validation of Bernoulli(logits=nan) (a raw ValueError); validation is on
    kernel = _fsgld(backend)
    kernel.setup(0, *moons)
    with pytest.raises(SamplerDivergenceError, match="inner step 0 .*smaller step_size"):
        kernel.sample(_params_with(kernel, float("nan")))


@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_overflowing_finite_state_is_a_divergence(moons, backend):
    # 1e30 is finite in float32 but its square is not (bound sqrt(finfo.max) ~ 1.8e19): without a weight prior the
    # minibatch potential can stay finite there while the network overflows to nan at other inputs
    kernel = _fsgld(backend)
    kernel.setup(0, *moons)
    with pytest.raises(SamplerDivergenceError, match="diverged at inner step 0 "):
        kernel.sample(_params_with(kernel, 1e30))


def test_finite_bound_is_the_dtypes():
    from pyro_sdebnn.infer.mcmc.diagnostics import _finite_state

    for dtype in (torch.float32, torch.float64):
        bound = math.sqrt(torch.finfo(dtype).max)
        assert bool(_finite_state((torch.tensor([bound / 2, -bound / 2], dtype=dtype),)))
        assert not bool(_finite_state((torch.tensor([0.0, 2 * bound], dtype=dtype),)))
        assert not bool(_finite_state((torch.tensor([0.0, float("nan")], dtype=dtype),)))


@pytest.mark.parametrize("chains", [1, 3])
@pytest.mark.parametrize("length", [1, 2, 7, 8, 31, 32, 128])
def test_energy_check_median_equals_numpys(length, chains):
    """The energy check's median is ``np.median(rows, 0)`` bit for bit (odd and even histories, several chains)."""
    import numpy as np

    from pyro_sdebnn.infer.mcmc.diagnostics import _median, _rows

    rng = np.random.default_rng(length * 10 + chains)
    history = [rng.standard_normal(chains) * 10.0 ** rng.integers(-3, 7) for _ in range(length)]
    rows = _rows(history)
    assert rows.shape == (length, chains)
    assert np.array_equal(_median(rows), np.median(rows, 0))
    deviation = np.abs(rows - np.median(rows, 0))
    assert np.array_equal(_median(deviation), np.median(deviation, 0))


def test_fsgld_continue_marks_divergences_and_restarts_from_finite_state(moons):
    kernel = _fsgld("eager", step_size=1.0, on_divergence="continue")
    kernel.setup(0, *moons)
    initial = kernel.initial_params
    mcmc = MCMC(kernel, num_samples=12, warmup_steps=0, initial_params=initial, disable_progbar=True)
    mcmc.run(*moons)
    divergences = mcmc.diagnostics()["divergences"]["chain 0"]
    assert divergences  # step 1 diverges within a few samples
    samples = mcmc.get_samples()  # constrained values
    flat = torch.cat([v.reshape(12, -1) for v in samples.values()], -1)
    init = torch.cat([kernel.transforms[k].inv(initial[k]).reshape(-1) for k in samples])
    assert bool(torch.isfinite(flat).all())
    log = kernel.diagnostics()["divergence log"]
    restarts = [r["sample"] for r in log]
    bad = [r["bad draw"] for r in log if "bad draw" in r]
    # the divergent draws: each restart, and each draw whose state the next sample's check found already bad
    assert divergences == sorted(set(restarts) | set(bad)) and bad
    for i in restarts:
        # a diverged sample restarts from the last state a check certified: a sample's check certifies the state the
        # sample before it returned, so that is the initial state or a sample at least two before it
        earlier = [init] + [flat[j] for j in range(i - 1)]
        assert any(torch.equal(flat[i], e) for e in earlier), i
    for i in bad:  # a state the chain blew up to, not a restart: no earlier draw equals it
        assert not any(torch.equal(flat[i], e) for e in [init] + [flat[j] for j in range(i)]), i
    assert kernel._t == 12 * kernel.num_steps  # the schedule moved on by num_steps per sample, diverged or not


# ----- a model whose forward pass samples with torch.bernoulli (stochastic binary units) -------------------------
def stochastic_unit_model(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
    gate = torch.bernoulli(torch.sigmoid(x @ w))  # raises "Expected p_in >= 0 && p_in <= 1" on nan probabilities
    with pyro.plate("data", x.shape[0]) as idx:
        logits = (x @ w)[idx] * (0.5 + 0.5 * gate[idx])
        pyro.sample("obs", dist.Bernoulli(logits=logits, validate_args=False), obs=None if y is None else y[idx])


@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_bernoulli_op_on_nan_state_is_a_divergence(moons, backend):
    kernel = SGLD(stochastic_unit_model, step_size=1e-3, num_steps=2, subsample_size=16, backend=backend)
    kernel.setup(0, *moons)
    with pytest.raises(SamplerDivergenceError, match="raised RuntimeError on a non-finite state") as info:
        kernel.sample({"w": torch.tensor([float("nan"), 0.0])})
    assert "p_in" in str(info.value.__cause__)


@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_bernoulli_op_raises_divergence_during_run(moons, backend):
    # step 1e40 is inf in float32: the first update makes w non-finite, the next step's torch.bernoulli raises
    kernel = SGLD(stochastic_unit_model, step_size=1e40, num_steps=3, subsample_size=16, backend=backend)
    mcmc = MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True)
    with pytest.raises(SamplerDivergenceError, match="diverged at inner step 0 .*RuntimeError .* inner step 1"):
        mcmc.run(*moons)


@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_bernoulli_op_divergence_continue_restarts(moons, backend):
    kernel = SGLD(stochastic_unit_model, step_size=1e40, num_steps=3, subsample_size=16, backend=backend,
                  on_divergence="continue")
    mcmc = MCMC(kernel, num_samples=4, warmup_steps=1, disable_progbar=True)
    mcmc.run(*moons)
    assert kernel.diagnostics()["divergences"] == [0, 1, 2, 3]
    w = mcmc.get_samples()["w"]
    assert bool(torch.isfinite(w).all())
    assert bool((w == w[0]).all())  # every sample restarted from the (finite) initial state


def test_error_on_finite_state_is_not_masked(moons):
    calls = {"n": 0}

    def buggy_model(x, y=None):
        calls["n"] += 1
        if calls["n"] > 4:
            raise RuntimeError("a bug in the model")
        return stochastic_unit_model(x, y)

    # no warm start: the model must fail inside a sampling step
    kernel = SGLD(buggy_model, step_size=1e-3, num_steps=2, subsample_size=16, backend="eager", map_steps=0)
    kernel.setup(0, *moons)
    with pytest.raises(RuntimeError, match="a bug in the model") as info:
        kernel.sample(kernel.initial_params)
    assert not isinstance(info.value, SamplerDivergenceError)


# ----- silent collapse of SGHMC: kinetic temperature -------------------------------------------------------------
def test_sghmc_kinetic_temperature_matches_target_on_gaussian():
    # U(w) = |w|^2 / 2 in D = 400 dimensions, full batch: v ~ N(0, T I) at stationarity, so |v|^2 / D has mean T and
    # standard deviation T sqrt(2 / D) = 0.071 T per sample; the mean over samples is at least that precise
    # (positive autocorrelation aside), and the discretisation bias at eta c = 0.05 is O(eta) = 0.05
    D, T = 400, 0.5

    def model():
        pyro.sample("w", dist.Normal(torch.zeros(D, dtype=torch.float64), 1.0).to_event(1))

    kernel = SGHMC(model, step_size=0.05, friction=1.0, num_steps=10, temperature=T, backend="fx")
    mcmc = MCMC(kernel, num_samples=40, warmup_steps=20, disable_progbar=True)
    mcmc.run()
    kinetic = mcmc.diagnostics()["kinetic temperature"]["chain 0"]
    assert abs(kinetic - T) < 4 * T * math.sqrt(2 / D) + 0.05 * T


def _fsghmc(friction, step_size, **kwargs):
    model = BayesianMLP([2, 16, 16, 1], likelihood="bernoulli", activation="relu")
    rbf = gp.kernels.RBF(2, variance=torch.tensor(4.0), lengthscale=torch.tensor(0.5))
    return FSGHMC(model, gp_prior=rbf, step_size=step_size, friction=friction, num_steps=10, subsample_size=16,
                  num_measurement_data=8, num_measurement_box=8, backend="fx", **kwargs)


def test_fsghmc_too_little_friction_is_finite_but_hot(moons):
    # the Two Moons collapse (step 3e-4, friction 0.1): no divergence, but the kinetic temperature stays far above
    # T = 1 (the potential energy released from the initial point is damped only over 1/(eta c) ~ 33000 steps).
    # With friction 10 at step 1e-3 (eta c = 0.01: damped over ~100 steps, 400 warm-up steps) it is back at T. The
    # per-sample sd of |v|^2 / D is sqrt(2 / D) = 0.077 here (D = 337); the mean over samples is at least as precise.
    # Started at a prior draw (map_steps=0): the automatic MAP warm start removes most of that energy
    hot = _fsghmc(0.1, 3e-4, map_steps=0)
    mcmc = MCMC(hot, num_samples=10, warmup_steps=20, disable_progbar=True)
    mcmc.run(*moons)
    sd = math.sqrt(2 / hot.potential.dim)
    assert mcmc.diagnostics()["divergences"]["chain 0"] == []
    assert mcmc.diagnostics()["kinetic temperature"]["chain 0"] > 1 + 10 * sd
    damped = _fsghmc(10.0, 1e-3)
    mcmc = MCMC(damped, num_samples=10, warmup_steps=40, disable_progbar=True)
    mcmc.run(*moons)
    assert abs(mcmc.diagnostics()["kinetic temperature"]["chain 0"] - 1) < 4 * sd


def test_diverging_map_warm_start_is_a_divergence(moons):
    # Adam at lr 1e30 sends the weights to inf/nan; Bernoulli's argument validation must not pre-empt the report
    kernel = _fsgld("fx", map_steps=5, map_lr=1e30)
    with pytest.raises(SamplerDivergenceError, match="MAP warm start diverged"):
        kernel.setup(0, *moons)


# ----- a chain leaving the typical set without overflowing ------------------------------------------------------
# Conjugate regression with a largest Hessian eigenvalue lambda = 911: SGLD (w <- w - eta/2 g + ...) is stable for
# eta < 4 / lambda = 4.44e-3, SGHMC for eta < 2 / sqrt(lambda) = 0.066 (at c = 1). Above those limits the chains grow
# geometrically but stayed finite for the whole run, so an overflow-only check returned |w| up to 7e14 silently.
def _unstable_problem():
    from pyro_sdebnn.testing import ConjugateLinearRegression

    problem = ConjugateLinearRegression(dim=2, prior_scale=1.0, noise_scale=0.5)
    x, y = problem.generate(200, seed=1)
    lam = torch.linalg.eigvalsh(x.T @ x / 0.25 + torch.eye(2)).max()
    assert 4.4e-3 < 4 / lam < 4.5e-3
    return problem.model, x, y


@pytest.mark.parametrize("step_size", [5e-3, 4.5e-3])
def test_sgld_above_stability_limit_raises_before_overflow(step_size):
    model, x, y = _unstable_problem()
    pyro.set_rng_seed(0)
    kernel = SGLD(model, step_size=step_size, adapt_step_size=False)  # no halving in warm-up: it raises there
    mcmc = MCMC(kernel, num_samples=100, warmup_steps=50, disable_progbar=True)
    with pytest.raises(SamplerDivergenceError, match="rose above .* left the typical set"):
        mcmc.run(x, y)


def test_sghmc_above_stability_limit_reports_its_kinetic_temperature():
    model, x, y = _unstable_problem()
    pyro.set_rng_seed(0)
    kernel = SGHMC(model, step_size=0.067, friction=1.0, adapt_step_size=False)
    mcmc = MCMC(kernel, num_samples=100, warmup_steps=50, disable_progbar=True)
    with pytest.raises(SamplerDivergenceError, match=r"energy U \+ \|v\|\^2/2 .* kinetic temperature"):
        mcmc.run(x, y)


def test_continue_restarts_from_a_healthy_state_with_a_record():
    # eta = 1 is 200 times the stability limit: every step diverges; the chain must restart from its initial state,
    # not from the state that already blew up (|w| ~ 1e18 before)
    model, x, y = _unstable_problem()
    pyro.set_rng_seed(0)
    kernel = SGLD(model, step_size=1.0, on_divergence="continue")
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=0, disable_progbar=True)
    mcmc.run(x, y)
    w = mcmc.get_samples()["w"]
    divergences = kernel.diagnostics()["divergences"]
    log = kernel.diagnostics()["divergence log"]
    restarts = [r["sample"] for r in log]
    assert len(restarts) >= 9
    for i in restarts:
        assert torch.equal(w[i], w[restarts[0]])  # every restart is the same healthy (initial) state
    # between restarts the chain takes one step (about lambda / 2 = 455 times the initial |w|) before the next check:
    # with num_steps=1 the check sees that state one sample late, and marks the draw that returned it as divergent
    bad = [r["bad draw"] for r in log if "bad draw" in r]
    assert bad == [i - 1 for i in restarts if i >= 1]
    assert all(float(w[i].abs().max()) > 100 * float(w[restarts[0]].abs().max()) for i in bad)
    assert float(w.abs().max()) < 1e4
    assert divergences == sorted(set(restarts) | set(bad)) == list(range(len(w)))  # every draw: restart or blown up
    assert all(r["chain"] == 0 and r["step"] >= 0 and r["cause"] for r in log)
    diverging = to_inference_data(mcmc, log_likelihood=False).sample_stats["diverging"].values
    assert diverging.shape == (1, 20) and bool(diverging.all())  # ArviZ sees the blown-up draws too


def test_one_diverging_chain_restarts_only_itself():
    model, x, y = _unstable_problem()
    pyro.set_rng_seed(0)
    kernel = SGLD(model, step_size=1e-4, vectorized_chains=4, on_divergence="continue")
    kernel.setup(0, x, y)
    params = {"w": kernel.initial_params["w"].clone()}
    params["w"][2] = 1e30  # finite, but its square overflows
    start = params["w"].clone()
    out = kernel.sample(params)["w"]
    assert [r["chain"] for r in kernel.divergence_log] == [2]
    assert torch.equal(out[2], kernel.initial_params["w"][2])  # back at its last healthy state
    for k in (0, 1, 3):  # the other chains took their step
        assert not torch.equal(out[k], start[k]) and bool(torch.isfinite(out[k]).all())


@pytest.mark.parametrize("adapt", [True, "default"])
def test_warmup_step_size_search_finds_a_stable_step(adapt):
    # "default": a constant step size is searched in warm-up without being asked, also in a warm-up too short
    # (100 inner steps) for the mass-matrix adaptation, as a user's first run of a stiff model is
    model, x, y = _unstable_problem()
    pyro.set_rng_seed(0)
    kernel = SGLD(model, step_size=2e-2, **({"adapt_step_size": True} if adapt is True else {}))
    assert kernel.adapt_step_size is True
    mcmc = MCMC(kernel, num_samples=100, warmup_steps=100, disable_progbar=True)
    mcmc.run(x, y)
    halvings = [r for r in kernel.divergence_log if r.get("halved")]
    assert halvings and all(r["warmup"] for r in halvings)
    assert kernel.diagnostics()["step size"] < 4.44e-3  # below the stability limit
    assert kernel.diagnostics()["divergences"] == []
    assert float(mcmc.get_samples()["w"].abs().max()) < 3.0  # posterior sd ~ 0.04 around |w| <= 1


def test_a_step_size_schedule_is_not_searched_by_default():
    # a schedule keeps the step sizes it was given: a divergence in its warm-up raises, as without the search
    model, x, y = _unstable_problem()
    pyro.set_rng_seed(0)
    kernel = SGLD(model, step_size=PolynomialDecay(2e-2, 1.0, 0.55))
    assert kernel.adapt_step_size is False
    with pytest.raises(SamplerDivergenceError, match="left the typical set"):
        MCMC(kernel, num_samples=100, warmup_steps=100, disable_progbar=True).run(x, y)


def test_healthy_run_never_trips_the_energy_check():
    # full-batch SGLD well inside the stability limit, T = 1 and a cold T = 0.1: no divergence in 4 chains
    model, x, y = _unstable_problem()
    for temperature in (1.0, 0.1):
        pyro.set_rng_seed(0)
        kernel = SGLD(model, step_size=2e-3, num_steps=2, temperature=temperature, vectorized_chains=4)
        MCMC(kernel, num_samples=200, warmup_steps=50, disable_progbar=True).run(x, y)
        assert kernel.divergence_log == []


def test_bayesian_mlp_names_integer_inputs_and_the_conversion():
    # images stored as bytes, as tensors or from a loader: torch's "mat1 and mat2 must have the same dtype" before
    x, y = torch.randint(0, 256, (16, 2), dtype=torch.uint8), torch.arange(16) % 2
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    for data in ((x, y), (loader,)):
        mcmc = MCMC(SGLD(BayesianMLP([2, 4, 2], likelihood="categorical")), num_samples=1, warmup_steps=0,
                    disable_progbar=True)
        with pytest.raises(TypeError, match=r"x must be a floating-point tensor of the network's dtype torch.float32, "
                                            r"got torch.uint8 \(convert the data with x.to\(torch.float32\)"):
            mcmc.run(*data)
