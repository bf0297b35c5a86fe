# SPDX-License-Identifier: Apache-2.0
"""SGLD and SGHMC with their defaults against NUTS on two small real data sets, as a new user would run them.

Data: scikit-learn's bundled ``load_diabetes`` (442 x 10, regression; features and target standardised on the
training set) and ``load_breast_cancer`` (569 x 30, binary; features standardised), an 80/20 split with
``random_state=0`` (stratified for the classification). The model is written as Pyro's Bayesian-regression tutorial
writes one: a tanh layer of 32 units, ``Normal(0, 1)`` priors with ``.expand(...).to_event(...)``, and for the
regression ``sigma ~ Uniform(0, 10)``.

- NUTS (Hoffman & Gelman [1]): 2 chains of 250 warm-up + 250 draws, maximum tree depth 8, on the full data;
- SGLD and SGHMC: ``MCMC(Kernel(model, num_steps=10, vectorized_chains=2), warmup_steps=400, num_samples=400)``
  over a shuffled ``DataLoader`` of batch 64, every other setting a default (the warm-up adapts the mass matrix);
  ``--num-steps`` sets the inner steps per draw, to see how long a chain a kernel needs to mix;
  ``--integrator euler`` runs SGLD with Welling and Teh's noise in place of the default Leimkuhler--Matthews noise,
  ``--warmup-step-factor`` sets the kernels' exploring step in warm-up (default 2).

Reported per data set and method, on the test set: the predictive standard deviation (regression, in the target's
original units) or the spread of the class probability over the draws (classification), each also as a ratio to
NUTS'; the 95 % interval coverage (regression); the test negative log-likelihood of the predictive mixture and its
difference from NUTS'; the largest split R-hat of the predictions over the 2 chains (function space, Gelman et
al. [2]); the warnings the run printed; wall time. Targets: ratio 0.8-1.25, NLL within 0.10 (regression) / 0.05
(classification) of NUTS', function-space R-hat <= 1.1.

NUTS takes minutes on the regression: its predictions are cached in ``--output`` (``nuts_<data>.pt``, keyed by
its settings and seed) and reused by later runs; with ``--nuts-seed 0`` the SG-MCMC chains of any ``--seed`` are
compared with the cached seed-0 reference. ``--quick`` runs a small version (a subset of the data, a narrow network,
short chains) in seconds, to check the pipeline only: its figures mean nothing.

**References**

[1] Matthew D. Hoffman, Andrew Gelman (2014). "The No-U-Turn Sampler: Adaptively Setting Path Lengths in Hamiltonian
Monte Carlo". Journal of Machine Learning Research 15.

[2] Andrew Gelman, John B. Carlin, Hal S. Stern, David B. Dunson, Aki Vehtari, Donald B. Rubin (2013). "Bayesian
Data Analysis", 3rd edition, Chapman & Hall/CRC.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path
from typing import TypedDict

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

from pyro_sdebnn import metrics
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.experiments import _harness as common
from pyro_sdebnn.infer.mcmc import SGHMC, SGLD
from pyro_sdebnn.infer.mcmc.arviz import function_space_diagnostics, get_samples, posterior_prediction
from pyro_sdebnn.infer.mcmc.diagnostics import SamplerDivergenceError, SamplerWarning

NAME = "realdata-nuts"
DESCRIPTION = "SGLD / SGHMC defaults against NUTS on scikit-learn's diabetes and breast-cancer data"

__all__ = ["DESCRIPTION", "NAME", "add_arguments", "run"]


DATASETS = ("diabetes", "breast")
METHODS = ("NUTS", "SGLD", "SGHMC")


class _Targets(TypedDict):
    ratio: tuple[float, float]  # the band of the posterior-spread ratio to NUTS
    nll: dict[str, float]  # per data set, the largest |test NLL difference| to NUTS
    rhat: float  # the largest function-space R-hat


TARGETS: _Targets = {"ratio": (0.8, 1.25), "nll": {"diabetes": 0.10, "breast": 0.05}, "rhat": 1.1}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--datasets", nargs="+", action=check.Distinct, default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--methods", nargs="+", action=check.Distinct, default=list(METHODS), choices=METHODS)
    parser.add_argument("--nuts-seed", type=check.seed, default=None,
                        help="seed of the NUTS reference (default: --seed); a cached reference of that seed is reused")
    parser.add_argument("--num-steps", type=check.positive_int, default=None,
                        help="inner steps of SGLD / SGHMC per returned draw (default 10, 2 with --quick): a larger "
                             "value runs the same number of draws over a longer chain")
    parser.add_argument("--integrator", choices=("lm", "euler"), default=None,
                        help="SGLD's noise (default: the kernel's, 'lm'); 'euler': Welling and Teh's update, whose "
                             "adapted step is capped at a quarter of the stability limit")
    parser.add_argument("--warmup-step-factor", type=check.float_range(1.0, 4.0, high_open=True), default=None,
                        help="the kernels' exploring step in warm-up, in multiples of the capped step (default: the "
                             "kernel's, 2)")


def _read_cache(path: Path, key: str) -> dict | None:
    """The NUTS samples cached in ``path`` for the settings ``key``, or ``None``: no file, another key, or a file
    that is not such a cache (truncated, or another file of that name), which is then computed again and
    overwritten."""
    if not path.is_file():
        return None
    try:
        cached = torch.load(path, weights_only=True)
    except Exception:  # truncated zip, bad pickle, unsupported globals: not a cache this benchmark can read
        return None
    if not isinstance(cached, dict) or cached.get("key") != key or not isinstance(cached.get("samples"), dict):
        return None
    return cached["samples"]


def _write_cache(path: Path, key: str, samples: dict) -> None:
    """Write the cache atomically (a temporary file moved into place): Ctrl-C during the write leaves no half file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save({"key": key, "samples": samples}, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _settings(quick: bool) -> dict:
    if quick:
        return dict(hidden=4, max_train=60, batch=20, nuts_warmup=10, nuts_samples=10, depth=3, warmup=20,
                    samples=20, num_steps=2, quick=True)
    return dict(hidden=32, max_train=None, batch=64, nuts_warmup=250, nuts_samples=250, depth=8, warmup=400,
                samples=400, num_steps=10, quick=False)


def _load(name: str, max_train):
    X, y = (load_diabetes if name == "diabetes" else load_breast_cancer)(return_X_y=True)
    classify = name == "breast"
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y if classify else None)
    if max_train is not None:
        Xtr, ytr = Xtr[:max_train], ytr[:max_train]
    mu, sd = Xtr.mean(0), Xtr.std(0)
    Xtr, Xte = (torch.tensor((a - mu) / sd, dtype=torch.float32) for a in (Xtr, Xte))
    if classify:
        return Xtr, Xte, torch.tensor(ytr, dtype=torch.long), torch.tensor(yte, dtype=torch.long), 1.0
    ym, ys = ytr.mean(), ytr.std()
    return Xtr, Xte, *(torch.tensor((a - ym) / ys, dtype=torch.float32) for a in (ytr, yte)), float(ys)


