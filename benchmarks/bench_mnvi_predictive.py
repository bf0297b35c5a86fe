# SPDX-License-Identifier: Apache-2.0
"""Error of the MNVI classification predictives against a large Monte Carlo reference (Two Moons).

Trains the MNVI network of the main job (``pyro-sdebnn benchmark two-moons``: 2-50-50-2 ReLU MLP converted with
``to_mnvi``, prior scale 1, Adam lr 1e-2, batch 64, 300 epochs, 200 training points of Two Moons, noise 0.2) and
compares, on the 500 test points and an 80 x 80 grid over :math:`[-2, 3] \\times [-1.5, 2]`, the predictives of
:meth:`~pyro_sdebnn.infer.SamplingFreeBNN.predict` with the reference
:math:`\\mathbb E[\\operatorname{softmax}(h)]`, :math:`h\\sim\\mathcal N(\\bar h, \\operatorname{diag} v_h)`,
estimated with ``--reference`` independent draws per input (its standard error is printed):

- ``probit``: the deterministic probit approximation (MacKay 1992), the default;
- ``mc``: ``--samples`` draws with common random numbers across inputs;
- independent draws per input with ``--samples`` draws, for comparison.

Printed per predictive: max and mean absolute error of the class-1 probability, and the largest difference
between two calls (run-to-run variation). Single-threaded, about a minute on an idle core.

Usage::

    python benchmarks/bench_mnvi_predictive.py [--epochs 300] [--samples 100] [--reference 100000]

**References**

[1] Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
    Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.

[2] David J. C. MacKay (1992). "The Evidence Framework Applied to Classification Networks".
    Neural Computation 4(5), 720-736.
"""

from __future__ import annotations

import argparse
import math

import pyro
import torch

from pyro_sdebnn.data import two_moons
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer import SamplingFreeBNN
from pyro_sdebnn.nn._mlp import make_mlp
from pyro_sdebnn.nn.mnvi import to_mnvi


def _reference(out, draws: int, chunk: int = 2000) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(12345)
    total = torch.zeros_like(out.mean)
    total_sq = torch.zeros_like(out.mean)
    for start in range(0, draws, chunk):
        s = min(chunk, draws - start)
        p = torch.softmax(out.mean + out.var.sqrt() * torch.randn((s,) + out.mean.shape, generator=gen), -1)
        total += p.sum(0)
        total_sq += p.square().sum(0)
    mean = total / draws
    var = (total_sq / draws - mean.square()).clamp_min(0) * draws / (draws - 1)
    return mean, (var / draws).sqrt()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=check.positive_int, default=300)
    parser.add_argument("--samples", type=check.positive_int, default=100, help="draws of the Monte Carlo predictives")
    parser.add_argument("--reference", type=check.int_range(2), default=100_000, help="draws of the reference")
    parser.add_argument("--seed", type=check.seed, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pyro.set_rng_seed(args.seed)
    pyro.clear_param_store()
    data = two_moons(n_train=200, n_test=500, noise=0.2, seed=args.seed)
    bnn = SamplingFreeBNN(to_mnvi(make_mlp([2, 50, 50, 2], "relu")), "categorical", num_data=200, prior_scale=1.0)
    bnn.fit(data.x_train, data.y_train, num_epochs=args.epochs, batch_size=64, optim=pyro.optim.Adam({"lr": 1e-2}))
    g0, g1 = torch.meshgrid(torch.linspace(-2, 3, 80), torch.linspace(-1.5, 2, 80), indexing="xy")
    results = {}
    for where, x in (("test", data.x_test), ("grid", torch.stack([g0.flatten(), g1.flatten()], -1))):
        bnn.net.eval()
        with torch.no_grad():
            out = bnn.moments(x)
        ref, se = _reference(out, args.reference)
        ref1, se1 = ref[:, 1], se[:, 1]
        independent = [torch.softmax(out.mean + out.var.sqrt() * torch.randn((args.samples,) + out.mean.shape), -1)
                       .mean(0)[:, 1] for _ in range(2)]
        candidates = {
            "probit": [bnn.predict(x).mean_probs[:, 1] for _ in range(2)],
            f"mc (common random numbers, S={args.samples})":
                [bnn.predict(x, predictive="mc", num_samples=args.samples).mean_probs[:, 1] for _ in range(2)],
            f"independent draws per input (S={args.samples})": independent,
        }
        print(f"{where}: {x.shape[0]} inputs; reference standard error max {float(se1.max()):.1e}")
        for name, (a, b) in candidates.items():
            err = (a - ref1).abs()
            row = {"max_abs_error": float(err.max()), "mean_abs_error": float(err.mean()),
                   "run_to_run_max": float((a - b).abs().max())}
            results[f"{where}/{name}"] = row
            print(f"  {name:45s} max |error| {row['max_abs_error']:.4f}  mean |error| {row['mean_abs_error']:.4f}  "
                  f"two calls differ by up to {row['run_to_run_max']:.4f}")
        acc = float((data.y_test == bnn.predict(data.x_test).mean_probs.argmax(-1)).float().mean()) \
            if where == "test" else math.nan
        if where == "test":
            print(f"  test accuracy (probit) {acc:.3f}")
    return results


if __name__ == "__main__":
    main()
