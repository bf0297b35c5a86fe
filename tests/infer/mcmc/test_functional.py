# SPDX-License-Identifier: Apache-2.0
"""fSGLD / fSGHMC: the GP posterior at the measurement points of a linear-in-features model, the surrogate
gradient, measurement points, and bad inputs."""

import pyro
import pyro.contrib.gp as gp
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.ops.stats import effective_sample_size

from pyro_sdebnn.distributions import GPFunctionalPrior
from pyro_sdebnn.infer.mcmc import BayesianMLP, FSGHMC, FSGLD
from pyro_sdebnn.infer.mcmc.functional import FunctionalPotential, MeasurementPoints

POINTS = torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64)  # measurement points X_M
CENTRES = POINTS.clone()
NOISE = 1.0


def features(x):
    """phi_j(x) = exp(-(x - c_j)^2 / (2 * 0.3^2)): Phi at the measurement points is square and invertible."""
    return torch.exp(-0.5 * ((x.unsqueeze(-1) - CENTRES) / 0.3) ** 2)


def linear_model(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(3, dtype=x.dtype), 1.0).to_event(1))  # dropped by fSGLD
    with pyro.plate("data", x.shape[0]) as idx:
        f = pyro.deterministic("f", features(x[idx]) @ w)
        pyro.sample("obs", dist.Normal(f, NOISE), obs=None if y is None else y[idx])


def _data():
    x = POINTS.repeat(2)  # two observations per measurement point
    y = torch.tensor([0.5, -0.3, 1.0, 0.2, -0.1, 1.4], dtype=torch.float64)
    return x, y


def _prior():
    kernel = gp.kernels.RBF(1, variance=torch.tensor(1.0), lengthscale=torch.tensor(0.5))
    return GPFunctionalPrior(kernel, POINTS)


def _gp_posterior(prior, x, y):
    cov = prior.scale_tril64 @ prior.scale_tril64.T  # K + delta I, exactly what the kernel uses
    A = features(x) @ torch.linalg.inv(features(POINTS))  # f(x) = A f_M
    precision = torch.linalg.inv(cov) + A.T @ A / NOISE**2
    post_cov = torch.linalg.inv(precision)
    return post_cov @ A.T @ y / NOISE**2, post_cov


def _f_samples(mcmc, chains):
    w = mcmc.get_samples(group_by_chain=True)["w"]  # (K, S, 3): vectorised chains are chains
    return w @ features(POINTS).T  # (K, S, M) function values at X_M


@pytest.mark.parametrize("kernel_cls, kwargs", [
    (FSGLD, {"step_size": 2e-2}),
    (FSGHMC, {"step_size": 5e-2, "friction": 4.0}),
])
def test_recovers_gp_posterior_at_measurement_points(kernel_cls, kwargs):
    x, y = _data()
    prior = _prior()
    mean, cov = _gp_posterior(prior, x, y)
    chains = 32
    # the claim is the chains' stationary distribution: they start from their prior draws (map_steps=0; the warm-up
    # carries them to the posterior) and take the traced step from the first (backend="fx", the eager step's update
    # rule). The MAP warm start and the auto backend's eager start, which run chain by chain, are tested with the
    # functional kernels in test_functional_determinism.py.
    kernel = kernel_cls(linear_model, gp_prior=prior, num_steps=10, vectorized_chains=chains, map_steps=0,
                        backend="fx", **kwargs)
    mcmc = MCMC(kernel, num_samples=200, warmup_steps=50, disable_progbar=True)
    mcmc.run(x, y)
    f = _f_samples(mcmc, chains)
    ess = effective_sample_size(f, chain_dim=0, sample_dim=1)
    assert (ess > 400).all(), ess
    flat = f.reshape(-1, 3)
    var = cov.diagonal()
    # 4 Monte Carlo standard errors sqrt(var / ESS); the variance within 20 % (its MC error is sqrt(2/ESS) <= 7 %,
    # the O(eta) discretisation bias about eta * lambda_max / 4 <= 3 %)
    assert ((flat.mean(0) - mean).abs() < 4 * (var / ess).sqrt()).all(), (flat.mean(0), mean)
    assert ((flat.var(0) / var - 1).abs() < 0.2).all(), flat.var(0) / var


