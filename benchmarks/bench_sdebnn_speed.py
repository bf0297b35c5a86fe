# SPDX-License-Identifier: Apache-2.0
"""Speed of one SDE-BNN training step (forward + backward + Adam) vs a hand-written Euler–Maruyama loop.

Two configurations, each at the defaults of its experiment:

- ``toy``: ``pyro-sdebnn benchmark sdebnn-toy`` -- 1-D regression (100 points), time-conditioned MLP field
  of width 64 (swish, 2 augmented dimensions, D = 515 weights), σ = 0.5, dt = 0.01 (K = 100 Euler steps),
  100 weight paths per step (vectorised particles), drift correction a 2 × 64 swish MLP, STL estimator;
- ``mnist``: ``pyro-sdebnn benchmark sdebnn-mnist`` (method ``sdebnn``) -- 28 × 28 MNIST images, batch 128,
  conv field with 16 hidden channels, σ = 0.1, dt = 0.05 (K = 20), one weight path per step, drift
  correction 2-128-2 (bottleneck), analytic KL estimator with KL coefficient 1e-3, categorical likelihood
  scaled by N / b.

Timed, interleaved in every repeat (so that load fluctuations hit all of them alike):

- ``plain-torch``: a hand-written Euler–Maruyama loop in plain PyTorch over ``[w, h, KL]`` (the drift MLP
  evaluated once with its parameters and, for STL, once with them detached), the field written out with
  ``bmm`` / grouped convolutions, ``torch.optim.Adam`` on its own copies of the parameters;
- ``svi-step``: ``pyro.infer.SVI(net.model, NeuralSDEGuide, Adam, TracePathKL_ELBO).step`` as the
  experiment runs it (Pyro's tracing, param store and the two passes of the model/guide split);
- ``fused-loss``: :meth:`pyro_sdebnn.nn.SDEBNN.fused_loss` (one-pass solve) with ``torch.optim.Adam``;
- with ``--torchsde``, ``torchsde-adjoint``: ``fused_loss(adjoint=True)``, the stochastic adjoint of
  :func:`torchsde.sdeint_adjoint` at its default step ``min(dt, 0.01)``.

Before timing, the plain loop's loss and gradients are checked against ``TracePathKL_ELBO``'s on the same
Brownian increments (relative differences printed). Reported per configuration: median and min-max over
``--repeats`` of the per-repeat ratio to the plain loop, in wall time and in process CPU time (steadier on a
loaded machine). The project's target: SVI step ≤ 1.15× the plain
loop. Pyro's validation stays as in a user's session (on) unless ``--no-validation``. The machine may be
shared: ratios within one run are meaningful, absolute times less so.

Usage::

    python benchmarks/bench_sdebnn_speed.py [--configs toy,mnist] [--repeats 7] [--threads 1] [--torchsde]
                                            [--device cpu] [--output FILE]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import pyro
import torch
import torch.nn.functional as F
from pyro.infer import SVI
from pyro.optim import Adam

from pyro_sdebnn.data import mnist_subset, toy_regression_1d
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer import NeuralSDEGuide, TracePathKL_ELBO
from pyro_sdebnn.nn import SDEBNN


def toy_config():
    """The sdebnn-toy experiment's defaults."""
    data = toy_regression_1d(n_train=100, n_test=200, seed=0)
    net = SDEBNN(1, 1, hidden=64, augment=2, sigma=0.5, dt=0.01, activation="swish")
    guide = NeuralSDEGuide(net, drift_hidden=64, drift_layers=2, activation="swish")
    elbo = TracePathKL_ELBO(num_particles=100, vectorize_particles=True, max_plate_nesting=1, estimator="stl")
    return dict(x=data.x_train, y=data.y_train, net=net, guide=guide, elbo=elbo, particles=100, estimator="stl",
                kl_scale=1.0, num_data=None)


