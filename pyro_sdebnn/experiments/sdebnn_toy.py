# SPDX-License-Identifier: Apache-2.0
"""SDE-BNN on the 1-D non-monotonic toy: posterior predictive bands, weight paths, gradient variance.

What it does (Xu et al. 2022 [1], Figs. 1, 3 and 4; Xu et al. 2020 [2], Sec. 4):

1. trains ``SDEBNN(in_dim=1, augment=2)`` with :class:`~pyro_sdebnn.infer.NeuralSDEGuide` and
   :class:`~pyro_sdebnn.infer.TracePathKL_ELBO` on ``toy_regression_1d``;
2. reports test RMSE, test log-likelihood and 90 % interval coverage (on the held-out grid inside
   the training range and on the whole grid [-3, 3] including extrapolation);
3. plots the predictive mean with 50/90 % bands and sample functions (``toy_predictive.png``) and
   posterior vs prior weight-path samples (``toy_weight_paths.png``);
4. at checkpoints during training, estimates the variance of the single-sample gradient of the
   negative ELBO w.r.t. the drift-net parameters for ``stl``, ``analytic`` and ``full_mc`` (sum of
   per-coordinate variances over ``--grad-samples`` draws), plotted in ``toy_grad_variance.png``.

**References**

1. W. Xu, R. T. Q. Chen, X. Li, D. Duvenaud (2022). Infinitely Deep Bayesian Neural Networks with
   Stochastic Differential Equations. AISTATS 2022, PMLR 151. arXiv:2102.06559.
2. W. Xu, R. T. Q. Chen, X. Li, D. Duvenaud (2020). Continuous-Depth Bayesian Neural Networks.
   ICML 2020 Workshop on Uncertainty and Robustness in Deep Learning.
"""

from __future__ import annotations

import argparse
import csv
import time

import pyro
import torch
from pyro.infer import SVI
from pyro.optim import Adam
from tqdm import tqdm

from pyro_sdebnn.data import toy_regression_1d
from pyro_sdebnn.infer import NeuralSDEGuide, TracePathKL_ELBO
from pyro_sdebnn.metrics import gaussian_mixture_log_likelihood, interval_coverage, rmse
from pyro_sdebnn.nn import SDEBNN

NAME = "sdebnn-toy"
DESCRIPTION = "SDE-BNN on the 1-D toy: predictive bands, weight paths, STL vs full-MC gradient variance"

