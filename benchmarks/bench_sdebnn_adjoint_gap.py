# SPDX-License-Identifier: Apache-2.0
"""How far the stochastic adjoint's gradient is from backprop's, as a function of the step size.

torchsde's stochastic adjoint (Li, Wong, Chen and Duvenaud, 2020, "Scalable Gradients for Stochastic Differential
Equations", AISTATS) integrates a backward SDE with the same Brownian path. Its gradient is not the exact gradient
of the discretised forward solve: the two differ by :math:`O(\\Delta t)`. This script measures the relative gap
:math:`\\|g_{\\mathrm{adjoint}} - g_{\\mathrm{backprop}}\\| / \\|g_{\\mathrm{backprop}}\\|` of the gradient of
:meth:`~pyro_sdebnn.nn.SDEBNN.fused_loss` with respect to the network's initial weights and the guide's drift
parameters, on a small float64 SDE-BNN (1-d regression, 8 points), for several step sizes and seeds. Backprop is
through torchsde's Milstein solve, which equals Euler for the SDE-BNN's additive noise; both solves see the same
Brownian path, so their losses agree to rounding and only the gradients differ.

Usage::

    python benchmarks/bench_sdebnn_adjoint_gap.py [--dt 0.1,0.05,0.01,0.002] [--seeds 3] [--estimator stl]
"""

from __future__ import annotations

import argparse
import statistics

import pyro
import torch

from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer import NeuralSDEGuide
from pyro_sdebnn.nn import SDEBNN


def gap(dt: float, seed: int, estimator: str) -> float:
    """Relative gap of the adjoint gradient to backprop's, one seed and step size."""
    torch.manual_seed(1000 + seed)
    x = torch.linspace(-1, 1, 8, dtype=torch.float64).unsqueeze(-1)
    y = (torch.sin(3 * x) + 0.1 * torch.randn_like(x)).squeeze(-1)
    pyro.clear_param_store()  # an independent fit: no parameters left under the same names by an earlier one
    net = SDEBNN(1, 1, hidden=4, augment=1, dt=dt).double()
    guide = NeuralSDEGuide(net, drift_hidden=4)
    guide(x, y)
    with torch.no_grad():  # a drift that is not zero, so every drift parameter has a gradient
        for p in guide.drifts["w_path"].out.parameters():
            p.normal_(0, 0.1)
    params = [net.w0] + list(guide.drifts.parameters())
    grads, losses = [], []
    for kwargs in (dict(method="milstein"), dict(method="euler", adjoint=True)):
        pyro.set_rng_seed(seed)  # the same Brownian path in both solves
        loss = net.fused_loss(x, y, guide, estimator=estimator, num_samples=2, dt=dt, **kwargs)
        losses.append(loss.detach())
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    if not torch.allclose(losses[0], losses[1], rtol=1e-8):
        raise RuntimeError(f"dt={dt}: the two solves did not see the same Brownian path ({losses})")
    return ((grads[1] - grads[0]).norm() / grads[0].norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dt", default="0.1,0.05,0.01,0.002", help="comma-separated step sizes")
    parser.add_argument("--seeds", type=check.positive_int, default=3)
    parser.add_argument("--estimator", default="stl", choices=["analytic", "full_mc", "stl"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"adjoint vs backprop gradient, relative gap ({args.estimator}, {args.seeds} seeds)\n")
    print("| dt | median | min-max |\n|---|---|---|")
    for dt in (float(s) for s in args.dt.split(",")):
        gaps = [gap(dt, seed, args.estimator) for seed in range(args.seeds)]
        print(f"| {dt:g} | {100 * statistics.median(gaps):.2f} % | {100 * min(gaps):.2f}-{100 * max(gaps):.2f} % |")


if __name__ == "__main__":
    main()
