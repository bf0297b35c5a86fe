# SPDX-License-Identifier: Apache-2.0
"""Backends of the SG-MCMC step (one step function, traced or not), the closed-form Gaussian prior, the graph cache
and the ``auto`` rule."""

import subprocess
import sys

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_sdebnn.infer.mcmc import BayesianMLP, SGLD
from pyro_sdebnn.infer.mcmc.potential import MinibatchPotential
from pyro_sdebnn.infer.mcmc import kernel as step_module



def _data(n=40):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g, dtype=torch.float64)
    return x, torch.sin(x[:, 0]) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)


# one fixed distribution object (as a PyroSample holds): recognised as a constant Normal prior
PRIOR_A = dist.Normal(torch.tensor(0.5, dtype=torch.float64), 2.0).expand([2]).to_event(1)


def mixed_prior_model(x, y=None):
    a = pyro.sample("a", PRIOR_A)  # constant Normal: closed form
    b = pyro.sample("b", dist.Normal(torch.zeros(2, dtype=x.dtype), torch.tensor([1.0, 3.0], dtype=x.dtype))
                    .to_event(1))  # a new object in every run, per-coordinate scale: closed form
    sigma = pyro.sample("sigma", dist.LogNormal(x.new_tensor(0.0), 1.0))  # constrained: stays in the traced potential
    c = pyro.sample("c", dist.Normal(x.new_tensor(0.0), sigma).expand([2]).to_event(1))  # scale is a latent: traced
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ (a + b + c), sigma), obs=None if y is None else y[idx])


def handwritten_mlp(spelling, sizes=(2, 5, 1)):
    """A 2-5-1 tanh network written as Pyro's examples write it, its N(0, 1) priors spelled two ways."""
    def prior(shape):
        if spelling == "expand":
            return dist.Normal(torch.tensor(0.0, dtype=torch.float64), 1.0).expand(shape).to_event(len(shape))
        return dist.Normal(torch.zeros(shape, dtype=torch.float64), 1.0).to_event(len(shape))

    def model(x, y=None):
        w0, b0 = pyro.sample("w0", prior([sizes[0], sizes[1]])), pyro.sample("b0", prior([sizes[1]]))
        w1, b1 = pyro.sample("w1", prior([sizes[1], sizes[2]])), pyro.sample("b1", prior([sizes[2]]))
        with pyro.plate("data", x.shape[0]) as idx:
            f = (torch.tanh(x[idx] @ w0 + b0) @ w1 + b1).squeeze(-1)
            pyro.sample("obs", dist.Normal(f, 1.0), obs=None if y is None else y[idx])

    return model