def mnist_config(batch: int = 128):
    """The sdebnn-mnist experiment's defaults (method ``sdebnn``), one fixed minibatch of the bundled subset."""
    split = mnist_subset(seed=0)
    net = SDEBNN((1, 28, 28), 10, hidden=16, augment=0, sigma=0.1, dt=0.05, likelihood="categorical")
    guide = NeuralSDEGuide(net, drift_hidden=128, drift_layers=1, bottleneck=2)
    elbo = TracePathKL_ELBO(estimator="analytic", kl_scale=1e-3)
    return dict(x=split.x_train[:batch], y=split.y_train[:batch], net=net, guide=guide, elbo=elbo, particles=1,
                estimator="analytic", kl_scale=1e-3, num_data=split.x_train.shape[0])


class PlainStep:
    """Hand-written Euler–Maruyama SDE-BNN step on its own copies of the network's initial parameters.

    Per Euler step k (S weight paths at once, ``w (S, D)``, ``h (S, N, ...)``)::

        c = drift(t_k, w);  KL += |c / sigma|^2 dt / 2  [+ (c_sg / sigma) . dB_k  for STL]
        h += f_h(h, t_k; w) dt;  w += (-theta w + c) dt + sigma dB_k

    then ``loss = mean_s(-N/b * loglik_s + kl_scale * KL_s)``.
    """

    def __init__(self, net, guide, x, y, particles, estimator, kl_scale, num_data):
        self.x, self.y, self.S, self.estimator, self.kl_scale = x, y, particles, estimator, kl_scale
        self.scale = 1.0 if num_data is None else num_data / x.shape[0]
        self.w0 = net.w0.detach().clone().requires_grad_()
        self.head = copy.deepcopy(net.head)
        self.drift = copy.deepcopy(guide.drifts["w_path"])
        self.categorical = net.likelihood == "categorical"
        params = [self.w0, *self.head.parameters(), *self.drift.parameters()]
        if not self.categorical:
            self.log_scale = net.obs_scale.detach().log().clone().requires_grad_()
            params.append(self.log_scale)
        self.opt = torch.optim.Adam(params, lr=1e-3)
        self.times = net.times
        self.dts = (self.times[1:] - self.times[:-1]).tolist()
        self.sigma, self.theta, self.D = net.sigma, net.theta, net.num_weights
        f = net.field
        self.sizes = f._sizes
        self.conv = x.dim() == 4
        if self.conv:
            self.c, self.m, self.k = f.channels, f.hidden_channels, f.kernel_size
            self.h0 = x.expand(particles, *x.shape)  # no augmentation at the MNIST defaults
        else:
            self.d, self.m = f.state_dim, f.hidden
            self.act = F.silu
            h0 = torch.cat([x, x.new_zeros(x.shape[0], net.augment)], -1)
            self.h0 = h0.expand(particles, *h0.shape)

    def field(self, t, h, w):
        S = w.shape[0]
        w1, b1, w2, b2 = torch.split(w, self.sizes, -1)
        if not self.conv:
            d, m = self.d, self.m
            z = self.act(torch.bmm(torch.cat([h, t.expand(h.shape[:-1] + (1,))], -1), w1.view(S, d + 1, m))
                         + b1.unsqueeze(1))
            return torch.bmm(z, w2.view(S, m, d)) + b2.unsqueeze(1)
        c, m, k = self.c, self.m, self.k
        N, hw = h.shape[1], h.shape[3:]
        inp = torch.cat([h, t.expand(h.shape[:2] + (1,) + hw)], 2).transpose(0, 1).reshape(N, S * (c + 1), *hw)
        z = torch.tanh(F.conv2d(inp, w1.reshape(S * m, c + 1, k, k), b1.reshape(-1), stride=2, padding=k // 2,
                                groups=S))
        out = F.conv_transpose2d(z, w2.reshape(S * m, c, k, k), b2.reshape(-1), stride=2, padding=k // 2,
                                 output_padding=1, groups=S)
        return out.reshape(N, S, c, *hw).transpose(0, 1)

    def loss(self, noise=None):
        S, K, D = self.S, len(self.dts), self.D
        if noise is None:
            # as many normals, in the order the guide draws them
            noise = torch.randn(S, K, D, dtype=self.x.dtype, device=self.x.device)
        noise = noise.reshape(S, K, D)
        detached = {name: p.detach() for name, p in self.drift.named_parameters()}
        w, h = self.w0.expand(S, D), self.h0
        kl = self.x.new_zeros(S)
        for k, dt in enumerate(self.dts):
            t = self.times[k]
            db = noise[:, k] * dt ** 0.5
            c = self.drift(t, w)
            kl = kl + 0.5 * (c / self.sigma).pow(2).sum(-1) * dt
            if self.estimator == "stl":
                c_sg = torch.func.functional_call(self.drift, detached, (t, w))
                kl = kl + (c_sg / self.sigma * db).sum(-1)
            h = h + self.field(t, h, w) * dt
            w = w + (-self.theta * w + c) * dt + self.sigma * db
        if self.conv:
            logits = self.head(h.flatten(-3))
            loglik = -F.cross_entropy(logits.flatten(0, 1), self.y.repeat(S), reduction="none").view(S, -1).sum(-1)
        else:
            loc = self.head(h).squeeze(-1)
            loglik = torch.distributions.Normal(loc, self.log_scale.exp(), validate_args=False).log_prob(self.y).sum(-1)
        return (self.kl_scale * kl - self.scale * loglik).mean()

    def step(self):
        self.opt.zero_grad()
        loss = self.loss()
        loss.backward()
        self.opt.step()
        return loss.detach()