def test_surrogate_gradient_is_exact():
    x, y = _data()
    prior = _prior()
    potential = FunctionalPotential(linear_model, (x, y), gp_kernel=prior.kernel, example_points=POINTS)
    w = torch.tensor([0.3, -0.2, 0.8], dtype=torch.float64, requires_grad=True)
    value = potential(w, None, POINTS, prior.scale_tril64)
    (grad,) = torch.autograd.grad(value, w)
    # exact potential: Gaussian NLL (without constants) + 1/2 f_M^T (K + delta I)^-1 f_M
    w2 = w.detach().clone().requires_grad_()
    f_m = features(POINTS) @ w2
    cov = prior.scale_tril64 @ prior.scale_tril64.T
    nll = -dist.Normal(features(x) @ w2, NOISE).log_prob(y).sum()
    exact = nll + 0.5 * f_m @ torch.linalg.solve(cov, f_m)
    (grad_exact,) = torch.autograd.grad(exact, w2)
    torch.testing.assert_close(grad, grad_exact)
    torch.testing.assert_close(value, exact.detach())


def test_redrawn_measurement_points_on_a_bnn():
    x = torch.linspace(-2, 2, 30).unsqueeze(-1)
    y = torch.sin(2 * x[:, 0])
    model = BayesianMLP([1, 16, 1], noise_scale=None)
    points = MeasurementPoints(x, num_data=8, num_box=8)
    kernel = FSGLD(model, gp_prior=gp.kernels.RBF(1), measurement_points=points, prior_sites=("sigma",),
                   step_size=1e-4, num_steps=5, subsample_size=10)
    mcmc = MCMC(kernel, num_samples=10, warmup_steps=10, disable_progbar=True)
    mcmc.run(x, y)
    samples = mcmc.get_samples()
    assert samples["layers.0.weight"].shape == (10, 16, 1)
    assert (samples["sigma"] > 0).all()
    assert all(torch.isfinite(v).all() for v in samples.values())


def test_measurement_points_box_and_fixed():
    x = torch.tensor([[0.0, 10.0], [1.0, 20.0]])
    fixed = MeasurementPoints(x, num_data=2, num_box=50, margin=0.5, redraw=False)
    assert fixed() is fixed()
    pts = fixed()
    assert pts.shape == (52, 2)
    assert (pts[:, 0] >= -0.5).all() and (pts[:, 0] <= 1.5).all() and (pts[:, 1] >= 5).all()
    assert not torch.equal(MeasurementPoints(x, 2, 5)(), MeasurementPoints(x, 2, 5)())


def test_missing_output_site_raises():
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]) as idx:
            pyro.sample("obs", dist.Poisson(w.exp() * x[idx].abs()), obs=None if y is None else y[idx])

    x, y = torch.randn(10), torch.ones(10)
    with pytest.raises(ValueError, match="pyro.deterministic"):  # no "f", a likelihood without a known parameter
        FSGLD(model, gp_prior=gp.kernels.RBF(1)).setup(0, x, y)
    with pytest.raises(ValueError, match="no site 'g'"):  # a site named by the user must exist
        FSGLD(model, gp_prior=gp.kernels.RBF(1), output_site="g").setup(0, x, y)


def readme_model(x, y=None):
    """The README's model, written as for NUTS: no deterministic site, the network outputs are the logits."""
    w1 = pyro.sample("w1", dist.Normal(0.0, 1.0).expand([2, 8]).to_event(2))
    w2 = pyro.sample("w2", dist.Normal(0.0, 1.0).expand([8, 2]).to_event(2))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("y", dist.Categorical(logits=torch.tanh(x[idx] @ w1) @ w2), obs=None if y is None else y[idx])


def regression_model(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)


