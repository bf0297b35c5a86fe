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
3. ``pyro_sdebnn.infer.mcmc.to_inference_data`` builds the ``InferenceData`` (``az.from_pyro`` drops the
   log-likelihood, with only a ``UserWarning``, for networks built from ``nn.Linear``, which do not vectorise over
   draws);
4. weight-space ESS / R-hat of a network are nearly meaningless (permutation symmetries, flat directions);
   diagnose the chains on their *predictions* instead (function-space ESS / R-hat);
5. how to read the numbers it prints, whatever they come out as: the script compares each with its threshold and
   says what it means here and what to do -- R-hat <= 1.01 and a bulk ESS of at least 100 per chain (Vehtari et
   al. [2]), Pareto k <= 0.7 for PSIS-LOO (Vehtari, Gelman & Gabry [3]; ArviZ uses min(1 - 1/log10 S, 0.7) for S
   draws, [4]), and the kernel's divergence count.

**References**

1. Tianqi Chen, Emily B. Fox, Carlos Guestrin (2014). Stochastic Gradient Hamiltonian Monte Carlo. ICML 2014.
2. A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner (2021). Rank-Normalization, Folding, and
   Localization: An Improved R-hat for Assessing Convergence of MCMC. Bayesian Analysis 16(2).
3. A. Vehtari, A. Gelman, J. Gabry (2017). Practical Bayesian Model Evaluation Using Leave-One-Out
   Cross-Validation and WAIC. Statistics and Computing 27(5).
