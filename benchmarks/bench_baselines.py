# SPDX-License-Identifier: Apache-2.0
"""Speed of the baselines' hot loops, as ratios against plain PyTorch measured in the same run.

1. One training step of the Pyro MAP (``MAPEstimate``: ``SVI`` + ``AutoDelta`` + subsampled plate) and of
   mean-field VI (``AutoNormal`` + ``TraceMeanField_ELBO``) vs one plain-PyTorch Adam step on
   cross-entropy + L2 (the same objective as the MAP), 2-50-50-2 ReLU MLP, batch 32 of 200 points.
   Deep ensemble (5 members) trained member by member vs vectorised with ``torch.func.vmap``.
2. Laplace curvature + prior tuning per structure (full / diag / kron, all weights / last layer), and the
   linearised predictive on 6400 grid points, on the same network.

Medians and (min, max) over repeats; the training steps of section 1 are interleaved within each repeat (after
one untimed run of each), in an order reversed every other repeat, and their ratios are per repeat. Ratios
measured in the same run are the meaningful figures. Run: ``python benchmarks/bench_baselines.py [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pyro_sdebnn.data import two_moons
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer import Laplace, MAPEstimate, MeanFieldVI
from pyro_sdebnn.nn._mlp import make_mlp


def _timeit(fn, repeats: int, number: int) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return times


def _summary(times: list[float]) -> str:
    return f"{1e3 * statistics.median(times):8.2f} ms  ({1e3 * min(times):.2f}-{1e3 * max(times):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=check.positive_int, default=5)
    parser.add_argument("--steps", type=check.positive_int, default=50, help="training steps per repeat")
    parser.add_argument("--threads", type=check.positive_int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = two_moons()
    x, y = data.x_train, data.y_train
    n, b = x.shape[0], 32

    # --- 1. training steps ------------------------------------------------------------------------------
    net = make_mlp([2, 50, 50, 2])
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2, weight_decay=1e-4)

    def torch_step():
        idx = torch.randint(0, n, (b,))
        loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    steps_per_epoch = -(-n // b)
    epochs = max(1, args.steps // steps_per_epoch)
    steps = epochs * steps_per_epoch
    methods = {cls.__name__: cls(make_mlp([2, 50, 50, 2]), "categorical") for cls in (MAPEstimate, MeanFieldVI)}
    runs = {"plain": lambda: [torch_step() for _ in range(steps)],
            **{name: (lambda m=m: m.fit(x, y, num_epochs=epochs, batch_size=b)) for name, m in methods.items()}}
    for run in runs.values():  # one untimed run of each first-call cost
        run()
    per_step: dict = {name: [] for name in runs}
    for repeat in range(args.repeats):  # interleaved, the order reversed every other repeat
        for name in (list(runs) if repeat % 2 == 0 else list(runs)[::-1]):
            start = time.perf_counter()
            runs[name]()
            per_step[name].append((time.perf_counter() - start) / steps)
    print(f"plain PyTorch Adam step          {_summary(per_step['plain'])}")
    for name in methods:
        ratios = [t / p for t, p in zip(per_step[name], per_step["plain"])]
        print(f"{name:<16s} SVI step        {_summary(per_step[name])}   ratio {statistics.median(ratios):5.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f})")

    # --- 1b. deep ensemble: members one by one vs vectorised (vmap over stacked weights) ----------------------
    from pyro_sdebnn.infer import DeepEnsemble

    ensemble_times = {}
    for vectorize in (False, True):
        ensemble = DeepEnsemble(lambda: make_mlp([2, 50, 50, 2]), "categorical", num_members=5)
        ensemble_times[vectorize] = _timeit(
            lambda: ensemble.fit(x, y, num_epochs=epochs, batch_size=b, vectorize=vectorize), args.repeats, 1
        )
    loop_median = statistics.median(ensemble_times[False])
    print(f"DeepEnsemble K=5, {epochs} epochs, one by one   {_summary(ensemble_times[False])}")
    print(f"DeepEnsemble K=5, {epochs} epochs, vectorised   {_summary(ensemble_times[True])}   "
          f"speed-up {loop_median / statistics.median(ensemble_times[True]):4.2f}x")

    # --- 2. Laplace --------------------------------------------------------------------------------------
    grid = torch.rand(6400, 2) * torch.tensor([6.0, 4.5]) - torch.tensor([2.5, 2.0])
    trained = make_mlp([2, 50, 50, 2])
    Laplace(trained, "categorical").fit(x, y, num_epochs=100, tune_prior_precision=False)
    forward = _timeit(lambda: trained(grid), args.repeats, 1)
    print(f"\nMAP forward on 6400 points       {_summary(forward)}")
    for subset in ("all", "last_layer"):
        for structure in ("full", "diag", "kron"):
            la = Laplace(trained, "categorical", subset=subset, hessian_structure=structure)
            fit = _timeit(lambda: la.fit(x, y, num_epochs=0), args.repeats, 1)
            pred = _timeit(lambda: la.predict(grid), args.repeats, 1)
            ratio = statistics.median(pred) / statistics.median(forward)
            print(
                f"Laplace {subset:<10s} {structure:<4s} P={la.num_params:<5d} fit {_summary(fit)}   "
                f"probit predictive {_summary(pred)}  ({ratio:6.1f}x forward)"
            )


if __name__ == "__main__":
    main()