@pytest.mark.parametrize("kernel_cls", [FSGLD, FSGHMC])
def test_a_model_without_an_output_site_gives_its_likelihood_parameters(kernel_cls):
    # the README's swap SGHMC(...) -> FSGLD(model, gp_prior=...): the outputs are read from the likelihood, the
    # Categorical's (normalised) logits and the Normal's loc, on the single concatenated pass
    torch.manual_seed(0)
    x = torch.randn(40, 2)
    y = (x[:, 0] > 0).long()
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel_cls(readme_model, gp_prior=gp.kernels.RBF(2), step_size=1e-4, num_steps=2, subsample_size=8),
                num_samples=3, warmup_steps=2, disable_progbar=True)
    mcmc.run(x, y)
    U = mcmc.kernel.potential
    assert U.concatenated and U.event_dim == 2
    values = {k: v[-1] for k, v in mcmc.get_samples().items()}
    points = torch.randn(5, 2)
    expected = torch.log_softmax(torch.tanh(points @ values["w1"]) @ values["w2"], -1)
    torch.testing.assert_close(U.measurement_outputs(values, points), expected)
    # a Normal likelihood: its loc, the same as a deterministic site "f" would give
    x, y = torch.randn(30, 2), torch.randn(30)
    U = FSGLD(regression_model, gp_prior=gp.kernels.RBF(2), output_site="y")
    U.setup(0, x, y)
    w = torch.tensor([0.3, -1.2])
    torch.testing.assert_close(U.potential.measurement_outputs({"w": w}, points), points @ w)


def test_bad_functional_arguments():
    x, y = _data()
    with pytest.raises(TypeError, match="gp_prior"):
        FSGLD(linear_model, gp_prior="rbf")
    with pytest.raises(ValueError, match="prior_sites"):
        FSGLD(linear_model, gp_prior=_prior(), prior_sites=("sigma",)).setup(0, x, y)
    with pytest.raises(ValueError, match="jitter"):
        FSGLD(linear_model, gp_prior=gp.kernels.RBF(1), jitter=0.0).setup(0, x, y)


def test_eager_backend_matches_traced_functional_step():
    # temperature 0: one step is w - eta/2 * grad; the eager (per-step Pyro trace) and traced paths must agree
    x, y = _data()
    prior = _prior()
    steps = {}
    for backend in ("eager", "fx"):
        kernel = FSGLD(linear_model, gp_prior=prior, step_size=1e-2, temperature=0.0, backend=backend)
        kernel.initial_params = {"w": torch.tensor([0.3, -0.2, 0.8], dtype=torch.float64)}
        kernel.setup(0, x, y)
        steps[backend] = kernel.sample(kernel.initial_params)["w"]
        assert kernel.backend_used == backend
    torch.testing.assert_close(steps["eager"], steps["fx"])


def test_redraw_every_keeps_sets_and_refactorises_per_set():
    x = torch.linspace(-2, 2, 30).unsqueeze(-1)
    y = torch.sin(2 * x[:, 0])
    points = MeasurementPoints(x, num_data=4, num_box=4, redraw_every=3)
    first = [points() for _ in range(3)]
    assert first[0] is first[1] is first[2] and points() is not first[0]
    kernel = FSGLD(BayesianMLP([1, 8, 1]), gp_prior=gp.kernels.RBF(1), measurement_points=points, step_size=1e-5,
                   num_steps=6, subsample_size=10)
    mcmc = MCMC(kernel, num_samples=3, warmup_steps=1, disable_progbar=True)
    mcmc.run(x, y)
    _assert_factor_of_set(kernel, *kernel._points_cache)
    # in the kernel, each set (with its factor) is handed to exactly redraw_every = 3 consecutive steps
    handed = [kernel._potential_and_grad_inputs() for _ in range(10)]
    changes = [i for i in range(1, 10) if handed[i][0] is not handed[i - 1][0]]
    assert len(changes) >= 2 and all(b - a == 3 for a, b in zip(changes, changes[1:]))
    assert all(handed[i][1] is handed[i - 1][1] for i in range(1, 10) if i not in changes)


def _assert_factor_of_set(kernel, pts, factor):
    """``factor`` is the Cholesky factor, or the inverse, of the jittered kernel matrix of ``pts``."""
    cov = gp.kernels.RBF(1)(pts.double())
    cov = cov + kernel.potential.jitter * cov.diagonal().mean() * torch.eye(len(pts), dtype=cov.dtype)
    if kernel._factor_kind == "precision":
        torch.testing.assert_close(factor @ cov, torch.eye(len(pts), dtype=cov.dtype), atol=1e-6, rtol=0)
    else:
        torch.testing.assert_close(factor @ factor.T, cov)