4. A. Vehtari, D. Simpson, A. Gelman, Y. Yao, J. Gabry (2024). Pareto Smoothed Importance Sampling. Journal of
   Machine Learning Research 25(72).
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
from pyro_sdebnn.infer.mcmc import BayesianMLP, SGHMC, to_inference_data
from pyro_sdebnn.infer.mcmc.arviz import function_space_diagnostics, get_samples
from pyro_sdebnn.infer.mcmc.arviz import posterior_prediction
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
          f"(backend {kernel.backend_used})")

    # %% [markdown]
    # ## ArviZ
    # ``to_inference_data`` moves the vectorised chains to ArviZ's chain dimension and computes the pointwise
    # log-likelihood on all 200 training points draw by draw when the model does not vectorise.
    with warnings.catch_warnings(record=True) as caught:  # shown below, with what it means
        warnings.simplefilter("always")
        plain = az.from_pyro(mcmc, log_likelihood=True)
    print("az.from_pyro groups:", plain.groups(), "(no log_likelihood: the nn.Linear model does not vectorise)")
    for warning in caught:
        print(f"  az.from_pyro warned ({warning.category.__name__}): {str(warning.message).strip()}")
    idata = to_inference_data(mcmc)
    print("to_inference_data groups:   ", idata.groups())

    # %% [markdown]
    # ## Divergences
    # An SG-MCMC kernel flags a divergence when a chain's state turns non-finite or its energy leaves the level it
    # had settled at (the rule is in ``pyro_sdebnn.infer.mcmc.diagnostics``). ``to_inference_data`` puts each one on
    # the vectorised chain that diverged, in ``sample_stats.diverging`` (``mcmc.diagnostics()`` sees the vectorised chains as one Pyro chain).
    per_chain = idata.sample_stats["diverging"].values.sum(axis=1).tolist()
    print(f"divergences per chain: {per_chain} ({chains} chains x {samples} draws)")
    if sum(per_chain) == 0:
        print("  none: no chain blew up. (With the default on_divergence='raise' the run would have stopped at the "
              "first one; with 'continue' a flagged chain restarts from its last healthy state and is counted here.)")
    else:
        print("  a chain diverged: its draws around the divergence are not from the posterior. Lower step_size "
              "(or raise friction for SGHMC) and run again.")
    summary = az.summary(idata, var_names=["layers.2.bias", "layers.2.weight"], coords={"layers.2.weight_dim_1":
                                                                                          [0, 1, 2]})
    print(summary[["mean", "sd", "ess_bulk", "ess_tail", "r_hat"]])
    print("  (a few output-layer weights; the weight-space R-hat and ESS are read below, next to the function-space "
          "ones)")
    axes = az.plot_trace(idata, var_names=["layers.2.bias"], compact=False)
    axes.ravel()[0].figure.savefig(args.output / "trace.png", dpi=90)
    axes = az.plot_autocorr(idata, var_names=["layers.2.bias"], combined=True)
    plt.gcf().savefig(args.output / "autocorrelation.png", dpi=90)
    plt.close("all")

    # %% [markdown]
    # ## PSIS-LOO
    # ``az.loo`` estimates the expected log predictive density of a new point by Pareto-smoothed importance sampling.
    # Its Pareto shape k per data point says whether that estimate can be trusted: k <= 0.7 ([3]; with S draws
    # ArviZ uses min(1 - 1/log10 S, 0.7), [4]). Above it, ArviZ warns (the warning is left on: it is part of the
    # result).
    loo = az.loo(idata, pointwise=True)
    bad = int((loo.pareto_k > loo.good_k).sum())
    print(f"LOO: elpd {loo.elpd_loo:.1f} ± {loo.se:.1f}, p_loo {loo.p_loo:.1f}; Pareto k > {loo.good_k:.2f} "
          f"(the threshold for {loo.n_samples} draws) on {bad} of {len(y)} points")
    if bad:
        print(f"  elpd_loo is unreliable: on those {bad} points a few draws dominate the importance weights, so "
              "leaving the point out is not well approximated by reweighting these draws. Run more draws (longer "
              "or more chains; the threshold rises to 0.7 with S), or score those points by exact refits (K-fold "
              "cross-validation) before comparing models on elpd.")
    else:
        print("  every k is below the threshold: the PSIS-LOO estimate can be used to compare models.")

    # %% [markdown]
    # ## Diagnose the predictions, not the weights
    # Weight-space ESS is low and R-hat high even when the predictive has converged: hidden units can swap and
    # many weight directions leave the function unchanged. ESS / R-hat of the predicted probabilities at the test
    # inputs are the meaningful diagnostics.
    pred = posterior_prediction(model, get_samples(mcmc), data.x_test)
    diag = function_space_diagnostics(pred.probs[..., 1], num_chains=chains)
    weights = az.ess(idata, var_names=["layers.1.weight"])["layers.1.weight"].values
    rhat_w = float(az.rhat(idata, var_names=["layers.1.weight"])["layers.1.weight"].values.max())
    ess_f, rhat_f = float(diag["ess_median"]), float(diag["r_hat_max"])
    print(f"weight space: median ESS {float(torch.tensor(weights).median()):.1f}, max R-hat {rhat_w:.2f}")
    print("  expected to look bad for a network: permuting hidden units or moving along flat directions leaves the "
          "function unchanged, so chains can sit in different but equivalent weight modes. Not a convergence test.")
    print(f"function space: median ESS {ess_f:.1f}, max R-hat {rhat_f:.2f} (of p(y=1|x) at {len(data.y_test)} test "
          "inputs)")
    if rhat_f > 1.01:
        print(f"  R-hat {rhat_f:.2f} > 1.01: the chains have not mixed -- they still disagree on some predictions, so "
              "the predictive spread is not yet the posterior's. Run longer (more warm-up and samples, "
              "e.g. without --quick), or tune step_size / friction, until max R-hat <= 1.01.")
    else:
        print(f"  R-hat {rhat_f:.2f} <= 1.01: the chains agree on every prediction.")
    if ess_f < 100 * chains:
        print(f"  median ESS {ess_f:.0f} < {100 * chains} (100 per chain): too few effectively independent draws for "
              "stable tail summaries; keep more samples (or thin less if the draws are cheap).")
    else:
        print(f"  median ESS {ess_f:.0f} >= {100 * chains} (100 per chain): enough for means and intervals.")
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
