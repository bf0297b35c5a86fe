# SPDX-License-Identifier: Apache-2.0
"""SDE-BNN on the 1-D non-monotonic toy: posterior predictive bands, weight paths, gradient variance.

What it does (Xu et al. 2022 [1], Figs. 1, 3, 4 and 10; Xu et al. 2020 [2], Sec. 4):

1. trains ``SDEBNN(in_dim=1, augment=2)`` with :class:`~pyro_sdebnn.infer.NeuralSDEGuide` and
   :class:`~pyro_sdebnn.infer.TracePathKL_ELBO` on ``toy_regression_1d`` in the workshop paper's settings [2]
   (64-wide swish field and drift, Euler–Maruyama at dt = 0.01, 100 weight paths per step, σ = 0.5);
2. reports test RMSE, test log-likelihood and 90 % interval coverage, inside the training range and on [-3, 3];
3. plots the predictive mean with 50/90 % bands and sample functions, and posterior vs prior weight paths;
4. measures the variance of the single-path gradient of the negative ELBO with respect to the drift-net
   parameters φ, averaged over them ([1], Figs. 4 and 10),

   .. math::

       \\bar V = \\frac1P \\sum_{j=1}^P
       \\mathrm{Var}_\\varepsilon\\big[\\partial_{\\phi_j} (-\\widehat{\\mathrm{ELBO}})\\big],

   for ``stl``, ``analytic`` and ``full_mc`` on the same Brownian paths (common random numbers), during training
   on the OU end-point problem (:class:`EndpointPathProblem`) and on the trained regression SDE-BNN.

Why two problems: STL's advantage (Roeder et al. [3]) is a property of the limit q → posterior, where the STL
gradient is zero on every path (up to the O(dt) Euler error) while analytic and full Monte Carlo keep their
variance. The end-point problem's exact posterior is an SDE a neural SDE can reach, and its known evidence
measures how close q is (the ELBO gap); the regression SDE-BNN does not reach its exact posterior, so there STL ≈
analytic. The settings in full, the options and the output files are on the page :doc:`/methods/sdebnn`.

**References**

1. W. Xu, R. T. Q. Chen, X. Li, D. Duvenaud (2022). Infinitely Deep Bayesian Neural Networks with
   Stochastic Differential Equations. AISTATS 2022, PMLR 151. arXiv:2102.06559.
2. W. Xu, R. T. Q. Chen, X. Li, D. Duvenaud (2020). Continuous-Depth Bayesian Neural Networks.
   ICML 2020 Workshop on Uncertainty and Robustness in Deep Learning.
3. G. Roeder, Y. Wu, D. Duvenaud (2017). Sticking the Landing: Simple, Lower-Variance Gradient Estimators
   for Variational Inference. NeurIPS 2017. arXiv:1703.09194.
"""

from __future__ import annotations

import argparse
import csv
import math
import time

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI
from pyro.optim import PyroOptim
from tqdm import tqdm

from pyro_sdebnn.data import toy_regression_1d
from pyro_sdebnn.distributions import OUPath
from pyro_sdebnn.experiments import REGISTRY
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.experiments._harness import Interrupted, cpu_threads
from pyro_sdebnn.infer import NeuralSDEGuide, TracePathKL_ELBO
from pyro_sdebnn.metrics import gaussian_mixture_log_likelihood, interval_coverage, rmse
from pyro_sdebnn.nn import SDEBNN
from pyro_sdebnn.ops.sde_solve import time_grid
from pyro_sdebnn.testing.ou_problems import OUEndpointProblem

NAME = "sdebnn-toy"
DESCRIPTION = REGISTRY[NAME].description  # the one line of --help

ESTIMATORS = ("stl", "analytic", "full_mc")


#: ``--quick``: the smoke run's settings, used for the options not given (an explicit option wins).
QUICK = "40 SVI steps, 8 weight paths per step, dt 0.05, width 16, 100 + 32 gradient-variance steps / samples"
_DEFAULTS = {"steps": (2000, 40), "num_particles": (100, 8), "gv_steps": (1000, 100), "grad_samples": (128, 32),
             "dt": (0.01, 0.05), "hidden": (64, 16)}  # option: (full, --quick)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=check.positive_int, default=None,
                        help="SVI steps of the regression (default 2000; --quick: 40)")
    parser.add_argument("--augment", type=check.nonnegative_int, default=2,
                        help="zero dimensions appended to the state (default 2)")
    parser.add_argument("--hidden", type=check.positive_int, default=None,
                        help="width of the hidden field and of the drift (default 64; --quick: 16)")
    parser.add_argument("--sigma", type=check.positive_float, default=0.5, help="prior diffusion (default 0.5)")
    parser.add_argument("--dt", type=check.float_range(0.0, 1.0, low_open=True), default=None,
                        help="Euler step on the depth interval [0, 1], in (0, 1] (default 0.01; --quick: 0.05)")
    parser.add_argument("--lr", type=check.positive_float, default=1e-3, help="Adam learning rate (default 1e-3)")
    parser.add_argument("--estimator", default="stl", choices=ESTIMATORS)
    parser.add_argument("--num-particles", type=check.positive_int, default=None,
                        help="weight paths per step (default 100; --quick: 8)")
    parser.add_argument("--gv-steps", type=check.positive_int, default=None,
                        help="SVI steps of the gradient-variance path problem (default 1000; --quick: 100)")
    parser.add_argument("--gv-lr", type=check.positive_float, default=1e-2,
                        help="Adam learning rate of the path problem")
    parser.add_argument("--checkpoints", type=check.positive_int, default=6, help="gradient-variance checkpoints")
    parser.add_argument("--grad-samples", type=check.positive_int, default=None,
                        help="single-path gradients per checkpoint and estimator (default 128; --quick: 32)")
    parser.add_argument("--threads", type=check.positive_int, default=1,
                        help="torch.set_num_threads (small ops: 1 is fastest)")