def _sine_data():
    x = torch.linspace(-2, 2, 30).unsqueeze(-1)
    return x, torch.sin(2 * x[:, 0])


def _small_fsgld(x, backend, num_steps=2, step_size=1e-5, **points_kwargs):
    """fSGLD on a 1-8-1 BayesianMLP with 4 + 4 measurement points per set (``points_kwargs`` for the sampler)."""
    points = MeasurementPoints(x, num_data=4, num_box=4, **points_kwargs)
    return FSGLD(BayesianMLP([1, 8, 1]), gp_prior=gp.kernels.RBF(1), measurement_points=points, step_size=step_size,
                 num_steps=num_steps, subsample_size=10, backend=backend)


@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_prefetched_sets_are_fresh_every_step_and_factorised_exactly(backend):
    # sets are drawn `prefetch` at a time and factorised in one batched call; each step still gets its own
    # independent set, and the factor handed to the step is that of the set handed with it
    x, y = _sine_data()
    kernel = _small_fsgld(x, backend, prefetch=3)
    kernel.setup(0, x, y)
    kernel.sample(kernel.initial_params)
    assert kernel.backend_used == backend
    assert kernel._factor_kind == "cholesky"
    handed = [kernel._potential_and_grad_inputs() for _ in range(7)]
    for i, (pts, factor) in enumerate(handed):
        assert pts.shape == (8, 1)
        assert all(not torch.equal(pts, other) for other, _ in handed[i + 1:])
        _assert_factor_of_set(kernel, pts, factor)


def test_batched_factors_of_failed_sets_are_nan():
    # a set whose factorisation fails gets an all-NaN factor; the others are those of the unbatched factorisation
    x, y = _data()
    U = FunctionalPotential(linear_model, (x, y), gp_kernel=_prior().kernel, example_points=POINTS)
    U.jitter = -0.5  # K - sigma^2 / 2 I: positive definite for far-apart points only
    sets = torch.stack([POINTS * 10, POINTS * 0.01, POINTS * 20, POINTS * 0.02 + 1])
    for points, factor in zip(sets, U.cholesky(sets, batched=True)):
        if points.diff().abs().max() < 1:  # close points: the factorisation fails
            assert factor.isnan().all()
        else:
            torch.testing.assert_close(factor, U.cholesky(points), rtol=1e-12, atol=0)


def test_precision_and_cholesky_give_the_same_potential_and_gradient():
    x, y = _data()
    U = FunctionalPotential(linear_model, (x, y), gp_kernel=_prior().kernel, example_points=POINTS)
    w = torch.tensor([0.3, -0.2, 0.8], dtype=torch.float64)
    results = []
    for kwargs in ({"scale_tril": U.cholesky(POINTS)}, {"precision": U.precision(POINTS)}, {}):
        u = w.clone().requires_grad_()
        value = U(u, None, POINTS, **kwargs)
        results.append((value.detach(), torch.autograd.grad(value, u)[0]))
    for value, grad in results[1:]:
        torch.testing.assert_close(value, results[0][0])
        torch.testing.assert_close(grad, results[0][1])
    with pytest.raises(TypeError, match="points"):  # the measurement set is required
        U(w)


def test_measurement_points_draw_sets_and_bad_arguments():
    x = torch.tensor([[0.0, 10.0], [1.0, 20.0], [2.0, 30.0]])
    sets = MeasurementPoints(x, num_data=3, num_box=4, margin=0.0).draw_sets(5)
    assert sets.shape == (5, 7, 2)
    for s in sets:  # the data part is a permutation of the inputs, the box part lies in the (unwidened) box
        assert torch.equal(s[:3][s[:3, 0].argsort()], x)
        assert (s[3:, 0] >= 0).all() and (s[3:, 0] <= 2).all() and (s[3:, 1] >= 10).all() and (s[3:, 1] <= 30).all()
    for kwargs, match in (({"prefetch": 0}, "prefetch"), ({"redraw_every": 0}, "redraw_every"),
                          ({"num_data": -1}, "num_data"), ({"margin": -1.0}, "margin"),
                          ({"num_data": 0, "num_box": 0}, "at least 1")):
        with pytest.raises(ValueError, match=match):
            MeasurementPoints(x, **kwargs)