def _model(num_inputs: int, hidden: int, classify: bool):
    def model(x, y=None):
        w1 = pyro.sample("w1", dist.Normal(0.0, 1.0).expand([num_inputs, hidden]).to_event(2))
        b1 = pyro.sample("b1", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        w2 = pyro.sample("w2", dist.Normal(0.0, 1.0).expand([hidden, 2 if classify else 1]).to_event(2))
        b2 = pyro.sample("b2", dist.Normal(0.0, 1.0).expand([2 if classify else 1]).to_event(1))
        f = torch.tanh(x @ w1 + b1.unsqueeze(-2)) @ w2 + b2.unsqueeze(-2)
        if classify:
            with pyro.plate("data", x.shape[0]):
                return pyro.sample("obs", dist.Categorical(logits=f), obs=y)
        sigma = pyro.sample("sigma", dist.Uniform(0.0, 10.0))
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("obs", dist.Normal(f.squeeze(-1), sigma), obs=y)

    return model


def _nuts(model, Xtr, ytr, s, seed):
    pyro.set_rng_seed(seed)
    # the JIT pays off on the long chains only
    kernel = NUTS(model, jit_compile=not s["quick"], ignore_jit_warnings=True, max_tree_depth=s["depth"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the JIT's tracer warnings, "chains drawn sequentially"
        mcmc = MCMC(kernel, num_samples=s["nuts_samples"], warmup_steps=s["nuts_warmup"], num_chains=2,
                    mp_context="spawn", disable_progbar=True)
        mcmc.run(Xtr, ytr)
    return mcmc.get_samples()


def _sgmcmc(kernel_cls, model, Xtr, ytr, s, seed, **settings):
    pyro.set_rng_seed(seed)
    loader = DataLoader(TensorDataset(Xtr, ytr), batch_size=s["batch"], shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    kernel = kernel_cls(model, num_steps=s["num_steps"], vectorized_chains=2, **settings)
    mcmc = MCMC(kernel, num_samples=s["samples"], warmup_steps=s["warmup"], disable_progbar=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SamplerWarning)
        mcmc.run(loader)
    notes = [str(w.message) for w in caught if issubclass(w.category, SamplerWarning)]
    return get_samples(mcmc), notes, kernel


def _score(pred, yte, yscale, classify):
    out = {"fs_rhat": float(function_space_diagnostics(pred, num_chains=2)["r_hat_max"])}
    if classify:
        out["spread"] = float(pred.probs.std(0).mean())
        out["nll"] = float(metrics.negative_log_likelihood(pred.mean_probs, yte))
    else:
        out["spread"] = float(pred.variance.sqrt().mean() * yscale)
        out["nll"] = -float(metrics.gaussian_mixture_log_likelihood(pred.loc, pred.scale, yte, y_scale=yscale))
        out["coverage"] = float(metrics.interval_coverage(pred.loc, pred.scale, yte, 0.95))
    return out


def _write_tables(out_dir: Path, rows: list) -> None:
    """``realdata_nuts.md`` and ``.json`` of the rows finished so far."""
    header = ("| data | method | predictive sd / prob. spread | ratio to NUTS | 95 % coverage | test NLL | NLL - NUTS "
              "| function-space R-hat | SamplerWarnings | seconds | note |\n|" + "---|" * 11 + "\n")
    lines = [
        f"| {r['data']} | {r['method']} | {r['spread']:.4g} | {r['ratio']:.2f} | "
        f"{r.get('coverage', float('nan')):.2f} | {r['nll']:.3f} | {r['nll_diff']:+.3f} | {r['fs_rhat']:.3f} | "
        f"{r['warnings']} | {r['seconds']} | {r['note']} |"
        for r in rows
    ]
    (out_dir / "realdata_nuts.md").write_text(header + "\n".join(lines) + "\n")
    (out_dir / "realdata_nuts.json").write_text(json.dumps(rows, indent=1))


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    s = _settings(args.quick)
    if getattr(args, "num_steps", None) is not None:
        s["num_steps"] = args.num_steps
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, summary = [], {}
    try:
        for data in args.datasets:
            Xtr, Xte, ytr, yte, yscale = _load(data, s["max_train"])
            classify = data == "breast"
            model = _model(Xtr.shape[1], s["hidden"], classify)
            results = {}
            for method in ("NUTS",) + tuple(m for m in args.methods if m != "NUTS"):
                t0 = time.perf_counter()
                notes, extra = [], ""
                if method == "NUTS":
                    key = {k: s[k] for k in ("hidden", "max_train", "nuts_warmup", "nuts_samples", "depth")}
                    nuts_seed = args.seed if getattr(args, "nuts_seed", None) is None else args.nuts_seed
                    key["seed"] = nuts_seed
                    cache = out_dir / f"nuts_{data}.pt"
                    cached = _read_cache(cache, json.dumps(key, sort_keys=True))
                    if cached is not None:
                        samples = cached
                        extra = "cached"
                    else:
                        samples = _nuts(model, Xtr, ytr, s, nuts_seed)
                        _write_cache(cache, json.dumps(key, sort_keys=True), samples)
                else:
                    try:
                        settings = {}  # what the command line sets; the rest stays the kernel's default
                        if getattr(args, "integrator", None) is not None and method == "SGLD":
                            settings["integrator"] = args.integrator
                        if getattr(args, "warmup_step_factor", None) is not None:
                            settings["warmup_step_factor"] = args.warmup_step_factor
                        samples, notes, kernel = _sgmcmc({"SGLD": SGLD, "SGHMC": SGHMC}[method], model, Xtr, ytr, s,
                                                         args.seed, **settings)
                    except SamplerDivergenceError as err:  # a default that diverges is a result, not a crash
                        nan = float("nan")
                        results[method] = dict(data=data, method=method, spread=nan, nll=nan, fs_rhat=nan,
                                               seconds=round(time.perf_counter() - t0, 1), warnings=0,
                                               note=f"diverged: {str(err).split(':')[1].strip()}")
                        continue
                    adapted = kernel.diagnostics()["mass matrix adapted"]
                    extra = f"adapted, step {kernel._eta(kernel._t):.3g}" if adapted else "unit mass (short warm-up)"
                    extra += f"; {s['num_steps']} inner steps per draw"
                    halved = sum(1 for record in kernel.divergence_log if record.get("halved"))
                    if halved:  # the warm-up's step-size search fired
                        extra += f"; step halved {halved}x in warm-up"
                pred = posterior_prediction(model, samples, Xte)
                r = _score(pred, yte, yscale, classify)
                r.update(data=data, method=method, seconds=round(time.perf_counter() - t0, 1), warnings=len(notes),
                         note=extra)
                results[method] = r
            ref = results["NUTS"]
            for method, r in results.items():
                r["ratio"] = r["spread"] / ref["spread"]
                r["nll_diff"] = r["nll"] - ref["nll"]
                lo, hi = TARGETS["ratio"]
                r["met"] = bool(lo <= r["ratio"] <= hi and abs(r["nll_diff"]) <= TARGETS["nll"][data]
                                and r["fs_rhat"] <= TARGETS["rhat"])
                rows.append(r)
                summary[f"{data}/{method}"] = {k: r[k] for k in ("ratio", "nll_diff", "fs_rhat", "met")}
            _write_tables(out_dir, rows)  # after every data set: a Ctrl-C keeps what is finished
    except KeyboardInterrupt:
        _write_tables(out_dir, rows)
        done = {r["data"] for r in rows}
        raise common.Interrupted(summary, f"{len(done)} of {len(args.datasets)} data sets finished") from None
    return summary
