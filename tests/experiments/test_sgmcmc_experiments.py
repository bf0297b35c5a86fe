# SPDX-License-Identifier: Apache-2.0
"""Smoke runs of the SG-MCMC benchmarks (``pyro-sdebnn benchmark fsgmcmc-gap`` / ``sgmcmc-uci``) in quick mode."""

import argparse
import math

import pytest
import torch

from pyro_sdebnn.data import gap_regression_1d, uci_boston
from pyro_sdebnn.experiments import discover


def _mean_predictor_rmse(y_train, y_test):
    """RMSE of predicting the training mean, and its standard error (delta method on the mean squared error)."""
    sq = (y_test - y_train.mean()).pow(2)
    rmse = sq.mean().sqrt().item()
    return rmse, sq.std().item() / (2 * rmse * math.sqrt(len(sq)))


def _args(name, tmp_path, **extra):
    module = discover()[name]
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    args = parser.parse_args([])
    for key, value in dict(device=torch.device("cpu"), seed=0, output=tmp_path, quick=True, **extra).items():
        setattr(args, key, value)
    return module, args


@pytest.mark.slow
def test_fsgmcmc_gap_quick(tmp_path):
    module, args = _args("fsgmcmc-gap", tmp_path)
    result = module.run(args)
    assert set(result) == {"SGLD", "SGHMC", "fSGLD", "fSGHMC"}
    # the benchmark's data in original units; the coverages are fractions of each region of the 200-point grid
    split = gap_regression_1d(args.n_train, 200, args.seed, dtype=torch.float64)
    xt = split.x_test[:, 0]
    regions = {"train": (xt.abs() >= 1) & (xt.abs() <= 4), "gap": xt.abs() < 1, "extrapolation": xt.abs() > 4}
    baseline, se = _mean_predictor_rmse(split.y_train, split.y_test[regions["train"]])
    for row in result.values():
        assert row["divergences"] == 0
        for region, mask in regions.items():
            covered = row[f"coverage95_{region}"] * int(mask.sum())
            assert abs(covered - round(covered)) < 1e-4, (region, row)
        # y = x^3 + noise: the network beats predicting the training mean in the training range by 3 s.e.
        assert row["rmse_train_range"] < baseline - 3 * se and math.isfinite(row["test_ll_train_range"]), row
    for name in ("fsgmcmc_gap.png", "fsgmcmc_gap.md", "fsgmcmc_gap.csv"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.slow
def test_sgmcmc_uci_quick(tmp_path):
    module, args = _args("sgmcmc-uci", tmp_path, splits=1)
    result = module.run(args)
    assert set(result) == {"SGLD", "SGHMC", "fSGLD", "fSGHMC"}
    # a 13-50-50-1 network on Boston beats predicting the training mean on the same split (RMSE about 7.7
    # thousand dollars, standard error about 1.3 on its 51 test points) by 3 standard errors
    split = uci_boston(split=0, standardize=False, dtype=torch.float64)
    baseline, se = _mean_predictor_rmse(split.y_train, split.y_test)
    for row in result.values():
        assert row["rmse"] < baseline - 3 * se and math.isfinite(row["test_ll"]), (row, baseline, se)
    for name in ("sgmcmc_uci.md", "sgmcmc_uci.csv", "sgmcmc_uci_splits.csv"):
        assert (tmp_path / name).stat().st_size > 0


def test_realdata_nuts_quick(tmp_path):
    # the pipeline only (a subset of diabetes, a 4-unit network, short chains): the figures of a quick run mean nothing
    pytest.importorskip("sklearn")
    module, args = _args("realdata-nuts", tmp_path, datasets=["diabetes"])
    result = module.run(args)
    assert set(result) == {"diabetes/NUTS", "diabetes/SGLD", "diabetes/SGHMC"}
    assert result["diabetes/NUTS"]["ratio"] == 1.0 and result["diabetes/NUTS"]["nll_diff"] == 0.0
    assert all(math.isfinite(r["ratio"]) and math.isfinite(r["fs_rhat"]) for r in result.values())
    assert (tmp_path / "realdata_nuts.md").read_text().count("| diabetes |") == 3
    assert (tmp_path / "nuts_diabetes.pt").exists()  # NUTS is cached for the next run


def test_realdata_nuts_records_a_diverged_default_and_goes_on(tmp_path, monkeypatch):
    from pyro_sdebnn.infer.mcmc.diagnostics import SamplerDivergenceError

    module, args = _args("realdata-nuts", tmp_path, datasets=["diabetes"], methods=["SGHMC", "SGLD"])
    real = module._sgmcmc

    def sgmcmc(kernel_cls, *rest):
        if kernel_cls.__name__ == "SGHMC":
            raise SamplerDivergenceError("SGHMC chain 1: diverged at inner step 7 (step size 0.1): energy rose")
        return real(kernel_cls, *rest)

    monkeypatch.setattr(module, "_sgmcmc", sgmcmc)
    result = module.run(args)
    assert result["diabetes/SGHMC"]["met"] is False and math.isnan(result["diabetes/SGHMC"]["ratio"])
    assert math.isfinite(result["diabetes/SGLD"]["ratio"])  # the run went on after the divergence
    assert "| diabetes | SGHMC | nan |" in (tmp_path / "realdata_nuts.md").read_text()
    assert "diverged: diverged at inner step 7 (step size 0.1)" in (tmp_path / "realdata_nuts.md").read_text()


def test_realdata_nuts_reuses_the_reference_of_nuts_seed(tmp_path, monkeypatch):
    # --nuts-seed 0: a run of another --seed compares its chains with the cached seed-0 NUTS reference
    pytest.importorskip("sklearn")
    module, args = _args("realdata-nuts", tmp_path, datasets=["diabetes"], methods=["NUTS"])
    module.run(args)
    calls = []
    reference = torch.load(tmp_path / "nuts_diabetes.pt", weights_only=True)["samples"]
    monkeypatch.setattr(module, "_nuts", lambda *a: calls.append(a) or reference)
    args.seed, args.nuts_seed = 1, 0
    module.run(args)
    assert calls == [] and "| diabetes | NUTS |" in (tmp_path / "realdata_nuts.md").read_text()
    assert "cached" in (tmp_path / "realdata_nuts.md").read_text()
    args.nuts_seed = None  # the default: NUTS of --seed, not cached yet
    module.run(args)
    assert len(calls) == 1 and calls[0][-1] == 1


def test_realdata_nuts_recomputes_an_unreadable_cache(tmp_path, monkeypatch):
    # a cache left truncated (Ctrl-C during its write) or another file of that name made every later run fail in
    # torch.load; it is computed again and replaced, and written atomically
    pytest.importorskip("sklearn")
    module, args = _args("realdata-nuts", tmp_path, datasets=["diabetes"], methods=["NUTS"])
    module.run(args)
    good = (tmp_path / "nuts_diabetes.pt").read_bytes()
    reference, calls = torch.load(tmp_path / "nuts_diabetes.pt", weights_only=True)["samples"], []
    monkeypatch.setattr(module, "_nuts", lambda *a: calls.append(a) or reference)
    for bad in (good[: len(good) // 2], b"not a cache", None):
        if bad is None:
            torch.save([1, 2], tmp_path / "nuts_diabetes.pt")  # readable, but not a cache
        else:
            (tmp_path / "nuts_diabetes.pt").write_bytes(bad)
        module.run(args)
        assert torch.load(tmp_path / "nuts_diabetes.pt", weights_only=True)["samples"].keys()
    assert len(calls) == 3 and sorted(p.name for p in tmp_path.glob("nuts_*")) == ["nuts_diabetes.pt"]
    module.run(args)  # the rewritten cache is used
    assert len(calls) == 3 and "cached" in (tmp_path / "realdata_nuts.md").read_text()


def test_realdata_nuts_num_steps_sets_the_inner_steps_per_draw(tmp_path, monkeypatch):
    pytest.importorskip("sklearn")
    module, args = _args("realdata-nuts", tmp_path, datasets=["diabetes"], methods=["NUTS", "SGLD"])
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    with pytest.raises(SystemExit):  # a count of steps: a positive integer
        parser.parse_args(["--num-steps", "0"])
    assert parser.parse_args(["--num-steps", "3"]).num_steps == 3
    seen = []
    real = module._sgmcmc
    monkeypatch.setattr(module, "_sgmcmc", lambda cls, model, x, y, s, seed: seen.append(s["num_steps"])
                        or real(cls, model, x, y, s, seed))
    args.num_steps = 3
    module.run(args)
    assert seen == [3] and "3 inner steps per draw" in (tmp_path / "realdata_nuts.md").read_text()
    args.num_steps = None  # the default: the protocol's (2 in the quick mode)
    module.run(args)
    assert seen == [3, 2] and "2 inner steps per draw" in (tmp_path / "realdata_nuts.md").read_text()


def test_realdata_nuts_passes_the_kernel_settings_and_notes_step_halvings(tmp_path, monkeypatch):
    pytest.importorskip("sklearn")
    module, args = _args("realdata-nuts", tmp_path, datasets=["diabetes"], methods=["SGLD", "SGHMC"],
                         integrator="euler", warmup_step_factor=1.5)
    real, kernels = module._sgmcmc, {}

    def sgmcmc(*a, **settings):
        samples, notes, kernel = real(*a, **settings)
        kernels[type(kernel).__name__] = kernel
        kernel.divergence_log.append({"halved": True})  # as the warm-up's step search records a halving
        return samples, notes, kernel

    monkeypatch.setattr(module, "_sgmcmc", sgmcmc)
    module.run(args)
    assert kernels["SGLD"].integrator == "euler"  # SGLD's noise only: SGHMC has none to choose
    assert kernels["SGLD"].warmup_step_factor == kernels["SGHMC"].warmup_step_factor == 1.5
    assert (tmp_path / "realdata_nuts.md").read_text().count("step halved 1x in warm-up") == 2
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--warmup-step-factor", "4"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--integrator", "rk4"])