@pytest.mark.parametrize("model, sites", [
    (mixed_prior_model, {"a", "b"}),
    (BayesianMLP([2, 5, 1]).double(), {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"}),
    (handwritten_mlp("expand"), {"w0", "b0", "w1", "b1"}),
    (handwritten_mlp("zeros"), {"w0", "b0", "w1", "b1"}),
], ids=["mixed", "PyroSample", "expand", "zeros"])
def test_closed_form_gaussian_prior_adds_up_to_the_potential(model, sites):
    x, y = _data()
    potential = MinibatchPotential(model, (x, y), subsample_size=10)
    assert potential.gaussian_prior_sites == sites
    u = torch.randn(potential.dim, dtype=torch.float64, requires_grad=True)
    idx = torch.arange(10)
    full = potential(u, idx)
    (grad_full,) = torch.autograd.grad(full, u)
    rest = potential(u, idx, exclude_gaussian_prior=True)
    (grad_rest,) = torch.autograd.grad(rest, u)
    prior_value, prior_grad = potential.gaussian_prior(u.detach())
    torch.testing.assert_close(rest.detach() + prior_value, full.detach())
    torch.testing.assert_close(grad_rest + prior_grad, grad_full)


@pytest.mark.parametrize("make_model", [lambda: BayesianMLP([2, 5, 1]).double(), lambda: handwritten_mlp("expand")],
                         ids=["PyroSample", "expand"])
def test_traced_step_matches_eager_step_on_a_bnn(make_model):
    # temperature 0: one SGLD step is w - eta/2 grad; the traced graph (closed-form prior) and the
    # per-step Pyro trace must agree
    x, y = _data()
    results = {}
    for backend in ("eager", "fx"):
        pyro.set_rng_seed(0)
        kernel = SGLD(make_model(), step_size=1e-3, subsample_size=10, temperature=0.0, backend=backend)
        kernel.setup(0, x, y)
        results[backend] = kernel.sample(kernel.initial_params)
    for name in results["fx"]:
        torch.testing.assert_close(results["fx"][name], results["eager"][name])


@pytest.mark.parametrize("make_model", [lambda: handwritten_mlp("expand"), lambda: mixed_prior_model],
                         ids=["expand", "mixed"])
def test_traced_step_runs_no_operation_whose_result_is_unused(make_model):
    # a model written as Pyro's examples write it keeps tensor constants in its priors; their copies and expansions
    # reach the trace but not the step's outputs, and must not run at every step (random draws, side effects, stay)
    x, y = _data()
    kernel = SGLD(make_model(), step_size=1e-3, subsample_size=10, backend="fx")
    kernel.setup(0, x, y)
    kernel.sample(kernel.initial_params)
    (graph,) = kernel._graph_modules.values()
    dead = [n.target for n in graph.graph.nodes
            if n.op == "call_function" and not n.users and not n.is_impure()]
    assert dead == []
    assert any(n.op == "call_function" and n.is_impure() for n in graph.graph.nodes)  # the noise draws


class _FakeCompiler:
    """Stands in for torch.compile: runs the graph eagerly, counting the compilations."""

    def __init__(self):
        self.calls = 0

    def __call__(self, graph, on_failure=None):
        self.calls += 1
        return graph.forward


def test_auto_backend_compiles_after_its_budget_of_steps(monkeypatch):
    fake = _FakeCompiler()
    monkeypatch.setattr(step_module, "_compile_graph", fake)
    x, y = _data()
    kernel = SGLD(BayesianMLP([2, 5, 1]).double(), step_size=1e-4, num_steps=3, subsample_size=10, compile_after=6)
    kernel.setup(0, x, y)
    params = kernel.sample(kernel.initial_params)  # 3 inner steps, eager (the first min(100, compile_after) are)
    assert kernel.backend_used == "fx" and fake.calls == 0 and kernel._graph_module is None
    params = kernel.sample(params)  # 6: the budget is spent; nothing traced yet
    assert kernel.backend_used == "compile" and fake.calls == 0 and kernel._graph_module is None
    params = kernel.sample(params)  # the first traced step is compiled
    assert kernel.backend_used == "compile" and fake.calls == 1 and kernel._graph_module is not None
    for _ in range(3):
        params = kernel.sample(params)
    assert kernel.backend_used == "compile" and fake.calls == 1
    assert kernel.diagnostics()["backend"] == "compile"


def test_auto_backend_switches_at_the_same_step_whatever_the_timing(monkeypatch):
    # the switch point is a step count: on a machine 1000 times slower (as the wall clock sees it) the step graph is
    # compiled at the same sample (a switch at a measured time would move it: the compiled step rounds differently)
    import time

    x, y = _data()
    real = time.perf_counter
    switched = []
    for speed in (1.0, 1000.0):
        fake = _FakeCompiler()
        monkeypatch.setattr(step_module, "_compile_graph", fake)
        monkeypatch.setattr(time, "perf_counter", lambda: speed * real())
        kernel = SGLD(BayesianMLP([2, 5, 1]).double(), step_size=1e-4, num_steps=2, subsample_size=10, compile_after=8)
        kernel.setup(0, x, y)
        params, backends = kernel.initial_params, []
        for _ in range(6):
            params = kernel.sample(params)
            backends.append(kernel.backend_used)
        switched.append(backends)
    monkeypatch.setattr(time, "perf_counter", real)
    assert switched[0] == switched[1] == ["fx"] * 3 + ["compile"] * 3


def test_auto_backend_stays_eager_graph_for_short_runs(monkeypatch):
    fake = _FakeCompiler()
    monkeypatch.setattr(step_module, "_compile_graph", fake)
    x, y = _data()
    kernel = SGLD(BayesianMLP([2, 5, 1]).double(), step_size=1e-4, num_steps=2, subsample_size=10)  # 10000 inner steps
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=20, disable_progbar=True)
    mcmc.run(x, y)
    assert kernel.backend_used == "fx" and fake.calls == 0


def test_auto_backend_steps_eagerly_before_its_first_trace():
    # the first 100 inner steps are eager (no trace, no graph), the later ones traced; the diagnostics say which
    x, y = _data()
    kernel = SGLD(BayesianMLP([2, 5, 1]).double(), step_size=1e-4, num_steps=10, subsample_size=10)
    mcmc = MCMC(kernel, num_samples=10, warmup_steps=0, disable_progbar=True)
    mcmc.run(x, y)
    assert kernel._t == 100 and kernel._graph_module is None and kernel.diagnostics()["backend"] == "eager"
    kernel.sample(kernel._last_params)
    assert kernel._graph_module is not None and kernel.diagnostics()["backend"] == "fx"


def test_short_default_run_does_not_import_torch_compiler():
    # constructing a torch.optim optimiser or tracing with make_fx imports torch._dynamo (about a second, the first
    # time in a process): a default run shorter than the eager start pays neither (the warm start's Adam is the
    # kernel's own; vectorised chains take their gradients together by vmap and plain autograd, not torch.func.grad)
    code = (
        "import sys, torch, pyro\n"
        "from pyro.infer import MCMC\n"
        "from pyro_sdebnn.infer.mcmc import BayesianMLP, SGLD\n"
        "x = torch.randn(64, 2); y = x[:, 0].sin()\n"
        "for chains in (1, 2):\n"
        "    kernel = SGLD(BayesianMLP([2, 5, 1]), subsample_size=16, vectorized_chains=chains)\n"
        "    MCMC(kernel, num_samples=50, warmup_steps=0, disable_progbar=True).run(x, y)\n"
        "    assert kernel.map_steps_taken > 0 and getattr(kernel, '_unbatched', None) is None\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_warm_start_adam_is_torch_adam():
    # the warm start's own Adam takes the same steps as torch.optim.Adam, to the bit, on the CPU
    g = torch.Generator().manual_seed(0)
    start = torch.randn(50, generator=g, dtype=torch.float64)
    ours, theirs = start.clone(), start.clone().requires_grad_()
    adam, reference = step_module._Adam(ours, lr=0.1), torch.optim.Adam([theirs], lr=0.1)
    for _ in range(20):
        target = torch.randn(50, generator=g, dtype=torch.float64)
        adam.step(ours - target + ours.pow(3))
        reference.zero_grad()
        (0.5 * (theirs - target).pow(2) + 0.25 * theirs.pow(4)).sum().backward()
        reference.step()
    assert torch.equal(ours, theirs.detach())


@pytest.mark.parametrize("bad", [-1, 2.0, True, "5"])
def test_bad_compile_after(bad):
    with pytest.raises(ValueError, match="compile_after"):
        SGLD(mixed_prior_model, compile_after=bad)


def test_auto_backend_survives_a_failing_compiler(monkeypatch):
    def broken_compile(graph, **kwargs):
        def run(*args):
            raise RuntimeError("no C++ compiler")

        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    x, y = _data()
    kernel = SGLD(BayesianMLP([2, 5, 1]).double(), step_size=1e-4, subsample_size=10, compile_after=0)
    kernel.setup(0, x, y)
    params = kernel.sample(kernel.initial_params)
    assert kernel.backend_used == "compile"
    with pytest.warns(RuntimeWarning, match="compiling the step failed"):
        params = kernel.sample(params)
    assert kernel.backend_used == "fx"
    params = kernel.sample(kernel.sample(params))
    assert kernel.backend_used == "fx" and all(torch.isfinite(v).all() for v in params.values())


def test_closed_form_prior_off_traces_pyro_log_density_and_gives_the_same_step():
    # closed_form_prior=False: the traced graph holds the prior's log-density (more nodes) and its step is the eager
    # step's; with the switch on, the same step up to rounding (temperature 0: tracing draws the noise of one step)
    x, y = _data()
    results, nodes = {}, {}
    for label, backend, closed in (("eager", "eager", True), ("fx", "fx", True), ("fx-off", "fx", False)):
        pyro.set_rng_seed(0)
        kernel = SGLD(BayesianMLP([2, 5, 1]).double(), step_size=1e-3, subsample_size=10, backend=backend,
                      closed_form_prior=closed, map_steps=0, temperature=0.0)
        kernel.setup(0, x, y)
        results[label] = kernel.sample(kernel.initial_params)
        if backend == "fx":
            nodes[label] = len(kernel._graph_module.graph.nodes)
    assert nodes["fx-off"] > nodes["fx"]
    for name in results["eager"]:
        assert torch.equal(results["fx-off"][name], results["eager"][name])
        torch.testing.assert_close(results["fx"][name], results["eager"][name])


def test_every_run_builds_its_potential_and_traces_its_step_afresh():
    x, y = _data()
    kernel = SGLD(BayesianMLP([2, 5, 1]).double(), step_size=1e-4, subsample_size=10, backend="fx", map_steps=0)
    kernel.setup(0, x, y)
    first = kernel.potential
    kernel.sample(kernel.initial_params)
    assert kernel._graph_module is not None
    kernel.setup(0, x, y)
    assert kernel.potential is not first and kernel._graph_module is None


def test_bad_switches():
    with pytest.raises(TypeError, match="closed_form_prior"):
        SGLD(mixed_prior_model, closed_form_prior=1)


def test_compile_asks_for_aten_random_numbers_for_its_graph_only(monkeypatch):
    # the compiled step draws its noise from ATen's generator (same seed, same noise); the setting is an option of
    # that one compilation, not a change to the process-wide Inductor configuration
    import torch._inductor.config as inductor_config

    seen = []

    def recording_compile(graph, **kwargs):
        seen.append(kwargs)
        return graph

    monkeypatch.setattr(torch, "compile", recording_compile)
    before = inductor_config.fallback_random
    x, y = _data()
    kernel = SGLD(BayesianMLP([2, 5, 1]).double(), step_size=1e-4, subsample_size=10, backend="compile", map_steps=0)
    kernel.setup(0, x, y)
    kernel.sample(kernel.initial_params)
    assert seen and all(kw.get("options") == {"fallback_random": True} for kw in seen)
    assert inductor_config.fallback_random == before