def check_against_plain(cfg, plain):
    """Relative differences of loss and gradients (w0, drift net) between SVI's loss and the plain loop's."""
    net, guide, elbo = cfg["net"], cfg["guide"], cfg["elbo"]
    with torch.no_grad():  # a non-zero drift, so that the KL is not trivially 0
        for p in guide.drifts["w_path"].parameters():
            p.normal_(0, 0.01, generator=torch.Generator(device=p.device).manual_seed(1))
    plain.drift = copy.deepcopy(guide.drifts["w_path"])
    kwargs = {} if cfg["num_data"] is None else {"num_data": cfg["num_data"]}
    torch.manual_seed(123)
    ours = elbo.differentiable_loss(net.model, guide, cfg["x"], cfg["y"], **kwargs)
    torch.manual_seed(123)
    theirs = plain.loss(torch.randn(cfg["particles"], len(plain.dts), plain.D, device=cfg["x"].device))
    g1 = torch.autograd.grad(ours, [net.w0, *guide.drifts["w_path"].parameters()])
    g2 = torch.autograd.grad(theirs, [plain.w0, *plain.drift.parameters()])
    grad = max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(g1, g2))
    return abs(float((ours - theirs).detach())) / abs(float(theirs.detach())), grad


def run_config(name, build, args):
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    cfg = build()
    cfg["net"].to(args.device)
    cfg["x"], cfg["y"] = cfg["x"].to(args.device), cfg["y"].to(args.device)
    net, guide, x, y = cfg["net"], cfg["guide"], cfg["x"], cfg["y"]
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    kwargs = {} if cfg["num_data"] is None else {"num_data": cfg["num_data"]}
    guide(x, y, **kwargs)  # builds the drift net
    plain = PlainStep(net, guide, x, y, cfg["particles"], cfg["estimator"], cfg["kl_scale"], cfg["num_data"])
    loss_rel, grad_rel = check_against_plain(cfg, plain)
    svi = SVI(net.model, guide, Adam({"lr": 1e-3}), cfg["elbo"])
    fused_opt = torch.optim.Adam(list(net.parameters()) + list(guide.parameters()), lr=1e-3)

    def fused_step():
        fused_opt.zero_grad()
        loss = net.fused_loss(x, y, guide, num_samples=cfg["particles"], estimator=cfg["estimator"],
                              kl_scale=cfg["kl_scale"], **kwargs)
        loss.backward()
        fused_opt.step()

    runs = {"plain-torch": plain.step, "svi-step": lambda: svi.step(x, y, **kwargs), "fused-loss": fused_step}
    if args.torchsde:
        def adjoint_step():
            fused_opt.zero_grad()
            loss = net.fused_loss(x, y, guide, num_samples=cfg["particles"], estimator=cfg["estimator"],
                                  kl_scale=cfg["kl_scale"], adjoint=True, **kwargs)
            loss.backward()
            fused_opt.step()
        runs["torchsde-adjoint"] = adjoint_step
    for fn in runs.values():  # warm-up
        fn()
    times, cpu = {k: [] for k in runs}, {k: [] for k in runs}
    for r in range(args.repeats):
        order = list(runs) if r % 2 == 0 else list(reversed(list(runs)))
        for key in order:
            sync()
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(args.inner):
                runs[key]()
            sync()
            times[key].append((time.perf_counter() - start) / args.inner)
            cpu[key].append((time.process_time() - start_cpu) / args.inner)
    rows = []
    for key, values in times.items():
        ratios = [v / b for v, b in zip(values, times["plain-torch"])]
        cpu_ratios = [v / b for v, b in zip(cpu[key], cpu["plain-torch"])]
        rows.append(f"| {name} | {key} | {statistics.median(values) * 1e3:.1f} ({min(values) * 1e3:.1f}-"
                    f"{max(values) * 1e3:.1f}) | {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) "
                    f"| {statistics.median(cpu_ratios):.3f} ({min(cpu_ratios):.3f}-{max(cpu_ratios):.3f}) |")
    steps = net.times.shape[0] - 1
    header = (f"{name}: D = {net.num_weights} weights, K = {steps} Euler steps, {cfg['particles']} paths, "
              f"batch {x.shape[0]}, estimator {cfg['estimator']}; check vs plain loop on the same Brownian "
              f"increments: loss rel. diff {loss_rel:.1e}, gradient rel. diff {grad_rel:.1e}")
    return header, rows


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="toy,mnist", help="comma-separated: toy, mnist")
    parser.add_argument("--repeats", type=check.positive_int, default=7)
    parser.add_argument("--inner", type=check.positive_int, default=1, help="steps per timed block")
    parser.add_argument("--threads", type=check.positive_int, default=1, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu", help="where the networks and data live (e.g. cuda)")
    parser.add_argument("--no-validation", action="store_true", help="pyro.enable_validation(False) while timing")
    parser.add_argument("--torchsde", action="store_true",
                        help="also time fused_loss(adjoint=True): torchsde.sdeint_adjoint at dt = min(dt, 0.01)")
    parser.add_argument("--output", type=Path, default=None, help="write the Markdown table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pyro.enable_validation(not args.no_validation)
    builders = {"toy": toy_config, "mnist": mnist_config}
    lines = ["| config | what | median ms/step (min-max) | ratio to plain-torch: median (min-max) | "
             "process CPU-time ratio: median (min-max) |", "|---|---|---|---|---|"]
    headers = []
    for name in args.configs.split(","):
        header, rows = run_config(name, builders[name], args)
        headers.append(header)
        lines += rows
        print(header, flush=True)
        print("\n".join(rows), flush=True)
    table = (f"SDE-BNN training step, threads {torch.get_num_threads()}, {args.repeats} repeats x {args.inner} "
             f"steps, validation {'off' if args.no_validation else 'on'}\n\n" + "\n".join(headers) + "\n\n"
             + "\n".join(lines) + "\n")
    print(table)
    if args.output is not None:
        args.output.write_text(table)
    return table


if __name__ == "__main__":
    main()