ESTIMATORS = ("stl", "analytic", "full_mc")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=2000, help="SVI steps (quick: 200)")
    parser.add_argument("--augment", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--sigma", type=float, default=0.2)
    parser.add_argument("--dt", type=float, default=0.05)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--estimator", default="stl", choices=ESTIMATORS)
    parser.add_argument("--num-particles", type=int, default=4)
    parser.add_argument("--checkpoints", type=int, default=8, help="gradient-variance checkpoints")
    parser.add_argument("--grad-samples", type=int, default=32, help="single-sample gradients per checkpoint")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (small ops: 1 is fastest)")


def _grad_variance(net, guide, x, y, estimator: str, samples: int) -> float:
    params = list(guide.drifts.parameters())
    elbo = TracePathKL_ELBO(estimator=estimator)
    grads = []
    for _ in range(samples):
        loss = elbo.differentiable_loss(net.model, guide, x, y)
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    return torch.stack(grads).var(0).sum().item()


def _plots(args, data, pred, net, guide):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = data.x_test[:, 0].cpu()
    loc = pred.loc.cpu()
    fig, ax = plt.subplots(figsize=(6, 4))
    samples = loc + pred.scale.cpu() * torch.randn_like(loc)
    for lo, hi, alpha in ((0.05, 0.95, 0.2), (0.25, 0.75, 0.35)):
        ax.fill_between(x, samples.quantile(lo, 0), samples.quantile(hi, 0), color="C0", alpha=alpha, lw=0)
    for s in range(min(10, loc.shape[0])):
        ax.plot(x, loc[s], color="C0", lw=0.6, alpha=0.6)
    ax.plot(x, loc.mean(0), color="C0", lw=2, label="predictive mean")
    ax.scatter(data.x_train[:, 0].cpu(), data.y_train.cpu(), s=8, color="k", label="train")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_title("SDE-BNN predictive: 50/90 % bands, 10 sample functions", fontsize=10)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(args.output / "toy_predictive.png", dpi=120)
    plt.close(fig)

    with torch.no_grad():
        q = guide.get_posterior(data.x_train)["w_path"]
        post = q.rsample((5,)).cpu()
        prior = net.prior().sample((5,)).cpu()
    times = net.times.cpu()
    w0 = net.w0.detach().cpu()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, paths, title in ((axes[0], prior, "prior OU paths"), (axes[1], post, "posterior paths")):
        for j, idx in enumerate((0, 1, 2)):
            for s in range(paths.shape[0]):
                full = torch.cat([w0[idx].reshape(1), paths[s, :, idx]])
                ax.plot(times, full, color=f"C{j}", lw=0.8, alpha=0.7)
        ax.set_title(title)
        ax.set_xlabel("depth t")
    axes[0].set_ylabel("weight value (3 weights, 5 samples)")
    fig.tight_layout()
    fig.savefig(args.output / "toy_weight_paths.png", dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> dict:
    pyro.set_rng_seed(args.seed)
    pyro.clear_param_store()
    steps = 200 if args.quick and args.steps == 2000 else args.steps
    device = args.device
    data = toy_regression_1d(n_train=100, n_test=200, seed=args.seed)
    x, y = data.x_train.to(device), data.y_train.to(device)
    net = SDEBNN(1, 1, hidden=args.hidden, augment=args.augment, sigma=args.sigma, dt=args.dt).to(device)
    guide = NeuralSDEGuide(net, drift_hidden=64)
    guide(x, y)  # set up the drift nets before the first gradient-variance checkpoint
    elbo = TracePathKL_ELBO(num_particles=args.num_particles, vectorize_particles=True, max_plate_nesting=1,
                            estimator=args.estimator)
    svi = SVI(net.model, guide, Adam({"lr": args.lr}), elbo)
    checkpoints = set(torch.linspace(0, steps - 1, args.checkpoints).round().long().tolist())
    variance_rows = []
    losses = []
    start = time.perf_counter()
    train_time = 0.0
    for step in tqdm(range(steps), desc="sdebnn-toy", leave=False):
        if step in checkpoints:
            t0 = time.perf_counter()
            samples = 8 if args.quick else args.grad_samples
            row = {"step": step}
            for estimator in ESTIMATORS:
                row[estimator] = _grad_variance(net, guide, x, y, estimator, samples)
            variance_rows.append(row)
            train_time -= time.perf_counter() - t0
        losses.append(svi.step(x, y))
    train_time += time.perf_counter() - start

    pred = net.predict(data.x_test.to(device), guide, num_samples=100)
    inside = data.x_test[:, 0].abs() <= 2
    y_test = data.y_test.to(device)
    results = {
        "steps": steps,
        "train_seconds": train_time,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "test_rmse_in_range": rmse(pred.mean[inside], y_test[inside]).item(),
        "test_ll_in_range": gaussian_mixture_log_likelihood(pred.loc[:, inside], pred.scale[:, inside],
                                                            y_test[inside]).item(),
        "coverage90_in_range": interval_coverage(pred.loc[:, inside], pred.scale[:, inside], y_test[inside],
                                                 level=0.9).item(),
        "coverage90_all": interval_coverage(pred.loc, pred.scale, y_test, level=0.9).item(),
        "obs_scale": float(net.obs_scale.detach()),
    }
    diffs = pred.loc.diff(dim=1)
    results["fraction_monotone_samples"] = ((diffs >= 0).all(1) | (diffs <= 0).all(1)).float().mean().item()
    _plots(args, data, pred, net, guide)

    with open(args.output / "toy_grad_variance.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["step", *ESTIMATORS])
        writer.writeheader()
        writer.writerows(variance_rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for estimator in ESTIMATORS:
        ax.semilogy([r["step"] for r in variance_rows], [r[estimator] for r in variance_rows], marker="o",
                    label=estimator)
    ax.set_xlabel("training step")
    ax.set_ylabel("gradient variance (drift net)")
    ax.set_title("Variance of the drift-net gradient")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output / "toy_grad_variance.png", dpi=120)
    plt.close(fig)
    last = variance_rows[-1]
    results.update({f"grad_var_{e}_final": last[e] for e in ESTIMATORS})
    lines = ["| metric | value |", "|---|---|"] + [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
                                                  for k, v in results.items()]
    (args.output / "sdebnn_toy.md").write_text("\n".join(lines) + "\n")
    return results
