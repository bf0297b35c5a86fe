# SPDX-License-Identifier: Apache-2.0
"""Tutorial 2 -- SDE-BNN: an infinitely deep Bayesian network with a neural-SDE posterior, in Pyro.

Run it as a script::

    python tutorials/02_sdebnn.py --output outputs/tutorial_02        # a few minutes on a laptop CPU
    python tutorials/02_sdebnn.py --quick --output /tmp/t02            # the CI smoke run (< 30 s)

What you learn:

1. the model: the weights of a continuous-depth network follow an Ornstein–Uhlenbeck path
   ``pyro.sample("w_path", OUPath(w0, sigma, times, method="euler"))``; the hidden state is integrated
   along that path (``SDEBNN.model``);
2. the guide: ``NeuralSDEGuide`` puts a neural-SDE posterior on every ``OUPath`` site (drift
   ``-theta w + NN(w, t)``, zero-initialised so training starts at the prior);
3. the objective: ``TracePathKL_ELBO`` replaces ``log p - log q`` of the path by a path-space KL
   estimator -- ``"stl"`` (sticking the landing) has the lowest gradient variance near the optimum;
4. prediction: ``Predictive`` as for any Pyro model, or ``SDEBNN.predict`` with fixed-step or adaptive
   torchsde solvers, and the one-call fused solve with the stochastic adjoint (``fused_loss``).
"""

# %% [markdown]
# ## Setup
from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402
from pyro.infer import SVI, Predictive  # noqa: E402
from pyro.optim import Adam  # noqa: E402

from pyro_sdebnn.data import toy_regression_1d  # noqa: E402
from pyro_sdebnn.infer import NeuralSDEGuide, TracePathKL_ELBO  # noqa: E402
from pyro_sdebnn.metrics import interval_coverage  # noqa: E402
from pyro_sdebnn.nn import SDEBNN  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budget (CI smoke run)")
    parser.add_argument("--output", type=Path, default=Path("outputs/tutorial_02"))
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensor ops: extra threads only add overhead
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args) -> dict:
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    steps = 150 if args.quick else 2000
    hidden, dt = (16, 0.1) if args.quick else (32, 0.05)

    # %% [markdown]
    # ## 1. Data, model and guide
    # A non-monotonic 1-D function. Two zero "augmentation" dimensions let the 1-D ODE flow bend back.
    data = toy_regression_1d(n_train=100, n_test=200)
    net = SDEBNN(in_dim=1, out_dim=1, hidden=hidden, augment=2, sigma=0.2, t_span=(0.0, 1.0), dt=dt)
    guide = NeuralSDEGuide(net, drift_hidden=64)
    print(f"{net.num_weights} weights follow an OU path over {net.times.shape[0] - 1} Euler steps")

    # %% [markdown]
    # ## 2. Train with the STL path-KL ELBO
    elbo = TracePathKL_ELBO(estimator="stl", num_particles=4, vectorize_particles=True, max_plate_nesting=1)
    svi = SVI(net.model, guide, Adam({"lr": 1e-2}), loss=elbo)
    start = time.perf_counter()
    losses = [svi.step(data.x_train, data.y_train) for _ in range(steps)]
    print(f"{steps} SVI steps in {time.perf_counter() - start:.1f} s, final loss {losses[-1]:.1f}")

    # %% [markdown]
    # ## 3. Predict: Pyro's Predictive, or SDEBNN.predict (a RegressionPrediction container)
    samples = Predictive(net.model, guide=guide, num_samples=20)(data.x_test)
    print("Predictive sites:", {k: tuple(v.shape) for k, v in samples.items()})
    pred = net.predict(data.x_test, guide, num_samples=100)
    inside = data.x_test[:, 0].abs() <= 2
    coverage = interval_coverage(pred.loc[:, inside], pred.scale[:, inside], data.y_test[inside], level=0.9)
    print(f"90 % interval coverage on held-out points in the training range: {coverage:.2f}")

    x = data.x_test[:, 0]
    fig, ax = plt.subplots(figsize=(6, 4))
    lo, hi = pred.loc.quantile(0.05, 0), pred.loc.quantile(0.95, 0)
    ax.fill_between(x, lo, hi, alpha=0.3, label="90 % band of the mean")
    for s in range(8):
        ax.plot(x, pred.loc[s], lw=0.6, color="C0")
    ax.scatter(data.x_train[:, 0], data.y_train, s=6, color="k", label="train")
    ax.legend()
    ax.set_title("SDE-BNN posterior sample functions")
    fig.tight_layout()
    fig.savefig(args.output / "sdebnn_toy.png", dpi=100)
    plt.close(fig)

    # %% [markdown]
    # ## 4. Solvers at test time, and the fused adjoint solve
    # ``predict`` integrates weights and hidden state in one call; torchsde gives higher-order and
    # adaptive solvers. ``fused_loss`` is the same negative ELBO from one solve, here with the stochastic
    # adjoint (whose memory does not grow with the number of steps) and the sticking-the-landing path-KL
    # estimator trained above; it solves at ``dt = min(net.dt, 0.01)`` by default under the adjoint, where the
    # adjoint's gradient is within a few per cent of backpropagation's.
    for kwargs in (dict(method="euler"), dict(method="srk", adaptive=True, rtol=1e-2, atol=1e-2)):
        start = time.perf_counter()
        p = net.predict(data.x_test[::10], guide, num_samples=4, **kwargs)
        print(f"predict {kwargs}: {time.perf_counter() - start:.2f} s, mean |f| {p.mean.abs().mean():.3f}")
    loss = net.fused_loss(data.x_train, data.y_train, guide, estimator="stl", adjoint=True)
    loss.backward()
    print(f"fused adjoint negative ELBO {loss.item():.1f}; gradient reached w0: {net.w0.grad is not None}")
    return {"coverage90": float(coverage), "final_loss": losses[-1]}


if __name__ == "__main__":
    main()
