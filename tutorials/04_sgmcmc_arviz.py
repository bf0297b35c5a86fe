# SPDX-License-Identifier: Apache-2.0
"""Tutorial 4 -- SG-MCMC inside Pyro's MCMC, analysed with ArviZ: SGHMC chains, summary, traces, R-hat, LOO.

Run it as a script::

    python tutorials/04_sgmcmc_arviz.py --output outputs/tutorial_04     # about a minute
    python tutorials/04_sgmcmc_arviz.py --quick --output /tmp/t04         # the CI smoke run

What you learn:

1. a minibatched Bayesian network is an ordinary Pyro model: weights drawn outside ``pyro.plate("data", N)``,
   the likelihood indexing the data with the plate's indices. The minibatch size is a *kernel* setting
   (``SGHMC(..., subsample_size=32)``), never an argument of ``mcmc.run``: the runner, ``Predictive`` and ArviZ
   all see the full data, so the pointwise log-likelihood behind LOO is computed on every data point;
2. ``MCMC`` runs the kernel with its progress bar, ``num_chains``, ``hook_fn``, ``save_params``; several chains
   are cheapest as *vectorised* chains in one process (``vectorized_chains=4``);
3. ``pyro_sdebnn.infer.mcmc.from_pyro`` builds the ``InferenceData`` (``az.from_pyro`` silently drops the
   log-likelihood for networks built from ``nn.Linear``, which do not vectorise over draws);
4. weight-space ESS / R-hat of a network are nearly meaningless (permutation symmetries, flat directions);
   diagnose the chains on their *predictions* instead (function-space ESS / R-hat).

**References**

1. T. Chen, E. B. Fox, C. Guestrin (2014). Stochastic Gradient Hamiltonian Monte Carlo. ICML 2014.
"""

# %% [markdown]
# ## Setup
from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import arviz as az
import matplotlib
import pyro
import torch
from pyro.infer import MCMC

from pyro_sdebnn.data import two_moons
from pyro_sdebnn.infer.mcmc import SGHMC, BayesianMLP, from_pyro, function_space_diagnostics, get_samples
from pyro_sdebnn.infer.mcmc import posterior_prediction
from pyro_sdebnn.metrics import accuracy, expected_calibration_error

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budget (CI smoke run)")
    parser.add_argument("--output", type=Path, default=Path("outputs/tutorial_04"), help="folder for the figures")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # tiny network: more threads only add overhead
    pyro.set_rng_seed(args.seed)
    warmup, samples, chains = (10, 20, 2) if args.quick else (200, 100, 4)

    # %% [markdown]
    # ## The model
    # Two Moons (200 training points, noise 0.2) and a 2-50-50-1 tanh network with N(0, 1) weights and a
    # Bernoulli likelihood. ``BayesianMLP`` draws the weights before entering the data plate and records the
    # logits in ``pyro.deterministic("f")``.
    data = two_moons(n_train=200, n_test=500, noise=0.2, seed=args.seed)
    x, y = data.x_train, data.y_train.float()
    model = BayesianMLP([2, 50, 50, 1], likelihood="bernoulli")

    # %% [markdown]
    # ## SGHMC under Pyro's MCMC
    # SGHMC (Chen, Fox & Guestrin [1]) with its default step size 1e-2 and friction 1, batch 32, 10 inner steps
    # per returned sample (thinning), 200 burn-in samples, 100 kept. ``vectorized_chains`` runs the chains side by
    # side in one process.
    kernel = SGHMC(model, step_size=1e-2, friction=1.0, num_steps=10, subsample_size=32, vectorized_chains=chains)
    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=warmup, disable_progbar=args.quick)
    start = time.perf_counter()
    mcmc.run(x, y)
    print(f"SGHMC: {chains} chains x {samples} samples in {time.perf_counter() - start:.1f} s "
          f"(backend {kernel.backend_used}, divergences {mcmc.diagnostics()['divergences']})")

    # %% [markdown]
    # ## ArviZ
    # ``from_pyro`` moves the vectorised chains to ArviZ's chain dimension and computes the pointwise
    # log-likelihood on all 200 training points draw by draw when the model does not vectorise.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = az.from_pyro(mcmc, log_likelihood=True)
    print("az.from_pyro groups:", plain.groups(), "(no log_likelihood: the nn.Linear model does not vectorise)")
    idata = from_pyro(mcmc)
    print("from_pyro groups:   ", idata.groups())
    summary = az.summary(idata, var_names=["layers.2.bias", "layers.2.weight"], coords={"layers.2.weight_dim_1":
                                                                                          [0, 1, 2]})
    print(summary[["mean", "sd", "ess_bulk", "ess_tail", "r_hat"]])
    axes = az.plot_trace(idata, var_names=["layers.2.bias"], compact=False)
    axes.ravel()[0].figure.savefig(args.output / "trace.png", dpi=90)
    axes = az.plot_autocorr(idata, var_names=["layers.2.bias"], combined=True)
    plt.gcf().savefig(args.output / "autocorrelation.png", dpi=90)
    plt.close("all")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pareto-k warnings are expected on short chains of a network
        loo = az.loo(idata, pointwise=True)
    print(f"LOO: elpd {loo.elpd_loo:.1f} ± {loo.se:.1f}, p_loo {loo.p_loo:.1f}, "
          f"Pareto k > 0.7 on {(loo.pareto_k > 0.7).sum().item()} of {len(y)} points")

    # %% [markdown]
    # ## Diagnose the predictions, not the weights
    # Weight-space ESS is low and R-hat high even when the predictive has converged: hidden units can swap and
    # many weight directions leave the function unchanged. ESS / R-hat of the predicted probabilities at the test
    # inputs are the meaningful diagnostics.
    pred = posterior_prediction(model, get_samples(mcmc), data.x_test)
    diag = function_space_diagnostics(pred.probs[..., 1], num_chains=chains)
    weights = az.ess(idata, var_names=["layers.1.weight"])["layers.1.weight"].values
    rhat_w = az.rhat(idata, var_names=["layers.1.weight"])["layers.1.weight"].values
    print(f"weight space: median ESS {float(torch.tensor(weights).median()):.1f}, max R-hat {rhat_w.max():.2f}")
    print(f"function space: median ESS {float(diag['ess_median']):.1f}, max R-hat {float(diag['r_hat_max']):.2f}")
    print(f"test accuracy {float(accuracy(pred.mean_probs, data.y_test)):.3f}, "
          f"ECE {float(expected_calibration_error(pred.mean_probs, data.y_test)):.3f}")

    size = 20 if args.quick else 100
    gx, gy = torch.linspace(-2.5, 3.5, size), torch.linspace(-2.0, 2.5, size)
    grid = torch.stack(torch.meshgrid(gx, gy, indexing="xy"), -1).reshape(-1, 2)
    grid_probs = posterior_prediction(model, get_samples(mcmc), grid).probs[..., 1]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, values, title in zip(axes, (grid_probs.mean(0), grid_probs.std(0)), ("predictive mean", "predictive sd")):
        mesh = ax.pcolormesh(gx, gy, values.reshape(size, size), shading="auto", cmap="RdBu_r")
        fig.colorbar(mesh, ax=ax)
        ax.scatter(*x.T, c=y, cmap="coolwarm", s=4, edgecolors="k", linewidths=0.2)
        ax.set_title(f"SGHMC {title}")
    fig.tight_layout()
    fig.savefig(args.output / "predictive.png", dpi=90)
    plt.close(fig)
    print(f"\nfigures written to {args.output}")


if __name__ == "__main__":
    main()