def grad_variance(model, guide, model_args: tuple, estimator: str, samples: int, seed: int = 0) -> float:
    """Mean over the drift parameters of the variance of the single-path gradient of the negative ELBO.

    Path ``k`` is drawn under ``pyro.set_rng_seed(seed + k)``, so calls for different estimators use the same
    ``samples`` Brownian paths. Pyro's and torch's random states are restored afterwards.
    """
    params = list(guide.drifts.parameters())
    elbo = TracePathKL_ELBO(estimator=estimator)
    grads = []
    state = pyro.util.get_rng_state()
    try:
        for k in range(samples):
            pyro.set_rng_seed(seed + k)
            loss = elbo.differentiable_loss(model, guide, *model_args)
            grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    finally:
        pyro.util.set_rng_state(state)
    return torch.stack(grads).var(0).mean().item()


class EndpointPathProblem(OUEndpointProblem):
    """The closed-form OU end-point problem as a Pyro model: a D = 2 weight path observed at depth 1.

    .. math::

        w \\sim \\mathrm{OUPath}(0, \\sigma = 0.8, t \\in [0, 1], \\theta = 1), \\qquad
        y \\sim \\mathcal N(w_1, 0.3^2 I),\\quad y = (1, -0.5),

    on the Euler grid of step ``dt``, tensors on ``device``; its posterior drift and evidence are those of
    :class:`~pyro_sdebnn.testing.ou_problems.OUEndpointProblem`.
    """

    def __init__(self, dt: float, device: torch.device | str | None = None) -> None:
        super().__init__(torch.zeros(2, device=device), torch.tensor([1.0, -0.5], device=device), obs_scale=0.3,
                         sigma=0.8, theta=1.0)
        self.times = time_grid((0.0, 1.0), dt, device=device)

    def model(self, y: torch.Tensor) -> None:
        w = pyro.sample("w", OUPath(self.init, self.sigma, self.times, theta=self.theta, method="euler"))
        pyro.sample("y", dist.Normal(w[..., -1, :], self.obs_scale).to_event(1), obs=y)


def _path_problem_variance(args, steps: int, samples: int, particles: int,
                           rows: list[dict] | None = None) -> list[dict]:
    """Train the end-point path problem with STL; the three estimators' gradient variance at checkpoints, appended
    to ``rows`` (a new list by default) as each checkpoint is done."""
    problem = EndpointPathProblem(args.dt, device=args.device)
    pyro.clear_param_store()
    pyro.set_rng_seed(args.seed)
    guide = NeuralSDEGuide(problem.model, drift_hidden=args.hidden, drift_layers=2, activation="swish")
    y = problem.y
    guide(y)
    elbo = TracePathKL_ELBO(num_particles=particles, vectorize_particles=True, max_plate_nesting=0, estimator="stl")
    svi = SVI(problem.model, guide, PyroOptim(torch.optim.Adam, {"lr": args.gv_lr}), elbo)
    spaced = torch.logspace(0, math.log10(steps), max(args.checkpoints - 1, 1)).round().long().tolist()
    checkpoints = sorted({0, *spaced})
    # the ELBO gap from 1024 paths (analytic KL: the same expectation, the least noisy value)
    gap = TracePathKL_ELBO(num_particles=1024, vectorize_particles=True, max_plate_nesting=0, estimator="analytic")
    rows = [] if rows is None else rows
    for step in tqdm(range(steps + 1), desc="sdebnn-toy gradient variance", leave=False):
        if step in checkpoints:
            with torch.no_grad():
                row = {"step": step, "elbo_gap": gap.loss(problem.model, guide, y) + float(problem.log_evidence())}
            row.update({e: grad_variance(problem.model, guide, (y,), e, samples, seed=10**6) for e in ESTIMATORS})
            rows.append(row)
        if step < steps:
            svi.step(y)
    return rows


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
    with cpu_threads(args.threads):
        return _run(args)


