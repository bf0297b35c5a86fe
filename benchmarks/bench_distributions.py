# SPDX-License-Identifier: Apache-2.0
"""Speed of the distribution hot paths vs their plain-PyTorch equivalents, measured in the same run.

Usage: ``python benchmarks/bench_distributions.py [--repeats 30] [--threads 1]``. Prints Markdown rows: median
time of ours and of the baseline, and the ratio (median and [10%, 90%] quantiles over repeats). Absolute times
depend on the machine's load; the ratios (ours and baseline timed alternately in every repeat) are the
meaningful figures. Argument validation is switched off for both sides.

1. fSGLD prior gradient: ``GPFunctionalPrior.score(f)`` (cached float64 Cholesky, one solve) vs the plain route
   ``autograd(MultivariateNormal(m, K + delta I).log_prob(f))`` that refactorises every step.
2. ``OUPath.log_prob`` vs the same sum written with ``torch.distributions.Normal`` on the residuals.
3. ``MultiplicativeNormal.rsample`` + registered KL vs ``Normal(loc, sqrt(alpha)|loc|)`` rsample + Normal KL.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro.contrib.gp as gp
import torch
from torch.distributions import Normal, kl_divergence

from pyro_sdebnn.distributions import GPFunctionalPrior, MultiplicativeNormal, OUPath
from pyro_sdebnn.experiments import _arg_types as check


def _time_pair(ours, base, repeats: int, inner: int = 20) -> tuple[list[float], list[float]]:
    """Interleaved timing (ours, then baseline, in every repeat) so load drift hits both alike."""
    ours(), base()  # warm-up
    out: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, acc in ((ours, out[0]), (base, out[1])):
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            acc.append((time.perf_counter() - start) / inner)
    return out


def _row(name: str, timings: tuple[list[float], list[float]]) -> str:
    ours, base = timings
    ratios = sorted(o / b for o, b in zip(ours, base))
    q = lambda p: ratios[min(len(ratios) - 1, int(p * len(ratios)))]  # noqa: E731
    return (
        f"| {name} | {statistics.median(ours) * 1e6:.1f} us | {statistics.median(base) * 1e6:.1f} us | "
        f"{statistics.median(ratios):.3f} [{q(0.1):.3f}, {q(0.9):.3f}] |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=check.positive_int, default=30)
    parser.add_argument("--threads", type=check.positive_int, default=1,
                        help="torch intra-op threads (1: robust on a loaded box)")
    args = parser.parse_args()
    torch.manual_seed(0)
    # argument validation off for ours and the baselines alike (it is a debugging aid, not the hot path)
    torch.distributions.Distribution.set_default_validate_args(False)
    torch.set_num_threads(args.threads)
    rows = ["| case | ours (median) | plain PyTorch (median) | ratio ours/plain, median [10%, 90%] |"]
    rows.append("|---|---|---|---|")

    for m, c in [(100, 1), (400, 10)]:
        x = torch.randn(m, 2)
        kernel = gp.kernels.RBF(2)
        prior = GPFunctionalPrior(kernel, x, num_outputs=c)
        f = prior.sample()
        cov = kernel(x).detach() + prior.delta.float() * torch.eye(m)
        loc = prior.loc

        def plain():
            g = f.clone().requires_grad_(True)
            lp = torch.distributions.MultivariateNormal(loc.T if c > 1 else loc, cov).log_prob(g.T if c > 1 else g)
            return torch.autograd.grad(lp.sum(), g)[0]

        torch.testing.assert_close(prior.score(f), plain(), rtol=2e-2, atol=2e-2 * plain().abs().max().item())
        rows.append(_row(f"GP score, M={m}, C={c}", _time_pair(lambda: prior.score(f), plain, args.repeats)))

    times = torch.linspace(0, 1, 41)
    init = torch.randn(256, 50)
    path_dist = OUPath(init, 0.5, times, method="euler")
    path = path_dist.sample()

    def plain_ou():
        dt = times[1:] - times[:-1]
        prev = torch.cat([init.unsqueeze(-2), path[..., :-1, :]], -2)
        return Normal(prev * (1 - dt[:, None]), 0.5 * dt.sqrt()[:, None]).log_prob(path).sum((-2, -1))

    torch.testing.assert_close(path_dist.log_prob(path), plain_ou(), rtol=1e-4, atol=1e-3)
    def ours_ou():
        return OUPath(init, 0.5, times, method="euler").log_prob(path)

    rows.append(_row("OUPath(...).log_prob, batch 256, K=40, D=50", _time_pair(ours_ou, plain_ou, args.repeats)))

    loc, alpha = torch.randn(500, 300), torch.full((300,), 0.02)
    prior = Normal(0.0, 1.0)

    def ours_mn():
        q = MultiplicativeNormal(loc, alpha)
        return q.rsample(), kl_divergence(q, prior).sum()

    def plain_mn():
        q = Normal(loc, alpha.sqrt() * loc.abs())
        return q.rsample(), kl_divergence(q, prior).sum()

    rows.append(_row("MultiplicativeNormal(...) rsample + KL, 500x300", _time_pair(ours_mn, plain_mn, args.repeats)))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
