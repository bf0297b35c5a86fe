# SPDX-License-Identifier: Apache-2.0
"""A whole SG-MCMC run with every default, as a user runs it, against a hand-written loop of as many gradient steps.

The model is written as Pyro's Bayesian-regression tutorial writes one: ``PyroModule[nn.Linear]`` layers of a
2-50-50-1 tanh network with ``PyroSample`` ``Normal(0, 1)`` priors, a Gaussian likelihood of scale 0.5 in
``pyro.plate("data", N)``, N = 1,000 points. Ours: ``MCMC(Kernel(model), warmup_steps=W, num_samples=S).run(x, y)``
with every kernel default (``num_steps=1``: one gradient step per returned sample; the MAP warm start, the
windowed mass-matrix adaptation and the curvature estimate that caps the step; ``backend="auto"``; the divergence
check and the end-of-run checks), Pyro's validation and progress bar off, the construction of the kernel included.
The plain loop takes ``W + S`` full-data SGLD (or SGHMC, friction 0.1) steps of a fixed step size on an
``nn.Sequential`` of the same shape and stores the last ``S`` positions. The two are interleaved in every repeat
and the ratio of each repeat's times is reported (median, min-max), with ours' set-up (the time to its first
sample: the kernel's ``setup``, the potential and the warm start) and its time per step after it. ``--batch B``
feeds both a shuffled ``DataLoader`` of batch ``B`` instead of the full tensors. ``--chains C`` runs
``MCMC(..., num_chains=C)`` (one chain after another where the machine has at most ``C`` cores, as on a 2-core
machine) against ``C`` plain loops.

Usage::

    python benchmarks/bench_sgmcmc_defaults.py [--kernel SGLD|SGHMC] [--warmup 200] [--samples 200] [--batch 0]
        [--chains 1] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC
from pyro.nn import PyroModule, PyroSample
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer.mcmc import SGHMC, SGLD


class TutorialBNN(PyroModule):
    """2-50-50-1 tanh network with ``PyroSample`` ``Normal(0, 1)`` weight priors, as Pyro's tutorials write one."""

    def __init__(self, width: int = 50) -> None:
        super().__init__()
        self.l1 = PyroModule[nn.Linear](2, width)
        self.l2 = PyroModule[nn.Linear](width, width)
        self.l3 = PyroModule[nn.Linear](width, 1)
        for layer in (self.l1, self.l2, self.l3):
            layer.weight = PyroSample(dist.Normal(0.0, 1.0).expand(list(layer.weight.shape)).to_event(2))
            layer.bias = PyroSample(dist.Normal(0.0, 1.0).expand(list(layer.bias.shape)).to_event(1))

    def forward(self, x, y=None):
        mu = self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x))))).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mu, 0.5), obs=y)
        return mu


def ours(kernel_name: str, data, warmup: int, samples: int, chains: int = 1) -> tuple[float, float]:
    """Seconds of the whole run and up to its first sample (the kernel, its ``setup``: the potential and the warm
    start, and one step), read by ``MCMC``'s ``hook_fn``."""
    start = time.perf_counter()
    pyro.clear_param_store()
    kernel = {"SGLD": SGLD, "SGHMC": SGHMC}[kernel_name](TutorialBNN())
    first: list[float] = []

    def hook(kernel, params, stage, i):
        if not first:
            first.append(time.perf_counter() - start)

    with pyro.validation_enabled(False):
        MCMC(kernel, warmup_steps=warmup, num_samples=samples, num_chains=chains, disable_progbar=True,
             hook_fn=hook).run(*data)
    return time.perf_counter() - start, first[0]


def plain(kernel_name: str, data, steps: int, kept: int, eta: float = 1e-4) -> float:
    """Seconds of ``steps`` hand-written SGLD / SGHMC steps on the same potential, keeping the last ``kept``."""
    start = time.perf_counter()
    net = nn.Sequential(nn.Linear(2, 50), nn.Tanh(), nn.Linear(50, 50), nn.Tanh(), nn.Linear(50, 1))
    params = list(net.parameters())
    momenta = [torch.zeros_like(p) for p in params]
    loader = data[0] if isinstance(data[0], DataLoader) else None
    n = len(loader.dataset) if loader is not None else data[0].shape[0]  # type: ignore[arg-type]
    batches = iter(())
    samples = []
    for t in range(steps):
        if loader is None:
            x, y = data
        else:
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
        out = net(x).squeeze(-1)
        potential = (n / x.shape[0]) * ((out - y) ** 2).sum() / (2 * 0.25) + sum((p ** 2).sum() for p in params) / 2
        grads = torch.autograd.grad(potential, params)
        with torch.no_grad():
            for p, g, m in zip(params, grads, momenta):
                if kernel_name == "SGLD":
                    p.add_(g, alpha=-eta).add_(torch.randn_like(p), alpha=(2 * eta) ** 0.5)
                else:
                    m.mul_(0.9).add_(g, alpha=-eta).add_(torch.randn_like(p), alpha=(0.2 * eta) ** 0.5)
                    p.add_(m)
            if t >= steps - kept:
                samples.append(torch.cat([p.flatten() for p in params]))
    torch.stack(samples)
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=["SGLD", "SGHMC"], default="SGLD")
    parser.add_argument("--warmup", type=check.nonnegative_int, default=200)
    parser.add_argument("--samples", type=check.positive_int, default=200)
    parser.add_argument("--batch", type=check.nonnegative_int, default=0,
                        help="0: the full tensors; B: a shuffled loader of batch B")
    parser.add_argument("--chains", type=check.positive_int, default=1, help="MCMC's num_chains (C plain loops)")
    parser.add_argument("--repeats", type=check.positive_int, default=5)
    parser.add_argument("--threads", type=check.positive_int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(1000, 2)
    y = torch.sin(x[:, 0]) + 0.1 * torch.randn(1000)
    data = (x, y) if args.batch == 0 else (DataLoader(TensorDataset(x, y), batch_size=args.batch, shuffle=True),)
    ratios, setups, per_sample, totals = [], [], [], []
    for _ in range(args.repeats):
        total, setup = ours(args.kernel, data, args.warmup, args.samples, args.chains)
        base = sum(plain(args.kernel, data, args.warmup + args.samples, args.samples) for _ in range(args.chains))
        ratios.append(total / base)
        totals.append(total)
        setups.append(setup)
        per_sample.append((total - setup) / (args.chains * (args.warmup + args.samples)))
        print(f"ours {total:.2f} s (first sample after {setup:.2f} s), plain {base:.2f} s, "
              f"ratio {total / base:.3f}", flush=True)
    out = {"kernel": args.kernel, "batch": args.batch, "chains": args.chains, "ours_s_median": statistics.median(totals),
           "ratio_median": statistics.median(ratios),
           "ratio_min": min(ratios), "ratio_max": max(ratios), "setup_s_median": statistics.median(setups),
           "ours_ms_per_step_after_setup": 1e3 * statistics.median(per_sample)}
    print(out)
    return out


if __name__ == "__main__":
    main()
