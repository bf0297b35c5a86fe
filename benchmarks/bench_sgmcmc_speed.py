# SPDX-License-Identifier: Apache-2.0
"""Speed of the SG-MCMC kernels' hot loop against the fastest plain-PyTorch SGLD loop, measured in one run.

For each network (2-50-50-1 at batch 32, binary labels; 784-400-400-10 at batch 128, 10 classes) this times one
SGLD inner step (minibatch gradient of ``(N/b) NLL + ||w||^2 / 2`` plus the Langevin update) of

- ``plain-module``: an ``nn.Sequential`` loop with autograd and ``torch._foreach`` updates;
- ``plain-compiled``: a ``torch.func.functional_call`` gradient step compiled with ``torch.compile``
  (``fallback_random=True``);
- ``SGLD[fx]`` / ``SGLD[compile]``: ``pyro_sdebnn.infer.mcmc.SGLD`` on the equivalent Pyro model
  (:class:`~pyro_sdebnn.infer.mcmc.BayesianMLP`), timing ``kernel.sample`` with ``num_steps`` inner steps
  (the MCMC runner's per-returned-sample storage is excluded and reported separately);
- ``SGLD[PyroSample]`` / ``SGLD[expand]`` / ``SGLD[zeros]``: ``SGLD`` with its default settings (``backend``
  left out) on the same network written three ways, as users write Pyro models: ``BayesianMLP`` (``PyroSample``
  priors), and a hand-written model whose weight priors are ``dist.Normal(0., 1.).expand([m, n]).to_event(2)``
  or ``dist.Normal(torch.zeros(m, n), 1.).to_event(2)`` (the data plate written as in ``SGLD``'s docstring).

The ratio is ours / fastest plain loop; the median and the spread (min-max) over ``--repeats`` repeats are
reported, in wall time and in process CPU time. Within a repeat the loops take turns in up to 20 rounds of about a
twentieth of the repeat's steps each, so that a change in the load of a shared machine falls on all of them alike.
The machine may be shared: ratios in one run are meaningful, absolute times less so.

Usage::

    python benchmarks/bench_sgmcmc_speed.py [--quick] [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import torch
from pyro.infer import MCMC
from torch import nn

from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer.mcmc import BayesianMLP, SGLD


def _data(sizes, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, sizes[0], generator=g)
    if sizes[-1] == 1:
        y = (x[:, 0] > 0).float()
    else:
        y = torch.randint(sizes[-1], (n,), generator=g)
    return x, y


def _plain_net(sizes):
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def _nll(out, y):
    if out.shape[-1] == 1:
        return nn.functional.binary_cross_entropy_with_logits(out.squeeze(-1), y, reduction="sum")
    return nn.functional.cross_entropy(out, y, reduction="sum")


def plain_module_stepper(sizes, x, y, batch, eta):
    net = _plain_net(sizes)
    params = list(net.parameters())
    n = x.shape[0]
    scale = n / batch

    def step():
        idx = torch.randint(n, (batch,))
        loss = scale * _nll(net(x[idx]), y[idx]) + 0.5 * sum((p * p).sum() for p in params)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            torch._foreach_add_(params, grads, alpha=-0.5 * eta)
            noise = [torch.randn_like(p) for p in params]
            torch._foreach_add_(params, noise, alpha=eta**0.5)

    return step


def plain_compiled_stepper(sizes, x, y, batch, eta):
    net = _plain_net(sizes)
    params = {k: v.detach() for k, v in net.named_parameters()}
    n = x.shape[0]
    scale = n / batch

    def loss_fn(p, xb, yb):
        out = torch.func.functional_call(net, p, (xb,))
        return scale * _nll(out, yb) + 0.5 * sum((v * v).sum() for v in p.values())

    @torch.compile(options={"fallback_random": True})
    def update(p, xb, yb):
        g = torch.func.grad(loss_fn)(p, xb, yb)
        return {k: p[k] - 0.5 * eta * g[k] + eta**0.5 * torch.randn_like(p[k]) for k in p}

    state = {"p": params}

    def step():
        idx = torch.randint(n, (batch,))
        state["p"] = update(state["p"], x[idx], y[idx])

    return step


def sgld_stepper(sizes, x, y, batch, eta, backend, num_steps):
    likelihood = "bernoulli" if sizes[-1] == 1 else "categorical"
    model = BayesianMLP(sizes, likelihood=likelihood, activation="tanh")
    kernel = SGLD(model, step_size=eta, num_steps=num_steps, subsample_size=batch, backend=backend)
    with pyro.validation_enabled(False):
        kernel.setup(0, x, y)
    state = {"params": kernel.initial_params}

    def step():  # num_steps inner steps
        state["params"] = kernel.sample(state["params"])

    return step, kernel


def handwritten_model(sizes, spelling):
    """The network of ``BayesianMLP(sizes, activation="tanh")`` as a plain Pyro model, with N(0, 1) weight priors
    spelled ``Normal(0., 1.).expand(shape)`` (``"expand"``) or ``Normal(torch.zeros(shape), 1.)`` (``"zeros"``)."""
    import pyro.distributions as dist

    def prior(shape):
        if spelling == "expand":
            return dist.Normal(0.0, 1.0).expand(shape).to_event(len(shape))
        return dist.Normal(torch.zeros(shape), 1.0).to_event(len(shape))

    def model(x, y=None):
        params = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            params.append((pyro.sample(f"w{i}", prior([fan_out, fan_in])), pyro.sample(f"b{i}", prior([fan_out]))))
        with pyro.plate("data", x.shape[0]) as idx:
            h = x[idx]
            for i, (w, b) in enumerate(params):
                h = h @ w.transpose(-1, -2) + b
                if i < len(params) - 1:
                    h = torch.tanh(h)
            obs = None if y is None else y[idx]
            if sizes[-1] == 1:
                return pyro.sample("obs", dist.Bernoulli(logits=h.squeeze(-1)), obs=obs)
            return pyro.sample("obs", dist.Categorical(logits=h), obs=obs)

    return model


def default_sgld_stepper(model, x, y, batch, eta, num_steps):
    """``SGLD`` with its default settings (backend, warm start) on ``model``."""
    kernel = SGLD(model, step_size=eta, num_steps=num_steps, subsample_size=batch)
    with pyro.validation_enabled(False):
        kernel.setup(0, x, y)
    state = {"params": kernel.initial_params}

    def step():
        state["params"] = kernel.sample(state["params"])

    return step


def _time(step, n):
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n


def _wall_and_cpu(step, n):
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        step()
    return time.perf_counter() - t0, time.process_time() - c0


def runner_overhead(sizes, x, y, batch, eta, num_samples):
    """Seconds per returned sample that Pyro's MCMC runner adds (storage), measured with num_steps=1 vs kernel."""
    likelihood = "bernoulli" if sizes[-1] == 1 else "categorical"
    model = BayesianMLP(sizes, likelihood=likelihood, activation="tanh")
    # no warm start: the MAP fit in setup is not a per-sample cost
    kernel = SGLD(model, step_size=eta, num_steps=1, subsample_size=batch, backend="fx", map_steps=0)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=0, disable_progbar=True)
    mcmc.run(x, y)  # traces the graph once
    kernel._initial_params = None
    t0 = time.perf_counter()
    mcmc.run(x, y)
    per_sample = (time.perf_counter() - t0) / num_samples
    step, _ = sgld_stepper(sizes, x, y, batch, eta, "fx", 1)
    return per_sample - _time(step, num_samples)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=check.positive_int, default=1)
    parser.add_argument("--repeats", type=check.positive_int, default=5)
    parser.add_argument("--num-steps", type=check.positive_int, default=10, help="inner steps per kernel.sample call")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pyro.set_rng_seed(0)
    configs = [("2-50-50-1", [2, 50, 50, 1], 32, 1000, 2000), ("784-400-400-10", [784, 400, 400, 10], 128, 5000, 40)]
    if args.quick:
        configs = [(name, s, b, n, max(steps // 10, 4)) for name, s, b, n, steps in configs]
    rows = []
    for name, sizes, batch, n, steps in configs:
        x, y = _data(sizes, n)
        eta = 1e-4
        steppers = {
            "plain-module": (plain_module_stepper(sizes, x, y, batch, eta), 1),
            "plain-compiled": (plain_compiled_stepper(sizes, x, y, batch, eta), 1),
        }
        for backend in ("fx", "compile"):
            step, kernel = sgld_stepper(sizes, x, y, batch, eta, backend, args.num_steps)
            steppers[f"SGLD[{backend}]"] = (step, args.num_steps)
        likelihood = "bernoulli" if sizes[-1] == 1 else "categorical"
        spellings = {"PyroSample": BayesianMLP(sizes, likelihood=likelihood, activation="tanh"),
                     "expand": handwritten_model(sizes, "expand"), "zeros": handwritten_model(sizes, "zeros")}
        for spelling, model in spellings.items():
            steppers[f"SGLD[{spelling}]"] = (default_sgld_stepper(model, x, y, batch, eta, args.num_steps),
                                             args.num_steps)
        for step, inner in steppers.values():  # warm up: compilation, and the auto backend's 100 eager inner steps
            for _ in range(3 + -(-100 // inner)):
                step()
        times = {k: [] for k in steppers}
        cpu = {k: [] for k in steppers}
        rounds = max(1, min(20, steps // args.num_steps))  # the loops take turns in short rounds
        for _ in range(args.repeats):
            wall_total, cpu_total, count = dict.fromkeys(steppers, 0.0), dict.fromkeys(steppers, 0.0), {}
            for _ in range(rounds):
                for k, (step, inner) in steppers.items():
                    calls = max(steps // rounds // inner, 1)
                    wall, used = _wall_and_cpu(step, calls)
                    wall_total[k] += wall
                    cpu_total[k] += used
                    count[k] = count.get(k, 0) + calls * inner
            for k in steppers:
                times[k].append(wall_total[k] / count[k])
                cpu[k].append(cpu_total[k] / count[k])
        plain = [min(a, b) for a, b in zip(times["plain-module"], times["plain-compiled"])]
        plain_cpu = [min(a, b) for a, b in zip(cpu["plain-module"], cpu["plain-compiled"])]
        fastest = "plain-module" if statistics.median(times["plain-module"]) <= statistics.median(
            times["plain-compiled"]) else "plain-compiled"
        for k, ts in times.items():
            ratios = [t / p for t, p in zip(ts, plain)]
            cpu_ratio = statistics.median([c / p for c, p in zip(cpu[k], plain_cpu)])
            rows.append((name, k, 1e3 * statistics.median(ts), statistics.median(ratios), min(ratios), max(ratios),
                         cpu_ratio))
        overhead = runner_overhead(sizes, x, y, batch, eta, 20 if args.quick else 100)
        print(f"{name}: fastest plain loop = {fastest}; MCMC runner adds {1e3 * overhead:.2f} ms per returned sample")
    print("\n| network | loop | ms/step (median) | ratio vs fastest plain (median) | ratio min-max | CPU-time ratio |")
    print("|---|---|---|---|---|---|")
    for name, k, ms, med, lo, hi, cpu_ratio in rows:
        print(f"| {name} | {k} | {ms:.3f} | {med:.2f} | {lo:.2f}-{hi:.2f} | {cpu_ratio:.2f} |")


if __name__ == "__main__":
    main()
