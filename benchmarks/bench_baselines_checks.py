# SPDX-License-Identifier: Apache-2.0
"""Cost of the data and param-store checks on the training hot loops, as with/without ratios in the same run.

1. The finite-data check (:func:`pyro_sdebnn.data.loaders.check_finite_batch`, one ``torch.isfinite(...).all()``
   per batch): an MC-dropout fit over a loader of 32 batches of 64 x 20 inputs (2 epochs, 20-64-2 MLP, the
   smallest step, so the largest relative cost), with the check vs with it replaced by a no-op.
2. The param-store synchronisation of the SDE-BNN and its guide (:class:`pyro_sdebnn.nn._param_store.ParamStoreModule`):
   10 SVI steps of the README's SDE-BNN (hidden 32, augment 2, dt 0.05, drift 64, 64 points), with the
   synchronisation vs with it replaced by a no-op.

After one untimed run of each, the two variants are interleaved within each repeat, in alternating order; the
median and the (min, max) of the per-repeat ratio with/without are printed.
Run: ``python benchmarks/bench_baselines_checks.py [--repeats 7]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import torch
from torch.utils.data import DataLoader, TensorDataset

import pyro_sdebnn.data.loaders as loaders
import pyro_sdebnn.nn._param_store as param_store
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer import MCDropout, NeuralSDEGuide, TracePathKL_ELBO
from pyro_sdebnn.nn import SDEBNN
from pyro_sdebnn.nn._mlp import make_mlp


def _ratios(run, patch, repeats: int) -> list[float]:
    for variant in (True, False):  # one untimed run of each: the process's first-call costs fall on neither side
        with patch(variant):
            run()
    ratios = []
    for repeat in range(repeats):
        times = {}
        for variant in ((True, False) if repeat % 2 == 0 else (False, True)):  # the order alternates
            with patch(variant):
                start = time.perf_counter()
                run()
                times[variant] = time.perf_counter() - start
        ratios.append(times[True] / times[False])
    return ratios


class _Patch:
    def __init__(self, module, name, noop):
        self.module, self.name, self.noop, self.orig = module, name, noop, getattr(module, name)

    def __call__(self, enabled: bool):
        self.enabled = enabled
        return self

    def __enter__(self):
        setattr(self.module, self.name, self.orig if self.enabled else self.noop)

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.orig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=check.positive_int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    x = torch.randn(2048, 20)
    loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=64)

    def fit():
        torch.manual_seed(0)
        MCDropout(make_mlp([20, 64, 2], dropout=0.1), "categorical", num_samples=2).fit(loader, num_epochs=2)

    ratios = _ratios(fit, _Patch(loaders, "check_finite_batch", lambda *a, **k: None), args.repeats)
    print(f"finite-data check, MC-dropout fit over a loader: with/without {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f})")

    pyro.clear_param_store()
    xs = torch.linspace(-1, 1, 64).unsqueeze(-1)
    ys = torch.sin(3 * xs).squeeze(-1)
    net = SDEBNN(1, 1, hidden=32, augment=2, dt=0.05)
    guide = NeuralSDEGuide(net, drift_hidden=64)
    svi = pyro.infer.SVI(net.model, guide, pyro.optim.Adam({"lr": 1e-3}), TracePathKL_ELBO())
    svi.step(xs, ys)

    def steps():
        for _ in range(10):
            svi.step(xs, ys)

    ratios = _ratios(steps, _Patch(param_store, "_adopt", lambda *a: None), args.repeats)
    print(f"param-store sync, SDE-BNN SVI step: with/without {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