def _run(args: argparse.Namespace) -> dict:
    for name, (full, quick) in _DEFAULTS.items():  # --quick fills in the options not given
        if getattr(args, name, None) is None:
            setattr(args, name, quick if args.quick else full)
    for name in ("steps", "num_particles", "gv_steps", "grad_samples", "checkpoints", "hidden"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if not 0 < args.dt <= 1:
        raise ValueError(f"--dt must be in (0, 1], got {args.dt}")
    results: dict = {}
    variance_rows: list[dict] = []
    try:
        _regression(args, results)
        _write_table(args, results, variance_rows)  # written as each part finishes
        _path_problem_variance(args, args.gv_steps, args.grad_samples, args.num_particles, variance_rows)
    except KeyboardInterrupt:
        _write_table(args, results, variance_rows)
        done = "the regression" if results else "nothing"
        raise Interrupted(results, f"{done} and {len(variance_rows)} gradient-variance checkpoints finished") from None
    with open(args.output / "toy_grad_variance.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["step", "elbo_gap", *ESTIMATORS])
        writer.writeheader()
        writer.writerows(variance_rows)
    _variance_plot(args, variance_rows)
    last = variance_rows[-1]
    results.update({f"grad_var_{e}_final": last[e] for e in ESTIMATORS})
    results["grad_var_stl_reduction"] = last["stl"] / variance_rows[0]["stl"] if variance_rows[0]["stl"] else math.nan
    _write_table(args, results, variance_rows)
    return results


def _regression(args: argparse.Namespace, results: dict) -> None:
    """Train the regression SDE-BNN, plot it and fill ``results`` (only once everything is computed)."""
    pyro.set_rng_seed(args.seed)
    pyro.clear_param_store()
    device = args.device
    data = toy_regression_1d(n_train=100, n_test=200, seed=args.seed)
    x, y = data.x_train.to(device), data.y_train.to(device)
    net = SDEBNN(1, 1, hidden=args.hidden, augment=args.augment, sigma=args.sigma, dt=args.dt,
                 activation="swish").to(device)
    guide = NeuralSDEGuide(net, drift_hidden=args.hidden, drift_layers=2, activation="swish")
    elbo = TracePathKL_ELBO(num_particles=args.num_particles, vectorize_particles=True, max_plate_nesting=1,
                            estimator=args.estimator)
    svi = SVI(net.model, guide, PyroOptim(torch.optim.Adam, {"lr": args.lr}), elbo)
    losses = []
    start = time.perf_counter()
    for _ in tqdm(range(args.steps), desc="sdebnn-toy", leave=False):
        losses.append(svi.step(x, y))
    train_time = time.perf_counter() - start

    pred = net.predict(data.x_test.to(device), guide, num_samples=100)
    inside = data.x_test[:, 0].abs() <= 2
    y_test = data.y_test.to(device)
    scores = {
        "steps": args.steps,
        "train_seconds": train_time,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "test_rmse_in_range": rmse(pred.mean[inside], y_test[inside]).item(),
        "test_ll_in_range": gaussian_mixture_log_likelihood(pred.loc[:, inside], pred.scale[:, inside],
                                                            y_test[inside]).item(),
        "coverage90_in_range": interval_coverage(pred.loc[:, inside], pred.scale[:, inside], y_test[inside],
                                                 level=0.9).item(),
        "coverage90_all": interval_coverage(pred.loc, pred.scale, y_test, level=0.9).item(),
        "obs_scale": float(torch.as_tensor(net.obs_scale).detach()),  # the learned noise scale (a PyroParam)
    }
    diffs = pred.loc.diff(dim=1)
    scores["fraction_monotone_samples"] = ((diffs >= 0).all(1) | (diffs <= 0).all(1)).float().mean().item()
    _plots(args, data, pred, net, guide)
    # the trained regression net: the three estimators on the same paths at its last posterior
    regression_samples = max(8, args.grad_samples // 4)
    scores.update({f"regression_grad_var_{e}": grad_variance(net.model, guide, (x, y), e, regression_samples,
                                                             seed=10**6) for e in ESTIMATORS})
    results.update(scores)


def _write_table(args: argparse.Namespace, results: dict, variance_rows: list[dict]) -> None:
    """``sdebnn_toy.md``: the metrics and the gradient-variance checkpoints finished so far."""
    lines = ["| metric | value |", "|---|---|"] + [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
                                                  for k, v in results.items()]
    if variance_rows:
        lines += ["", f"Gradient variance on the end-point path problem (mean per drift parameter, "
                  f"{args.grad_samples} common paths per checkpoint; ELBO gap = log evidence - ELBO, 0 at the "
                  "posterior up to the Euler error):", "",
                  "| step | ELBO gap | stl | analytic | full_mc |", "|---|---|---|---|---|"]
        lines += [f"| {r['step']} | {r['elbo_gap']:.4g} | {r['stl']:.3g} | {r['analytic']:.3g} | {r['full_mc']:.3g} |"
                  for r in variance_rows]
    (args.output / "sdebnn_toy.md").write_text("\n".join(lines) + "\n")


def _variance_plot(args, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    steps = [max(r["step"], 0.5) for r in rows]  # step 0 drawn at 0.5 on the log axis
    for estimator in ESTIMATORS:
        ax.loglog(steps, [r[estimator] for r in rows], marker="o", label=estimator)
    ax.set_xlabel("training step (STL); step 0 at 0.5")
    ax.set_ylabel("gradient variance per drift parameter")
    ax.set_title("OU end-point problem: gradient variance", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output / "toy_grad_variance.png", dpi=120)
    plt.close(fig)
