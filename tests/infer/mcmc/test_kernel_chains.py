# SPDX-License-Identifier: Apache-2.0
"""Vectorised chains are chains for Pyro's MCMC, Predictive and ArviZ; divergences land on the chain that diverged."""

import multiprocessing

import arviz as az
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, Predictive
from pyro.ops.stats import split_gelman_rubin

from pyro_sdebnn.infer.mcmc import SGHMC, SGLD, to_inference_data
from pyro_sdebnn.infer.mcmc.arviz import get_samples
from pyro_sdebnn.infer.mcmc.diagnostics import SamplerWarning

# the chains here are short (a few draws): the end-of-run check finds R-hat above 1.1; the tests where a warning is
# the point assert it with pytest.warns
pytestmark = pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")

N = 30


def model(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0))
    sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", x.shape[0]) as idx:
        return pyro.sample("y", dist.Normal(w * x[idx], sigma), obs=None if y is None else y[idx])


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, generator=g, dtype=torch.float64)
    return x, 1.5 * x + 0.5 * torch.randn(N, generator=g, dtype=torch.float64)


def test_mcmc_stores_vectorised_chains_as_chains_in_the_kernels_order():
    # what MCMC stores for chain c * K + k, draw i is exactly what the kernel returned for vectorised chain k of
    # MCMC chain c at draw i (read through hook_fn, unconstrained), mapped to the constrained space
    x, y = _data()
    seen = {}

    def hook(kernel, params, stage, i):
        if stage.startswith("Sample"):
            seen.setdefault(stage, []).append({k: v.clone() for k, v in params.items()})

    pyro.set_rng_seed(0)
    kernel = SGLD(model, step_size=1e-3, subsample_size=10, vectorized_chains=3)
    mcmc = MCMC(kernel, num_samples=7, warmup_steps=5, hook_fn=hook, disable_progbar=True)
    mcmc.run(x, y)
    grouped = mcmc.get_samples(group_by_chain=True)
    assert grouped["w"].shape == (3, 7) and grouped["sigma"].shape == (3, 7)
    (draws,) = seen.values()
    for i, params in enumerate(draws):
        for k in range(3):
            assert grouped["w"][k, i] == params["w"][k]
            torch.testing.assert_close(grouped["sigma"][k, i], params["sigma"][k].exp(), rtol=1e-12, atol=0)
    flat = mcmc.get_samples()
    assert flat["w"].shape == (21,)
    torch.testing.assert_close(flat["w"], grouped["w"].reshape(-1), rtol=0, atol=0)  # chain after chain
    for name, value in get_samples(mcmc).items():
        assert torch.equal(value, flat[name])


def test_predictive_on_plain_get_samples_of_vectorised_chains():
    x, y = _data()
    pyro.set_rng_seed(1)
    kernel = SGHMC(model, step_size=1e-3, friction=1.0, num_steps=2, subsample_size=10, vectorized_chains=4)
    mcmc = MCMC(kernel, num_samples=6, warmup_steps=3, disable_progbar=True)
    mcmc.run(x, y)
    samples = mcmc.get_samples()
    x_new = torch.linspace(-1.0, 1.0, 5, dtype=torch.float64)
    predictive = Predictive(model, samples, return_sites=["y", "_RETURN"])
    out = predictive(x_new)
    assert out["y"].shape == (24, 5)  # 4 chains x 6 draws, one prediction per draw
    # each draw's prediction uses that draw's w and sigma: the residual over sigma is standard normal (24 x 5 values,
    # so its mean is within 4 standard errors of 0 and its variance within 4 standard errors of 1)
    z = (out["y"] - samples["w"][:, None] * x_new) / samples["sigma"][:, None]
    assert abs(float(z.mean())) < 4 / 120**0.5
    assert abs(float(z.var()) - 1) < 4 * (2 / 119) ** 0.5