def test_output_fn_matches_the_deterministic_site():
    x, y = _data()
    prior = _prior()
    w = torch.tensor([0.3, -0.2, 0.8], dtype=torch.float64)
    by_site = FunctionalPotential(linear_model, (x, y), gp_kernel=prior.kernel, example_points=POINTS)
    by_fn = FunctionalPotential(linear_model, (x, y), gp_kernel=prior.kernel, example_points=POINTS,
                                output_fn=lambda values, points: features(points) @ values["w"])
    torch.testing.assert_close(by_fn(w, None, POINTS), by_site(w, None, POINTS))
    with pytest.raises(TypeError, match="output_fn"):
        FunctionalPotential(linear_model, (x, y), gp_kernel=prior.kernel, example_points=POINTS, output_fn=3)



def _bnn_potentials(model, x, y, points, **kwargs):
    return {
        concatenate: FunctionalPotential(model, (x, y), gp_kernel=gp.kernels.RBF(1), example_points=points,
                                         concatenate_inputs=concatenate, **kwargs)
        for concatenate in (True, False)
    }


@pytest.mark.parametrize("subsample_size", [None, 10])
def test_concatenated_forward_pass_matches_two_traces(subsample_size):
    # one trace on [x_B; X_M] must give the two-trace potential and gradient exactly (float64)
    x = torch.linspace(-2, 2, 30, dtype=torch.float64).unsqueeze(-1)
    y = torch.sin(2 * x[:, 0])
    points = MeasurementPoints(x, num_data=8, num_box=8)()
    model = BayesianMLP([1, 16, 16, 1], noise_scale=None).double()
    potentials = _bnn_potentials(model, x, y, points, prior_sites=("sigma",), subsample_size=subsample_size)
    assert potentials[True].concatenated and not potentials[False].concatenated
    u = 0.5 * torch.randn(potentials[True].dim, dtype=torch.float64)
    idx = None if subsample_size is None else torch.randperm(30)[:subsample_size]
    out = {}
    for concatenate, potential in potentials.items():
        w = u.clone().requires_grad_()
        value = potential(w, idx, points)
        out[concatenate] = (value.detach(), torch.autograd.grad(value, w)[0])
    torch.testing.assert_close(out[True], out[False])


def test_concatenated_step_matches_two_trace_step_with_vectorized_chains():
    # temperature 0: one fSGLD step is w - eta/2 grad, per chain (vmap over chains, per-chain minibatches)
    x = torch.linspace(-2, 2, 30, dtype=torch.float64).unsqueeze(-1)
    y = torch.sin(2 * x[:, 0])
    points = MeasurementPoints(x, num_data=8, num_box=8, redraw=False)
    model = BayesianMLP([1, 8, 1]).double()
    results = {}
    for concatenate in (True, False):
        pyro.set_rng_seed(1)
        kernel = FSGLD(model, gp_prior=gp.kernels.RBF(1), measurement_points=points, step_size=1e-3,
                       temperature=0.0, subsample_size=10, vectorized_chains=3, concatenate_inputs=concatenate,
                       backend="fx")
        kernel.setup(0, x, y)
        assert kernel.potential.concatenated is concatenate
        results[concatenate] = kernel.sample(kernel.initial_params)
    for name in results[True]:
        torch.testing.assert_close(results[True][name], results[False][name])


def test_models_that_cannot_be_concatenated_fall_back_to_two_traces():
    x, y = _data()
    size = len(x)

    def fixed_size_model(x, y=None):  # with targets, the plate size is the data size, not len(x)
        w = pyro.sample("w", dist.Normal(torch.zeros(3, dtype=x.dtype), 1.0).to_event(1))
        with pyro.plate("data", size if y is not None else len(x)) as idx:
            f = pyro.deterministic("f", features(x[idx]) @ w)
            pyro.sample("obs", dist.Normal(f, NOISE), obs=None if y is None else y[idx])

    prior = _prior()
    potential = FunctionalPotential(fixed_size_model, (x, y), gp_kernel=prior.kernel, example_points=POINTS)
    assert not potential.concatenated
    with pytest.raises(ValueError, match="concatenate_inputs=True"):
        FunctionalPotential(fixed_size_model, (x, y), gp_kernel=prior.kernel, example_points=POINTS,
                            concatenate_inputs=True)
    by_fn = FunctionalPotential(linear_model, (x, y), gp_kernel=prior.kernel, example_points=POINTS,
                                output_fn=lambda values, points: features(points) @ values["w"])
    assert not by_fn.concatenated
    with pytest.raises(TypeError, match="concatenate_inputs"):
        FunctionalPotential(linear_model, (x, y), gp_kernel=prior.kernel, example_points=POINTS,
                            concatenate_inputs="yes")


