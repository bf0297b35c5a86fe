# SPDX-License-Identifier: Apache-2.0
"""Tutorial 1 -- Two Moons head to head: calibration, reliability diagrams, epistemic vs aleatoric.

Run it as a script::

    python tutorials/01_two_moons.py --output outputs/tutorial_01          # about a minute
    python tutorials/01_two_moons.py --quick --output /tmp/t01              # the CI smoke run

What you learn:

1. every baseline of :mod:`pyro_sdebnn.infer` shares one interface -- ``Method(net, likelihood)``,
   ``.fit(x, y, ...)``, ``.predict(x)`` returning a ``ClassificationPrediction`` with per-sample
   probabilities of shape ``(S, N, C)`` -- so one evaluation loop covers all of them;
2. how to read calibration: accuracy alone does not tell a confident model from a calibrated one;
   ECE, the Brier score and the NLL (a proper scoring rule) do, and reliability diagrams show where;
3. post-hoc temperature scaling on a validation set, and what it can and cannot fix;
4. the split of predictive entropy into aleatoric (expected entropy) and epistemic (mutual
   information) uncertainty: the first lives on the class boundary, the second away from the data.

The full head-to-head with every method of the library is ``pyro-sdebnn benchmark two-moons``.
"""

# %% [markdown]
# ## Setup
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure

import pyro
from pyro_sdebnn.data import two_moons
from pyro_sdebnn.infer import DeepEnsemble, Laplace, MAPEstimate, MCDropout
from pyro_sdebnn.metrics import (
    accuracy,
    brier_score,
    expected_calibration_error,
    fit_temperature,
    negative_log_likelihood,
    reliability_diagram,
    temperature_scale,
    uncertainty_decomposition,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budget (CI smoke run)")
    parser.add_argument("--output", type=Path, default=Path("outputs/tutorial_01"), help="folder for the figures")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # tiny networks: more threads only add overhead
    pyro.set_rng_seed(args.seed)
    epochs, hidden, samples = (30, 16, 10) if args.quick else (300, 50, 100)

    # %% [markdown]
    # ## Data
    # Two interleaved half circles with Gaussian noise of standard deviation 0.2: 200 training points,
    # 500 test points from another random state, and a validation set from a third one for
    # temperature scaling.
    data = two_moons(n_train=200, n_test=500, noise=0.2, seed=args.seed)
    x_val, y_val = two_moons(n_train=200, n_test=1, seed=args.seed + 1)[:2]

    # %% [markdown]
    # ## Four methods, one interface
    # Each network outputs 2 logits; ``likelihood="categorical"`` makes it a classifier. The MAP is a
    # Pyro model (``PyroSample`` priors, ``AutoDelta`` guide); Laplace puts a Kronecker-factored
    # Gaussian around its own MAP and predicts with the linearised network; MC-dropout keeps dropout
    # on at test time; the deep ensemble trains five networks from different initialisations.
    def net(dropout: float = 0.0):
        def block(fan_in: int) -> list:  # Linear -> ReLU [-> Dropout]
            return [torch.nn.Linear(fan_in, hidden), torch.nn.ReLU()] + ([torch.nn.Dropout(dropout)] if dropout else [])

        return torch.nn.Sequential(*block(2), *block(hidden), torch.nn.Linear(hidden, 2))

    fit_kwargs = dict(num_epochs=epochs, lr=1e-2, batch_size=32, weight_decay=1e-4)
    methods = {
        "MAP": MAPEstimate(net(), "categorical"),
        "Laplace (KFAC)": Laplace(net(), "categorical", hessian_structure="kron"),
        "MC-dropout": MCDropout(net(dropout=0.1), "categorical", num_samples=samples),
        "Deep ensemble": DeepEnsemble(net, "categorical", num_members=2 if args.quick else 5),
    }
    predictions, val_predictions = {}, {}
    for name, method in methods.items():
        start = time.perf_counter()
        method.fit(data.x_train, data.y_train, **fit_kwargs)
        if isinstance(method, Laplace):
            # Monte Carlo through the linearised network: S smooth sample functions.
            predict = lambda x, m=method: m.predict(x, link_approx="mc", num_samples=samples)  # noqa: E731
        else:
            predict = method.predict
        predictions[name] = predict
        val_predictions[name] = predict(x_val).mean_probs
        print(f"fitted {name:<15s} in {time.perf_counter() - start:5.1f} s")

    # %% [markdown]
    # ## Calibration table (before and after temperature scaling)
    # Temperature scaling divides the log predictive probabilities by one scalar T fitted on the
    # validation set: it never changes the predicted class (accuracy is unchanged), only confidence.
    header = ("acc", "ECE", "Brier", "NLL")
    print(f"\n{'method':<15s} " + " ".join(f"{h:>6s}" for h in header) + f" | {'T':>5s} {'ECE_T':>6s} {'NLL_T':>6s}")
    test_probs = {}
    for name, predict in predictions.items():
        probs = predict(data.x_test).mean_probs
        test_probs[name] = probs
        temperature = fit_temperature(val_predictions[name].clamp_min(1e-12).log(), y_val)
        scaled = temperature_scale(probs.clamp_min(1e-12).log(), temperature)
        print(
            f"{name:<15s} {accuracy(probs, data.y_test):6.3f} {expected_calibration_error(probs, data.y_test):6.3f} "
            f"{brier_score(probs, data.y_test):6.3f} {negative_log_likelihood(probs, data.y_test):6.3f} | "
            f"{float(temperature):5.2f} {expected_calibration_error(scaled, data.y_test):6.3f} "
            f"{negative_log_likelihood(scaled, data.y_test):6.3f}"
        )

    # %% [markdown]
    # ## Reliability diagrams
    # Bars above the diagonal: under-confident bins; below: over-confident ones.
    fig = Figure(figsize=(4 * len(test_probs), 4))
    for ax, (name, probs) in zip(fig.subplots(1, len(test_probs)), test_probs.items()):
        reliability_diagram(probs, data.y_test, num_bins=10, ax=ax, title=name)
    fig.tight_layout()
    fig.savefig(args.output / "reliability_diagrams.png", dpi=100)

    # %% [markdown]
    # ## Epistemic vs aleatoric uncertainty
    # With S posterior samples p_s(y|x), the predictive entropy H[p̄] splits into the expected entropy
    # E_s H[p_s] (aleatoric: the classes overlap here) and the mutual information (epistemic: the
    # samples disagree here). A point estimate has no epistemic part at all.
    size = 30 if args.quick else 120
    gx, gy = torch.linspace(-3, 4, size), torch.linspace(-2.5, 3, size)
    grid = torch.stack(torch.meshgrid(gx, gy, indexing="xy"), -1).reshape(-1, 2)
    shown = ["MC-dropout", "Deep ensemble", "Laplace (KFAC)"]
    fig = Figure(figsize=(12, 3.4 * len(shown)))
    axes = fig.subplots(len(shown), 3, squeeze=False)
    # "Far away": 64 points on a circle of radius 4 around the data. ReLU networks extrapolate linearly, so
    # members agree (confidently) in most far directions and disagree only along the extended boundary:
    # averaged over the circle, the epistemic part is still far larger than on the training data.
    angle = torch.linspace(0, 2 * torch.pi, 65)[:-1]
    far = torch.stack([0.5 + 4 * angle.cos(), 0.25 + 4 * angle.sin()], -1)
    for row, name in zip(axes, shown):
        parts = uncertainty_decomposition(predictions[name](grid).probs)
        for ax, title, values in zip(row, ("total", "aleatoric", "epistemic"), parts):
            values = values.reshape(size, size).numpy()
            mesh = ax.pcolormesh(gx.numpy(), gy.numpy(), values, cmap="magma", shading="auto")
            fig.colorbar(mesh, ax=ax)
            ax.scatter(*data.x_train.T.numpy(), c=data.y_train.numpy(), cmap="coolwarm", s=3)
            ax.set_title(f"{name}: {title}", fontsize=9)
        near_mi = uncertainty_decomposition(predictions[name](data.x_train).probs).epistemic.mean()
        far_mi = uncertainty_decomposition(predictions[name](far).probs).epistemic.mean()
        print(f"{name:<15s} mean mutual information: training data {near_mi:.4f}, far circle {far_mi:.4f}")
    fig.tight_layout()
    fig.savefig(args.output / "epistemic_vs_aleatoric.png", dpi=90)
    print(f"\nfigures written to {args.output}")


if __name__ == "__main__":
    main()