def test_summary_and_diagnostics_see_k_chains_and_their_r_hat(capsys):
    x, y = _data()
    pyro.set_rng_seed(2)
    # chains started far apart with a tiny step have not mixed: R-hat over the 4 chains is large; run long enough
    # with a reasonable step, they agree (R-hat close to 1)
    start = {"w": torch.tensor([-3.0, -1.0, 1.0, 3.0], dtype=torch.float64),
             "sigma": torch.zeros(4, dtype=torch.float64)}
    stuck = SGLD(model, step_size=1e-6, vectorized_chains=4)
    stuck.initial_params = dict(start)
    mcmc = MCMC(stuck, num_samples=20, warmup_steps=0, disable_progbar=True)
    with pytest.warns(SamplerWarning, match=r"SGLD: site 'w' has split R-hat [0-9.e+]+ > 1.1 across 4 chains") as rec:
        mcmc.run(x, y)
    r_hat = mcmc.diagnostics()["w"]["r_hat"]
    warned = [w for w in rec if "'w'" in str(w.message)]
    assert len(warned) == 1  # one line per site
    assert str(warned[0].message).endswith("SGHMC, whose momentum carries it along loosely determined directions, "
                                           "often mixes in fewer steps")  # SGLD's line points to SGHMC
    # the streamed split R-hat (constrained space, no draws kept) is Pyro's split Gelman-Rubin of the stored draws,
    # printed to three significant figures
    assert str(warned[0].message).split("R-hat ")[1].split()[0] == f"{float(r_hat):.3g}"
    assert r_hat.shape == () and float(r_hat) > 10
    torch.testing.assert_close(r_hat, split_gelman_rubin(get_samples(mcmc, group_by_chain=True)["w"]))
    mcmc.summary()
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith(("w", "sigma"))]
    assert [row[0] for row in rows] == ["sigma", "w"]  # one row per site, not one per vectorised chain
    assert float(rows[1][-1]) > 10
    idata = to_inference_data(mcmc, log_likelihood=False)
    assert idata.posterior.sizes["chain"] == 4 and float(az.rhat(idata)["w"]) > 2  # rank-normalised: bounded

    mixing = SGLD(model, step_size=2e-3, num_steps=5, vectorized_chains=4)
    mixing.initial_params = dict(start)
    mcmc = MCMC(mixing, num_samples=200, warmup_steps=50, disable_progbar=True)
    mcmc.run(x, y)
    assert float(mcmc.diagnostics()["w"]["r_hat"]) < 1.1
    assert float(az.rhat(to_inference_data(mcmc, log_likelihood=False))["w"]) < 1.1


def test_sequential_chains_that_have_not_mixed_warn_once_across_the_run(monkeypatch):
    # each of MCMC's sequential chains builds its own potential: the end-of-run check still gathers all the run's
    # chains and warns once, at the end of the last one, about R-hat across them
    x, y = _data()
    monkeypatch.setattr(multiprocessing, "cpu_count", lambda: 1)  # chains in this process on any machine
    pyro.set_rng_seed(2)
    start = {"w": torch.tensor([-3.0, 3.0], dtype=torch.float64), "sigma": torch.zeros(2, dtype=torch.float64)}
    kernel = SGLD(model, step_size=1e-6, map_steps=0)
    with pytest.warns(UserWarning, match="drawn sequentially"):
        mcmc = MCMC(kernel, num_samples=20, warmup_steps=0, num_chains=2, initial_params=start, disable_progbar=True)
    with pytest.warns(SamplerWarning) as rec:
        mcmc.run(x, y)
    warned = [str(w.message) for w in rec if issubclass(w.category, SamplerWarning) and "'w'" in str(w.message)]
    assert len(warned) == 1 and "across 2 chains" in warned[0]
    assert float(warned[0].split("R-hat ")[1].split()[0]) > 10


def test_from_pyro_chains_of_sequential_and_vectorised_chains(monkeypatch):
    x, y = _data()
    monkeypatch.setattr(multiprocessing, "cpu_count", lambda: 1)  # chains in this process on any machine
    pyro.set_rng_seed(3)
    kernel = SGLD(model, step_size=1e-3, subsample_size=10, vectorized_chains=3)
    with pytest.warns(UserWarning, match="drawn sequentially"):
        mcmc = MCMC(kernel, num_samples=8, warmup_steps=4, num_chains=2, disable_progbar=True)
    mcmc.run(x, y)
    grouped = mcmc.get_samples(group_by_chain=True)
    assert grouped["w"].shape == (6, 8)
    idata = to_inference_data(mcmc)
    assert idata.posterior["w"].shape == (6, 8)
    assert idata.sample_stats["diverging"].shape == (6, 8)
    assert idata.log_likelihood["y"].shape == (6, 8, N)
    torch.testing.assert_close(torch.from_numpy(idata.posterior["w"].values), grouped["w"], rtol=0, atol=0)


def _diverging_rows(idata):
    return [int(c) for c in torch.from_numpy(idata.sample_stats["diverging"].values).any(1).nonzero()]


