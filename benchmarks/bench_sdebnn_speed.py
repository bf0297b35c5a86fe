# SPDX-License-Identifier: Apache-2.0
"""Speed of one SDE-BNN training step (forward + backward + Adam) vs a hand-written Euler–Maruyama loop.

Timed, interleaved in every repeat (so that load fluctuations hit all of them alike), same net, same
estimator (``stl``), same data, one weight path per step:

- ``plain-torch``: a hand-written Euler–Maruyama loop in plain PyTorch over the augmented state
  ``[w, h, KL]`` (the drift MLP evaluated once with its parameters and once detached for the STL
  term), Gaussian log-likelihood, ``torch.optim.Adam``;
- ``fused-loss``: :meth:`pyro_sdebnn.nn.SDEBNN.fused_loss` (the library's one-pass solve) with
  ``torch.optim.Adam``;
- ``svi-step``: ``pyro.infer.SVI(net.model, NeuralSDEGuide, Adam, TracePathKL_ELBO("stl")).step``
  (Pyro's tracing, param store and the two passes of the model/guide split);
- with ``--torchsde``: ``fused_loss`` through :func:`torchsde.sdeint` (Euler, explicit
  ``BrownianInterval``) and :func:`torchsde.sdeint_adjoint`, with the ``stl`` estimator at the same step
  ``--dt`` as the plain loop, and the adjoint also at its default step ``min(dt, 0.01)``
  (``pyro_sdebnn.ops.sde_solve.ADJOINT_DT``, where its gradient is within about 1 % of backpropagation's).

The project's target: library step <= 1.3x the hand-written loop. Reported: median and interquartile
range over ``--repeats`` of the per-repeat time and ratio. Pyro validation is off while timing.
The machine may be shared: ratios within one run are meaningful, absolute times less so.

Usage::

    python benchmarks/bench_sdebnn_speed.py [--repeats 20] [--inner 5] [--threads 1] [--dt 0.05]
                                            [--device cpu] [--output FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pyro
import torch
from pyro.infer import SVI
from pyro.optim import Adam

from pyro_sdebnn.infer import NeuralSDEGuide, TracePathKL_ELBO
from pyro_sdebnn.nn import SDEBNN


def _quantiles(values):
    q = statistics.quantiles(values, n=4)
    return statistics.median(values), q[0], q[2]


def _plain_step_factory(net, guide, x, y):
    """Hand-written EM training step on the same parameter tensors as the library steps.

    The tensors are shared, not copied (only ``log_scale`` and the Adam state are its own): every timed
    step of every run updates them. This does not bias the timing, since the work of a step does not
    depend on the parameter values.
    """
    drift = guide.drifts["w_path"]
    log_scale = torch.zeros((), dtype=x.dtype, device=x.device, requires_grad=True)
    params = [net.w0, net.head.weight, net.head.bias, log_scale, *drift.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    field, times = net.field, net.times
    sigma, theta = net.sigma, net.theta
    h0 = torch.cat([x, x.new_zeros(x.shape[0], net.augment)], -1)
    steps = times.shape[0] - 1
    dts = (times[1:] - times[:-1]).tolist()
    d = net.num_weights

    def step():
        opt.zero_grad()
        detached = {k: v.detach() for k, v in drift.named_parameters()}
        w, h, kl = net.w0, h0, 0.0
        noise = torch.randn(steps, d, dtype=x.dtype, device=x.device)
        for k in range(steps):
            t, dt = times[k], dts[k]
            c = drift(t, w)
            c_sg = torch.func.functional_call(drift, detached, (t, w))
            db = noise[k] * dt ** 0.5
            kl = kl + 0.5 * (c / sigma).pow(2).sum() * dt + (c_sg / sigma * db).sum()
            h = h + field(t, h, w) * dt
            w = w + (-theta * w + c) * dt + sigma * db
        loc = net.head(h).squeeze(-1)
        loss = -torch.distributions.Normal(loc, log_scale.exp()).log_prob(y).sum() + kl
        loss.backward()
        opt.step()
        return loss

    return step


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--inner", type=int, default=5, help="steps per timed block")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: unchanged)")
    parser.add_argument("--dt", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--n", type=int, default=100, help="data points")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--torchsde", action="store_true",
                        help="also time fused_loss through torchsde (Euler, BrownianInterval) and its adjoint")
    parser.add_argument("--output", type=Path, default=None, help="write the Markdown table here")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    pyro.enable_validation(False)
    pyro.set_rng_seed(0)
    device = torch.device(args.device)
    x = torch.linspace(-2, 2, args.n, device=device).unsqueeze(-1)
    y = torch.sin(2 * x).squeeze(-1)

    net = SDEBNN(1, 1, hidden=args.hidden, augment=2, sigma=0.2, dt=args.dt).to(device)
    guide = NeuralSDEGuide(net, drift_hidden=64)
    guide(x, y)
    svi = SVI(net.model, guide, Adam({"lr": 1e-3}), TracePathKL_ELBO(estimator="stl"))
    fused_opt = torch.optim.Adam(list(net.parameters()) + list(guide.parameters()), lr=1e-3)

    def fused_step():
        fused_opt.zero_grad()
        loss = net.fused_loss(x, y, guide, estimator="stl")
        loss.backward()
        fused_opt.step()

    def torchsde_step(adjoint, dt):
        def step():
            fused_opt.zero_grad()
            loss = net.fused_loss(x, y, guide, estimator="stl", method="euler", adjoint=adjoint, dt=dt)
            loss.backward()
            fused_opt.step()
        return step

    plain_step = _plain_step_factory(net, guide, x, y)
    runs = {"plain-torch": plain_step, "fused-loss": fused_step, "svi-step": lambda: svi.step(x, y)}
    if args.torchsde:
        runs["torchsde-euler"] = torchsde_step(False, args.dt)
        runs[f"torchsde-adjoint, dt {args.dt}"] = torchsde_step(True, args.dt)
        runs["torchsde-adjoint, default dt"] = torchsde_step(True, None)
    for fn in runs.values():  # warm-up
        for _ in range(2):
            fn()
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.inner):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) / args.inner)
    base = times["plain-torch"]
    rows = ["| what | median ms/step (IQR) | ratio to plain-torch: median (IQR) |", "|---|---|---|"]
    summary = {}
    for name, values in times.items():
        med, lo, hi = _quantiles([v * 1e3 for v in values])
        ratios = [v / b for v, b in zip(values, base)]
        rmed, rlo, rhi = _quantiles(ratios)
        rows.append(f"| {name} | {med:.2f} ({lo:.2f}-{hi:.2f}) | {rmed:.2f} ({rlo:.2f}-{rhi:.2f}) |")
        summary[name] = {"ms": med, "ratio": rmed, "ratio_iqr": (rlo, rhi)}
    steps = net.times.shape[0] - 1
    header = (f"SDE-BNN training step, D = {net.num_weights} weights, K = {steps} Euler steps, N = {args.n}, "
              f"device {device}, threads {torch.get_num_threads()}, {args.repeats} repeats x {args.inner} steps")
    table = header + "\n\n" + "\n".join(rows) + "\n"
    print(table)
    if args.output is not None:
        args.output.write_text(table)
    return summary


if __name__ == "__main__":
    main()