def test_each_kernel_keeps_its_own_hyper_parameters():
    # pyro.contrib.gp kernels read their parameters from the global param store by name: two RBF kernels (e.g. one
    # refitted per data split) must not take each other's values when the potential evaluates them
    x, y = _data()
    potentials = {}
    for lengthscale in (0.5, 2.0):
        kernel = gp.kernels.RBF(1, variance=torch.tensor(1.0), lengthscale=torch.tensor(lengthscale))
        potentials[lengthscale] = FunctionalPotential(linear_model, (x, y), gp_kernel=kernel, example_points=POINTS)
    for lengthscale, potential in potentials.items():
        expected = torch.exp(-0.5 * (POINTS[:, None] - POINTS[None, :]).square() / lengthscale**2)
        torch.testing.assert_close(potential.kernel_matrix(POINTS).double(), expected)


def test_gp_functional_prior_mean_is_used():
    x, y = _data()
    kernel = gp.kernels.RBF(1, variance=torch.tensor(1.0), lengthscale=torch.tensor(0.5))
    prior = GPFunctionalPrior(kernel, POINTS, mean=torch.tensor(3.0, dtype=torch.float64))
    fsgld = FSGLD(linear_model, gp_prior=prior)
    fsgld.setup(0, x, y)
    w = torch.tensor([0.3, -0.2, 0.8], dtype=torch.float64)
    residual = features(POINTS) @ w - 3.0
    alpha = torch.cholesky_solve(residual[:, None], prior.scale_tril64)[:, 0]
    nll = -dist.Normal(features(x) @ w, NOISE).log_prob(y).sum()
    args, kwargs = _step_inputs(fsgld, w)
    torch.testing.assert_close(fsgld.potential(*args, **kwargs), nll + 0.5 * residual @ alpha)
    with pytest.raises(ValueError, match="gp_mean"):
        FSGLD(linear_model, gp_prior=prior, gp_mean=1.0)


def _step_inputs(kernel, w):
    points, factor = kernel._potential_and_grad_inputs()
    return (w, None, points), {"precision": factor} if kernel._factor_kind == "precision" else {"scale_tril": factor}


def test_default_measurement_points_follow_new_data():
    kernel = FSGLD(BayesianMLP([1, 8, 1]), gp_prior=gp.kernels.RBF(1), step_size=1e-5, subsample_size=10,
                   num_measurement_data=4, num_measurement_box=4)
    for low in (-1.0, 99.0):
        x = torch.linspace(low, low + 2, 30).unsqueeze(-1)
        kernel.setup(0, x, torch.sin(x[:, 0]))
        assert kernel.measurement_points is None  # the user's argument is left alone
        assert kernel._sampler.inputs is x
        points, _ = kernel._potential_and_grad_inputs()
        assert points.min() >= low - 1 and points.max() <= low + 3  # training range widened by the 0.5 margin
        kernel.cleanup()


def test_fsgld_keeps_its_papers_noise_by_default_and_takes_sglds_on_request():
    # fSGLD's gradient carries the noise of measurement points redrawn every step, which grows with the step: it keeps
    # Euler-Maruyama's noise and the quarter-limit cap of its reference unless asked; SGLD's default is "lm"
    default = FSGLD(regression_model, gp_prior=gp.kernels.RBF(2))
    assert default.integrator == "euler" and default._CURVATURE_FACTOR == 1.0
    lm = FSGLD(regression_model, gp_prior=gp.kernels.RBF(2), integrator="lm")
    assert lm.integrator == "lm" and lm._CURVATURE_FACTOR == 3.0
    with pytest.raises(ValueError, match="integrator must be 'lm' or 'euler'"):
        FSGLD(regression_model, gp_prior=gp.kernels.RBF(2), integrator="baoab")