def test_divergence_of_one_vectorised_chain_marks_that_chain_only():
    x, y = _data()
    pyro.set_rng_seed(4)
    K = 12
    kernel = SGLD(model, step_size=1e-3, vectorized_chains=K, on_divergence="continue")
    w0 = torch.zeros(K, dtype=torch.float64)
    w0[10] = 1e30  # finite, but its square overflows: chain 10 diverges (and restarts there) at every sample
    kernel.initial_params = {"w": w0, "sigma": torch.zeros(K, dtype=torch.float64)}
    mcmc = MCMC(kernel, num_samples=15, warmup_steps=2, disable_progbar=True)
    with pytest.warns(SamplerWarning, match=r"SGLD: 15 divergence\(s\)"):
        mcmc.run(x, y)
    assert {r["chain"] for r in kernel.divergence_log} == {10}
    idata = to_inference_data(mcmc, log_likelihood=False)
    assert idata.sample_stats["diverging"].shape == (K, 15)
    assert _diverging_rows(idata) == [10]
    assert bool(idata.sample_stats["diverging"].values[10].all())


def test_divergences_of_eleven_sequential_chains_in_numeric_order(monkeypatch):
    # diagnostics() keys the chains "chain 0" ... "chain 10"; a string sort would put "chain 10" third
    x, y = _data()
    monkeypatch.setattr(multiprocessing, "cpu_count", lambda: 1)
    pyro.set_rng_seed(5)
    C = 11
    w0 = torch.zeros(C, dtype=torch.float64)
    w0[2] = 1e30
    kernel = SGLD(model, step_size=1e-3, on_divergence="continue")
    with pytest.warns(UserWarning, match="drawn sequentially"):
        mcmc = MCMC(kernel, num_samples=12, warmup_steps=1, num_chains=C, disable_progbar=True,
                    initial_params={"w": w0, "sigma": torch.zeros(C, dtype=torch.float64)})
    with pytest.warns(SamplerWarning, match=r"divergence\(s\)"):  # once, after the last of the 11 chains
        mcmc.run(x, y)
    assert [len(mcmc.diagnostics()["divergences"][f"chain {c}"]) > 0 for c in range(C)] == [c == 2 for c in range(C)]
    idata = to_inference_data(mcmc, log_likelihood=False)
    assert _diverging_rows(idata) == [2]


# ----- the warm start and the eager start compute the chains' gradients together -----------------------------------
def _counting(fn):
    def counted(*args, **kwargs):
        counted.calls += 1
        return fn(*args, **kwargs)

    counted.calls = 0
    return counted


def _bnn_data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 2, generator=g, dtype=torch.float64)
    return x, (x[:, 0] * x[:, 1] > 0).double()


def _warm_start(net, chains, start, x, y, backend="auto"):
    counted = _counting(net)
    kernel = SGLD(counted, map_steps=0, vectorized_chains=chains, backend=backend)
    kernel.initial_params = start
    kernel.setup(0, x, y)
    kernel.map_steps, calls = 20, counted.calls
    end = kernel._map_fit(kernel.potential.pack(start))  # as setup runs it
    return end, kernel, counted.calls - calls


@pytest.mark.parametrize("backend", ["auto", "eager"])
def test_warm_start_of_vectorised_chains_is_each_chains_own_warm_start(backend):
    # C chains start from C points; the warm start traces the model once per Adam step for all of them (not once per
    # chain) and ends where C single-chain warm starts from those points end, to the rounding of the batched products;
    # backend="eager" (any model) keeps the chain-by-chain gradient: bitwise the single-chain warm starts
    from pyro_sdebnn.infer.mcmc import BayesianMLP

    x, y = _bnn_data()
    net = BayesianMLP([2, 8, 1], likelihood="bernoulli").double()
    pyro.set_rng_seed(0)
    probe = SGLD(net, map_steps=0, vectorized_chains=3)
    probe.setup(0, x, y)
    start = {k: v.clone() for k, v in probe.initial_params.items()}
    together, kernel, calls = _warm_start(net, 3, start, x, y, backend)
    assert kernel.map_steps_taken == 20 and calls == (20 if backend == "auto" else 3 * 20)  # traces of the model
    for k in range(3):
        alone, _, single_calls = _warm_start(net, 1, {name: v[k] for name, v in start.items()}, x, y, backend)
        assert single_calls == 20
        if backend == "eager":
            assert torch.equal(together[k], alone)
        torch.testing.assert_close(together[k], alone, rtol=1e-12, atol=1e-12)
        assert (together[k] - probe.potential.pack(start)[k]).abs().max() > 0.1  # the fit moved


