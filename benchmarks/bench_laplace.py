# SPDX-License-Identifier: Apache-2.0
"""Laplace: calibration of post-hoc vs online prior tuning, KFAC predictive speed, the full-curvature memory check.

1. **Calibration.** Two Moons (200 training points of :func:`pyro_sdebnn.data.two_moons`, noise 0.2, 500 test
   points, the main job's data), scikit-learn's ``load_wine`` and ``load_breast_cancer`` (standardised with the
   training split's mean and standard deviation, 80/20 split with ``random_state=0``); the same 50-50 ReLU MLP,
   Adam (learning rate 1e-2, batch 32, 300 epochs, weight decay 1e-4 where the method uses one). Test NLL
   (nats), ECE (10 bins) and accuracy of the linearised probit predictive of

   - ours, ``tune_prior_precision="posthoc"``: MAP training with the fixed weight decay, then the evidence
     maximised over the prior precision (MacKay 1992);
   - ours, ``tune_prior_precision="online"``: the prior precision learned during the MAP training (Immer,
     Bauer, Fortuin, Rätsch, Khan (2021), *Scalable marginal likelihood estimation for model selection in deep
     learning*, ICML, Algorithm 1), for the full GGN and KFAC over all weights and the last-layer full GGN;
   - laplace-torch 0.3's ``marglik_training`` (the same paper's algorithm; KFAC, its defaults except the
     learning rate and the epochs: layer-wise and, for comparison, scalar prior precision), when installed.

   Each over ``--seeds`` network initialisations and minibatch orders; the table gives the mean and the
   per-seed values.
2. **KFAC predictive speed.** GLM + probit predictive of a 784-100-10 ReLU MLP (KFAC over all weights, fitted on
   1,000 random points) on 1,000 points: ours vs laplace-torch's ``KronLaplace``, interleaved in every repeat,
   one thread; median and spread of the per-repeat time ratio.
3. **Memory.** Full Laplace on the same 784-100-10 MLP (79,510 weights) refuses before any work with the
   estimated size and the alternatives (the message is printed).

laplace-torch is optional: without it the script reports only ours and says it is missing. Run:
``python benchmarks/bench_laplace.py [--seeds 3] [--repeats 5] [--points 1000] [--only calibration|speed|memory]
[--data two-moons|wine|breast-cancer] [--quick]``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch
from torch import nn

from pyro_sdebnn.data import two_moons
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer import Laplace
from pyro_sdebnn.metrics import expected_calibration_error

try:  # optional: the reference implementation
    import laplace as laplace_torch
except ImportError:  # pragma: no cover - depends on the environment
    laplace_torch = None


def _datasets(quick: bool) -> dict[str, tuple]:
    out = {}
    moons = two_moons(n_train=200, n_test=500, noise=0.2, seed=0)
    out["two-moons"] = (moons.x_train, moons.y_train.long(), moons.x_test, moons.y_test.long())
    try:
        from sklearn.datasets import load_breast_cancer, load_wine
        from sklearn.model_selection import train_test_split
    except ImportError:
        print("scikit-learn is missing: wine and breast cancer are left out")
        return out
    for name, loader in (("wine", load_wine), ("breast-cancer", load_breast_cancer)):
        x, y = loader(return_X_y=True)
        x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0)
        x_tr, x_te = torch.tensor(x_tr, dtype=torch.float32), torch.tensor(x_te, dtype=torch.float32)
        mean, std = x_tr.mean(0), x_tr.std(0)
        out[name] = ((x_tr - mean) / std, torch.tensor(y_tr), (x_te - mean) / std, torch.tensor(y_te))
    if quick:
        out = {k: out[k] for k in list(out)[:2]}
    return out


def _mlp(d_in: int, d_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, 50), nn.ReLU(), nn.Linear(50, 50), nn.ReLU(), nn.Linear(50, d_out))


def _metrics(probs: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float]:
    probs = probs.detach()
    nll = float(nn.functional.nll_loss(probs.clamp_min(1e-12).log(), y))
    return nll, float(expected_calibration_error(probs, y)), float((probs.argmax(-1) == y).float().mean())


def _ours(structure: str, subset: str, tune: str, epochs: int):
    def run(net, x, y, x_test):
        la = Laplace(net, "categorical", hessian_structure=structure, subset=subset)
        la.fit(x, y, num_epochs=epochs, lr=1e-2, batch_size=32, weight_decay=1e-4, tune_prior_precision=tune)
        return la.predict(x_test).probs.mean(0), la.prior_precision

    return run


def _laplace_torch(prior_structure: str, epochs: int):
    def run(net, x, y, x_test):
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True)
        la, _, _, _ = laplace_torch.marglik_training(
            net, loader, likelihood="classification", hessian_structure="kron", n_epochs=epochs,
            optimizer_kwargs={"lr": 1e-2}, prior_structure=prior_structure)
        probs = la(x_test, pred_type="glm", link_approx="probit")
        delta = la.prior_precision
        return probs, float(delta.mean()) if delta.numel() > 1 else float(delta)

    return run


def calibration(args) -> None:
    epochs = 30 if args.quick else 300
    methods = {
        "ours post-hoc, full": _ours("full", "all", "posthoc", epochs),
        "ours online, full": _ours("full", "all", "online", epochs),
        "ours post-hoc, KFAC": _ours("kron", "all", "posthoc", epochs),
        "ours online, KFAC": _ours("kron", "all", "online", epochs),
        "ours post-hoc, last layer full": _ours("full", "last_layer", "posthoc", epochs),
        "ours online, last layer full": _ours("full", "last_layer", "online", epochs),
    }
    if laplace_torch is None:
        print("laplace-torch is missing: only ours are reported (pip install laplace-torch for the comparison)")
    else:
        methods["laplace-torch marglik_training, KFAC, layer-wise"] = _laplace_torch("layerwise", epochs)
        methods["laplace-torch marglik_training, KFAC, scalar"] = _laplace_torch("scalar", epochs)
    print("\n## 1. Calibration (test NLL / ECE / accuracy; mean over seeds, then per seed)\n")
    print("| data | method | NLL | ECE | acc | prior precision | seconds | NLL per seed |")
    print("|---|---|---|---|---|---|---|---|")
    for data_name, (x, y, x_test, y_test) in _datasets(args.quick).items():
        if args.data is not None and data_name != args.data:
            continue
        rows = {name: [] for name in methods}
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            init = _mlp(x.shape[1], int(y.max()) + 1)
            for name, run in methods.items():
                torch.manual_seed(1000 + seed)  # the same minibatch order for every method
                start = time.perf_counter()
                probs, delta = run(copy.deepcopy(init), x, y, x_test)
                rows[name].append((*_metrics(probs, y_test), delta, time.perf_counter() - start))
        for name, values in rows.items():
            mean = [statistics.mean(v[i] for v in values) for i in range(5)]
            per_seed = ", ".join(f"{v[0]:.3f}" for v in values)
            print(f"| {data_name} | {name} | {mean[0]:.3f} | {mean[1]:.3f} | {mean[2]:.3f} | {mean[3]:.3g} | "
                  f"{mean[4]:.1f} | {per_seed} |", flush=True)


def predictive_speed(args) -> None:
    num_points = args.points or (100 if args.quick else 1000)
    print(f"\n## 2. KFAC GLM probit predictive, 784-100-10 ReLU MLP, {num_points:,} points, one thread\n")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(784, 100), nn.ReLU(), nn.Linear(100, 10))
    x_train, y_train = torch.rand(1000, 784), torch.randint(0, 10, (1000,))
    x_test = torch.rand(num_points, 784)
    ours = Laplace(copy.deepcopy(net), "categorical", hessian_structure="kron").fit(x_train, y_train, num_epochs=0)
    variants = {"ours": lambda x=x_test: ours.predict(x).probs}
    if laplace_torch is None:
        print("laplace-torch is missing: only ours is timed")
    else:
        lt = laplace_torch.Laplace(copy.deepcopy(net), "classification", subset_of_weights="all",
                                   hessian_structure="kron", prior_precision=ours.prior_precision)
        lt.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_train, y_train), batch_size=100))
        variants["laplace-torch"] = lambda x=x_test: lt(x, pred_type="glm", link_approx="probit")
        gap = (variants["ours"]()[0] - variants["laplace-torch"]()).abs().max()
        print(f"largest difference of the predicted probabilities: {float(gap):.2e} (same prior precision)")
    times = {name: [] for name in variants}
    for name, fn in variants.items():
        fn(x_test[:10])  # warm-up
    for _ in range(args.repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            with torch.no_grad() if name == "laplace-torch" else torch.enable_grad():
                fn()
            times[name].append(time.perf_counter() - start)
    for name, ts in times.items():
        print(f"{name}: median {statistics.median(ts):.3f} s ({min(ts):.3f}-{max(ts):.3f}) "
              f"for {x_test.shape[0]} points")
    if "laplace-torch" in times:
        ratios = [a / b for a, b in zip(times["ours"], times["laplace-torch"])]
        print(f"ours / laplace-torch: median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}), "
              f"{args.repeats} interleaved repeats")


def memory_check() -> None:
    print("\n## 3. Full Laplace on 784-100-10 (79,510 weights)\n")
    net = nn.Sequential(nn.Linear(784, 100), nn.ReLU(), nn.Linear(100, 10))
    start = time.perf_counter()
    try:
        Laplace(net, "categorical", hessian_structure="full").fit(torch.rand(10, 784), torch.randint(0, 10, (10,)))
        print("fitted (enough memory here)")
    except MemoryError as err:
        print(f"refused after {1e3 * (time.perf_counter() - start):.1f} ms: {err}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=check.positive_int, default=3)
    parser.add_argument("--repeats", type=check.positive_int, default=5)
    parser.add_argument("--threads", type=check.positive_int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="30 epochs and two data sets; the predictive timed on 100 points")
    parser.add_argument("--points", type=check.positive_int, default=None,
                        help="points the predictive is timed on (1000)")
    parser.add_argument("--only", choices=["calibration", "speed", "memory"], default=None)
    parser.add_argument("--data", choices=["two-moons", "wine", "breast-cancer"], default=None,
                        help="calibration on this data set only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecation notices laplace-torch's backends raise
    if args.only in (None, "memory"):
        memory_check()
    if args.only in (None, "speed"):
        predictive_speed(args)
    if args.only in (None, "calibration"):
        calibration(args)


if __name__ == "__main__":
    main()