def branchy_model(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0))
    sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    slope = w if float(w.detach()) > -10.0 else -w  # data-dependent control flow: vmap cannot run it
    with pyro.plate("data", x.shape[0]) as idx:
        return pyro.sample("y", dist.Normal(slope * x[idx], sigma), obs=None if y is None else y[idx])


def test_warm_start_of_a_model_vmap_cannot_run_is_chain_by_chain_and_exact():
    # the batched gradient fails on the model's control flow: the chains are warm started one by one, bitwise as C
    # single-chain warm starts, and the batched path is not tried again for that potential
    x, y = _data()
    start = {"w": torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64), "sigma": torch.zeros(3, dtype=torch.float64)}
    together, kernel, calls = _warm_start(branchy_model, 3, start, x, y)
    assert kernel._unbatched is kernel.potential and calls == 1 + 3 * 20  # the failed try, then chain by chain
    for k in range(3):
        alone, _, _ = _warm_start(branchy_model, 1, {name: v[k] for name, v in start.items()}, x, y)
        assert torch.equal(together[k], alone)


@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC])
def test_eager_start_draws_the_noise_chain_by_chain_as_before(kernel_cls):
    # backend="auto"'s eager steps: the chains' gradients together, then each chain's noise and update in turn, so
    # that the random stream is that of the chain-by-chain step and the states agree to rounding
    from pyro_sdebnn.infer.mcmc import BayesianMLP

    x, y = _bnn_data()
    counted = _counting(BayesianMLP([2, 8, 1], likelihood="bernoulli").double())
    pyro.set_rng_seed(0)
    kernel = kernel_cls(counted, step_size=1e-3, subsample_size=10, map_steps=0, vectorized_chains=3)
    kernel.setup(0, x, y)
    idx, eta = kernel._next_indices(), torch.tensor(1e-3, dtype=torch.float64)
    rng = torch.get_rng_state()
    calls = counted.calls
    together, value = kernel._eager_step(kernel._state, idx, eta)
    assert counted.calls - calls == 1
    torch.set_rng_state(rng)
    kernel._unbatched = kernel.potential  # chain by chain, as backend="eager"
    one_by_one, reference = kernel._eager_step(kernel._state, idx, eta)
    assert counted.calls - calls == 1 + 3
    for a, b in zip(together, one_by_one):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(value, reference, rtol=1e-12, atol=0)


@pytest.mark.parametrize("chains", [1, 3])
def test_curvature_estimate_takes_the_gradients_together_and_each_chain_iterates_on_its_own(chains):
    # the warm-up's curvature estimate (power iteration on central differences of the minibatch-averaged gradient)
    # takes the gradient at every chain's two points x_k +- d v_k together, one trace of the model per minibatch, and
    # equals the chain-by-chain estimate from the same random state to the rounding of the batched products, drawing
    # the same random numbers. A chain whose iteration stops (here a NaN position) leaves the others' running.
    from pyro_sdebnn.infer.mcmc import BayesianMLP

    x, y = _bnn_data()

    def estimate(together):
        counted = _counting(BayesianMLP([2, 8, 1], likelihood="bernoulli").double())
        pyro.set_rng_seed(0)
        kernel = SGLD(counted, subsample_size=10, map_steps=0, vectorized_chains=chains)
        kernel.setup(10, x, y)
        kernel._CURVATURE_ITERATIONS, kernel._CURVATURE_BATCHES = 5, 2  # fewer than a run's: a faster test
        if not together:
            kernel._unbatched = kernel.potential  # chain by chain, as backend="eager"
        kernel._set_inverse_mass(torch.linspace(0.5, 1.5, kernel.potential.dim, dtype=torch.float64))
        start = kernel._state[0]
        stopped = start.clone()
        if chains > 1:
            stopped[1] = float("nan")
        calls = counted.calls
        out = []
        for positions in ([start, 0.5 * start], [stopped]):
            eta = kernel._stable_step(positions)
            out += [kernel.max_curvature, eta]
        return out, counted.calls - calls, torch.randn(())

    (lam, eta, lam_stopped, eta_stopped), calls, after = estimate(True)
    reference, reference_calls, reference_after = estimate(False)
    # 3 positions x 5 iterations x 2 minibatches; chain by chain, each chain's two points in turn
    assert calls == 3 * 5 * 2 and reference_calls == 2 * chains * calls and torch.equal(after, reference_after)
    torch.testing.assert_close([lam, eta, lam_stopped, eta_stopped], reference, rtol=1e-10, atol=0)
    assert lam_stopped > 0  # the stopped chain's lam is 0, not the others'
