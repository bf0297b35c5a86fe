# SPDX-License-Identifier: Apache-2.0
"""From SG-MCMC samples to ArviZ, predictions, function-space diagnostics and files on disk.

- :func:`get_samples`: samples of a finished :class:`pyro.infer.MCMC` run with vectorised chains as chains
  (``(chains, draws, ...)``) or flattened (``(chains * draws, ...)``). ``MCMC`` itself stores a kernel's
  ``vectorized_chains=K`` as ``K`` chains, so ``mcmc.get_samples()``, ``Predictive`` and ``mcmc.summary()`` (R-hat
  over the chains) work on them unchanged.
- ``pointwise_log_likelihood``: :math:`\\log p(y_i | \\theta_s)` on the *full* data for every draw, vectorised
  over draws when the model allows it, else draw by draw (models built from ``nn.Linear`` inside a
  ``PyroModule`` do not vectorise, nor does a likelihood written as ``x @ w``; ``arviz.from_pyro`` then drops the
  log-likelihood group, with only a ``UserWarning``, and ``az.loo`` has nothing to work on).
- :func:`to_inference_data`: ``arviz.InferenceData`` with posterior, divergences and a log-likelihood that always works,
  so that ``az.loo``/``az.waic`` apply.
- :func:`posterior_prediction`: the predictive of the samples as a
  :class:`~pyro_sdebnn.predictive.ClassificationPrediction` or
  :class:`~pyro_sdebnn.predictive.RegressionPrediction`, read from the likelihood site of the model.
- :func:`function_space_diagnostics`: ESS and split R-hat of the *predictions* at given inputs (weight-space
  ESS/R-hat are uninformative for networks: symmetries and near-flat directions).
- :class:`SampleWriter` / :func:`load_samples`: stream the samples of large networks to disk.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Union

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.ops.stats import effective_sample_size, split_gelman_rubin
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from pyro_sdebnn.data.loaders import batch_length, dataset_size, iter_model_batches
from pyro_sdebnn.infer.mcmc.potential import in_dataset_order, is_data_loader
from pyro_sdebnn.predictive import ClassificationPrediction, RegressionPrediction

__all__ = [
    "SampleWriter",
    "function_space_diagnostics",
    "get_samples",
    "load_samples",
    "posterior_prediction",
    "to_inference_data",
]


def _vectorized_chains(mcmc: Any) -> int:
    return int(getattr(mcmc.kernel, "vectorized_chains", 1))


def get_samples(mcmc: Any, *, group_by_chain: bool = False) -> dict[str, Tensor]:
    """Posterior samples of a finished ``MCMC`` run, with vectorised chains treated as chains.

    With ``vectorized_chains=K``, ``MCMC`` already stores the ``num_chains * K`` chains as chains (the kernel's
    ``transforms`` lay them out so), and this is ``mcmc.get_samples(group_by_chain=group_by_chain)``; samples stored
    with the vectorised chains as a site dimension ``(num_chains, num_samples, K, *shape)`` (``MCMC`` given its own
    ``transforms=``) are laid out the same way. Chain ``c * K + k`` is vectorised chain ``k`` of ``MCMC``'s chain
    ``c``; flattened, the draws come chain after chain.

    :param mcmc: a :class:`pyro.infer.MCMC` that has run.
    :param bool group_by_chain: return ``(chains, draws, *shape)`` instead of ``(chains * draws, *shape)``.
    :rtype: dict

    >>> import pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_sdebnn.infer.mcmc import SGLD
    >>> def model():
    ...     pyro.sample("z", dist.Normal(0.0, 1.0))
    >>> import warnings
    >>> from pyro_sdebnn.infer.mcmc.diagnostics import SamplerWarning
    >>> mcmc = MCMC(SGLD(model, step_size=0.1, vectorized_chains=3), num_samples=5, warmup_steps=0,
    ...             disable_progbar=True)
    >>> with warnings.catch_warnings():  # 5 draws per chain cannot mix: the kernel would warn about R-hat
    ...     warnings.simplefilter("ignore", SamplerWarning)
    ...     mcmc.run()
    >>> get_samples(mcmc, group_by_chain=True)["z"].shape
    torch.Size([3, 5])
    >>> mcmc.get_samples()["z"].shape  # what Predictive(model, mcmc.get_samples()) reads: 3 x 5 draws
    torch.Size([15])
    """
    samples = mcmc.get_samples(group_by_chain=True)  # (C * K, S, *shape), or (C, S, K, *shape)
    k = _vectorized_chains(mcmc)
    if k > 1 and samples and next(iter(samples.values())).shape[0] == mcmc.num_chains:
        samples = {name: v.transpose(1, 2).flatten(0, 1) for name, v in samples.items()}  # (C * K, S, *shape)
    if not group_by_chain:
        samples = {name: v.flatten(0, 1) for name, v in samples.items()}
    return samples


def _kernel_diagnostics(mcmc: Any) -> dict[str, dict[str, Any]]:
    """The kernel's diagnostics of every chain, keyed as ``mcmc.diagnostics()`` keys them (``{name: {"chain c":
    value}}``), without the ESS and split R-hat of every site that ``MCMC.diagnostics()`` computes first: split R-hat
    needs at least 4 draws per chain (Pyro asserts it), and the export reads none of them."""
    per_chain = getattr(mcmc, "_diagnostics", None)  # what MCMC.diagnostics() adds to the ESS / R-hat table
    if not isinstance(per_chain, list) or not all(isinstance(d, dict) for d in per_chain):
        return mcmc.diagnostics()  # another MCMC front end
    names = per_chain[0] if per_chain else {}
    return {name: {f"chain {c}": d[name] for c, d in enumerate(per_chain)} for name in names}


def _diverging(mcmc: Any, num_chains: int, num_draws: int) -> Tensor:
    """``(chains, draws)`` bool: which post-warm-up draw of which chain (vectorised chains included) diverged.

    ``mcmc.diagnostics()`` keys its per-chain entries ``"chain 0"``, ..., ``"chain 10"``: they are read in numeric
    order (a string sort puts ``"chain 10"`` before ``"chain 2"``). The kernel's ``"divergence log"`` names the
    vectorised chain of every divergence and its draws (the restart, and a ``"bad draw"`` returned before the check
    saw its state); without it (another kernel) a divergence marks the draw of all the vectorised chains of that
    ``MCMC`` chain.
    """
    diverging = torch.zeros(num_chains, num_draws, dtype=torch.bool)
    diag = _kernel_diagnostics(mcmc)
    k = num_chains // mcmc.num_chains
    divergences, logs = diag.get("divergences", {}), diag.get("divergence log", {})
    for c in range(mcmc.num_chains):
        key = f"chain {c}"
        if key in logs:
            for record in logs[key]:
                if record.get("warmup", False):
                    continue
                for j in (record["sample"], record.get("bad draw")):  # the restart, and a draw returned too early
                    if j is not None and 0 <= j < num_draws:
                        diverging[c * k + int(record["chain"]), j] = True
        else:
            for j in divergences.get(key, []):
                diverging[c * k : (c + 1) * k, j] = True
    return diverging


def _observed_sites(trace: Any, exclude: Any = ()) -> list[str]:
    return [
        name
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and site["is_observed"]
        and name not in exclude
        and not site_is_subsample(site)
        and not site["infer"].get("_deterministic", False)
    ]


def _per_draw_traces(model: Callable, samples: dict[str, Tensor], args: tuple, kwargs: dict):
    num_draws = next(iter(samples.values())).shape[0]
    for s in range(num_draws):
        with poutine.block(), torch.no_grad():
            yield poutine.trace(poutine.condition(model, {k: v[s] for k, v in samples.items()})).get_trace(
                *args, **kwargs
            )


def pointwise_log_likelihood(
    model: Callable, samples: dict[str, Tensor], *args: Any, vectorize: Optional[bool] = None, **kwargs: Any
) -> dict[str, Tensor]:
    """:math:`\\log p(y_i | \\theta_s)` for every observed site, shape ``(S, *batch_shape)``, on the given data.

    :param callable model: the Pyro model.
    :param dict samples: constrained posterior samples, each ``(S, *site_shape)``.
    :param args: model arguments (the full data), or a loader alone: the model then runs on every batch of one
        pass over the loader's data set *in data-set order* (``in_dataset_order``: no shuffling, no dropped last
        batch), called as ``pyro_sdebnn.data.loaders.batch_arguments`` says (``model(*batch)`` for a tuple
        batch, ``model(**batch)`` for a dict, ``model(batch)`` for a tensor; ``kwargs`` added), and the
        log-likelihoods are concatenated along the data dimension (all :math:`N` points, entry ``i`` being
        ``loader.dataset[i]``; the batches go to the samples' device one at a time).
    :param bool vectorize: ``True`` uses :class:`pyro.infer.Predictive`'s vectorised trace, ``False`` runs the
        model draw by draw, ``None`` (default) tries the former and falls back to the latter.
    :rtype: dict

    >>> import pyro.distributions as dist
    >>> def model(x, y=None):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)):
    ...         pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)
    >>> ll = pointwise_log_likelihood(model, {"w": torch.zeros(4)}, torch.ones(3), torch.zeros(3))
    >>> ll["y"].shape
    torch.Size([4, 3])
    """
    if len(args) == 1 and is_data_loader(args[0]):
        return _loader_log_likelihood(model, samples, args[0], vectorize, kwargs)[1]
    return _log_likelihood_and_observed(model, samples, args, kwargs, vectorize)[0]


def _log_likelihood_and_observed(
    model: Callable, samples: dict[str, Tensor], args: tuple, kwargs: dict, vectorize: Optional[bool]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``pointwise_log_likelihood`` and the observed values, read from the same traces."""
    num_draws = next(iter(samples.values())).shape[0]
    if vectorize is not False:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                predictive = pyro.infer.Predictive(model, samples)
                with torch.no_grad():
                    trace = predictive.get_vectorized_trace(*args, **kwargs)
            out, observed = {}, {}
            for name in _observed_sites(trace, samples):
                site = trace.nodes[name]
                log_p = site["fn"].log_prob(site["value"])
                if log_p.dim() == 0 or log_p.shape[0] != num_draws:
                    raise ValueError("vectorised log-likelihood lacks the draw dimension")
                out[name] = log_p.detach()
                observed[name] = site["value"].detach()
            if out:
                return out, observed
            raise ValueError("no observed sites in the vectorised trace")
        except Exception:  # noqa: BLE001 - non-vectorisable model: fall back to draw by draw
            if vectorize:
                raise
    per_site: dict[str, list[Tensor]] = {}
    observed = {}
    for trace in _per_draw_traces(model, samples, args, kwargs):
        for name in _observed_sites(trace, samples):
            site = trace.nodes[name]
            per_site.setdefault(name, []).append(site["fn"].log_prob(site["value"]).detach())
            observed.setdefault(name, site["value"].detach())
    if not per_site:
        raise ValueError("the model has no observed sites under these arguments; pass the observations")
    return {k: torch.stack(v) for k, v in per_site.items()}, observed


def _loader_log_likelihood(
    model: Callable, samples: dict[str, Tensor], loader: Any, vectorize: Optional[bool], kwargs: dict
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The observed values and the pointwise log-likelihood over one pass of ``loader`` in data-set order
    (``in_dataset_order``, every batch of the loader's size, the overlap of the
    last one dropped), batch by batch (each batch traced once for both), concatenated along the data
    dimension. Torch's random state is left unchanged (a loader's workers draw their seeds from it)."""
    like = next(iter(samples.values()))
    observed: dict[str, list[Tensor]] = {}
    ll: dict[str, list[Tensor]] = {}
    size, seen = dataset_size(loader), 0
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for args, kw in iter_model_batches(in_dataset_order(loader, full_batches=True), like.device, like.dtype,
                                           kwargs=kwargs):
            batch_ll, batch_observed = _log_likelihood_and_observed(model, samples, args, kw, vectorize)
            new = min(batch_length(args, kw), size - seen)  # the last batch overlaps the one before: its new points
            seen += new
            for name, value in batch_observed.items():
                observed.setdefault(name, []).append(value[value.shape[0] - new :].cpu())
            for name, value in batch_ll.items():
                ll.setdefault(name, []).append(value[:, value.shape[1] - new :])
    return {k: torch.cat(v) for k, v in observed.items()}, {k: torch.cat(v, 1) for k, v in ll.items()}


def to_inference_data(mcmc: Any, *, log_likelihood: bool = True, **kwargs: Any) -> Any:
    """``arviz.InferenceData`` of a finished ``MCMC`` run of an SG-MCMC kernel.

    Posterior (vectorised chains as ArviZ chains), ``sample_stats.diverging`` (each divergence on the chain that
    diverged, vectorised chains included), ``observed_data`` and the pointwise log-likelihood on the full data
    passed to ``mcmc.run`` (for ``az.loo``/``az.waic``), computed draw by draw when the model does not vectorise.
    For a run over a loader (``mcmc.run(loader)``) both are read in one pass over ``loader.dataset`` in data-set
    order, whatever the loader's shuffling
    (``in_dataset_order``): the last axis of ``observed_data`` and
    ``log_likelihood`` is the index of the data point in the data set, as for the tensors of the data set.
    Prefer it to ``arviz.from_pyro``, which drops the log-likelihood of models that do not vectorise over draws,
    sizes ``sample_stats`` by ``MCMC``'s ``num_chains`` (not the vectorised chains), orders 11 or more chains'
    divergences as strings (``"chain 10"`` before ``"chain 2"``) and fails with a bare ``AssertionError`` for a run
    of fewer than 4 draws per chain (it calls ``MCMC.diagnostics()``, whose split R-hat needs 4). This export reads
    the divergences without those diagnostics and works for any ``num_samples``; compute R-hat and ESS with ArviZ
    (``az.rhat``, ``az.ess``) on runs long enough for them.

    :param mcmc: a :class:`pyro.infer.MCMC` that has run.
    :param bool log_likelihood: include the ``log_likelihood`` group.
    :param kwargs: passed to ``arviz.from_dict`` (``coords``, ``dims``).

    >>> import pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_sdebnn.infer.mcmc import SGLD
    >>> def model(y):
    ...     z = pyro.sample("z", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(z, 1.0), obs=y)
    >>> kernel = SGLD(model, step_size=0.1, vectorized_chains=2)
    >>> mcmc = MCMC(kernel, num_samples=10, warmup_steps=0, disable_progbar=True)
    >>> import warnings
    >>> from pyro_sdebnn.infer.mcmc.diagnostics import SamplerWarning
    >>> with warnings.catch_warnings():  # 10 draws per chain cannot mix: the kernel would warn about R-hat
    ...     warnings.simplefilter("ignore", SamplerWarning)
    ...     mcmc.run(torch.zeros(3))
    >>> idata = to_inference_data(mcmc)
    >>> idata.log_likelihood["y"].shape
    (2, 10, 3)
    """
    import arviz as az

    samples = get_samples(mcmc, group_by_chain=True)
    num_chains, num_draws = next(iter(samples.values())).shape[:2]
    posterior = {k: v.detach().cpu().numpy() for k, v in samples.items()}
    diverging = _diverging(mcmc, num_chains, num_draws)
    groups: dict[str, Any] = {"posterior": posterior, "sample_stats": {"diverging": diverging.numpy()}}
    args: tuple = mcmc._args or ()
    kw: dict = mcmc._kwargs or {}
    model = mcmc.kernel.model
    flat = {k: v.flatten(0, 1) for k, v in samples.items()}
    observed: dict[str, Any]  # site name -> numpy array
    ll: Optional[dict[str, Tensor]]
    if len(args) == 1 and is_data_loader(args[0]):  # mcmc.run(loader): one pass over the loader gives all N points
        observed_tensors, ll = _loader_log_likelihood(model, flat, args[0], None, kw)
        observed = {n: v.numpy() for n, v in observed_tensors.items()}
    else:
        with poutine.block(), torch.no_grad():
            trace = poutine.trace(model).get_trace(*args, **kw)
        observed = {n: trace.nodes[n]["value"].detach().cpu().numpy() for n in _observed_sites(trace)}
        ll = None
    if observed:
        groups["observed_data"] = observed
    if log_likelihood and observed:
        if ll is None:
            ll = pointwise_log_likelihood(model, flat, *args, **kw)
        groups["log_likelihood"] = {
            n: v.reshape((num_chains, num_draws) + v.shape[1:]).cpu().numpy() for n, v in ll.items()
        }
    with warnings.catch_warnings():
        # ArviZ guesses a transposed array when a run has fewer draws than chains; these are (chains, draws, ...)
        warnings.filterwarnings("ignore", message=r"More chains \(\d+\) than draws", category=UserWarning)
        return az.from_dict(**groups, **kwargs)


def _unwrap(fn: Any) -> Any:
    while not isinstance(fn, (dist.Normal, dist.Bernoulli, dist.Categorical)) and hasattr(fn, "base_dist"):
        fn = fn.base_dist
    return fn


def posterior_prediction(
    model: Callable, samples: dict[str, Tensor], *args: Any, obs_site: Optional[str] = None, **kwargs: Any
) -> Union[ClassificationPrediction, RegressionPrediction]:
    """The posterior predictive of the samples at new inputs, read from the model's likelihood site.

    The model is run draw by draw on ``*args`` (e.g. ``x_test`` without targets); the distribution at the
    likelihood site gives the prediction: ``Bernoulli`` -> :class:`ClassificationPrediction` with two classes,
    ``Categorical`` -> :class:`ClassificationPrediction`, ``Normal`` -> :class:`RegressionPrediction`.

    :param callable model: the Pyro model.
    :param dict samples: constrained samples ``(S, *site_shape)`` (e.g. :func:`get_samples`).
    :param args: model arguments at the prediction inputs.
    :param str obs_site: name of the likelihood site (default: the only non-deterministic sample site inside a
        plate that is not a latent of ``samples``).

    >>> import pyro.distributions as dist
    >>> def model(x, y=None):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)):
    ...         return pyro.sample("y", dist.Bernoulli(logits=w * x), obs=y)
    >>> pred = posterior_prediction(model, {"w": torch.zeros(4)}, torch.ones(3))
    >>> pred.probs.shape
    torch.Size([4, 3, 2])
    """
    probs, locs, scales = [], [], []
    for trace in _per_draw_traces(model, samples, args, kwargs):
        name = obs_site
        if name is None:
            candidates = [
                n
                for n, s in trace.nodes.items()
                if s["type"] == "sample"
                and n not in samples
                and not s["infer"].get("_deterministic", False)
                and not site_is_subsample(s)
                and any(f.vectorized for f in s["cond_indep_stack"])
            ]
            if len(candidates) != 1:
                raise ValueError(f"cannot tell the likelihood site among {candidates}; pass obs_site=")
            name = candidates[0]
        if name not in trace.nodes:
            raise ValueError(f"obs_site '{name}' is not a site of the model")
        fn = _unwrap(trace.nodes[name]["fn"])
        if isinstance(fn, dist.Bernoulli):
            p = fn.probs
            probs.append(torch.stack([1 - p, p], -1))
        elif isinstance(fn, dist.Categorical):
            probs.append(fn.probs)
        elif isinstance(fn, dist.Normal):
            loc, scale = torch.broadcast_tensors(fn.loc, fn.scale)
            locs.append(loc)
            scales.append(scale)
        else:
            raise TypeError(
                f"likelihood site '{name}' has distribution {type(fn).__name__}; supported: Normal, Bernoulli, "
                "Categorical"
            )
    if probs:
        return ClassificationPrediction(torch.stack(probs).detach().reshape(len(probs), -1, probs[0].shape[-1]))
    return RegressionPrediction(
        torch.stack(locs).detach().reshape(len(locs), -1), torch.stack(scales).detach().reshape(len(locs), -1)
    )


def function_space_diagnostics(
    prediction: Union[ClassificationPrediction, RegressionPrediction, Tensor], num_chains: int
) -> dict[str, Tensor]:
    """ESS and split R-hat of the per-draw predictions (class probabilities or predictive means) per input.

    :param prediction: a prediction whose ``S`` draws are ``num_chains`` chains of equal length laid out chain
        after chain (as :func:`get_samples` flattens them), or a tensor ``(S, ...)``.
    :param int num_chains: number of chains (>= 2 for R-hat).
    :return: ``ess`` and ``r_hat`` per input (and class), plus ``ess_min``, ``ess_median``, ``r_hat_max``.

    >>> pred = RegressionPrediction(torch.randn(40, 5), torch.ones(40, 5))
    >>> out = function_space_diagnostics(pred, num_chains=2)
    >>> out["ess"].shape, out["r_hat"].shape
    (torch.Size([5]), torch.Size([5]))
    """
    if isinstance(prediction, ClassificationPrediction):
        values = prediction.probs
    elif isinstance(prediction, RegressionPrediction):
        values = prediction.loc
    elif isinstance(prediction, Tensor):
        values = prediction
    else:
        raise TypeError(f"prediction must be a prediction container or a Tensor, got {type(prediction).__name__}")
    if isinstance(num_chains, bool) or not isinstance(num_chains, int) or num_chains < 1:
        raise ValueError(f"num_chains must be a positive int, got {num_chains!r}")
    if values.shape[0] % num_chains:
        raise ValueError(f"{values.shape[0]} draws cannot be split into {num_chains} chains of equal length")
    grouped = values.reshape((num_chains, values.shape[0] // num_chains) + values.shape[1:]).double()
    ess = effective_sample_size(grouped, chain_dim=0, sample_dim=1)
    r_hat = split_gelman_rubin(grouped, chain_dim=0, sample_dim=1)
    return {
        "ess": ess,
        "r_hat": r_hat,
        "ess_min": ess.nan_to_num(nan=float("inf")).min(),
        "ess_median": ess.nanmedian(),
        "r_hat_max": r_hat.nan_to_num(nan=0.0).max(),
    }


# ----- samples on disk ------------------------------------------------------------------------------------------
class SampleWriter:
    """Write the post-warm-up samples of a kernel to ``directory`` in chunks of ``chunk_size`` samples.

    Pass it as ``sample_writer=`` to an SG-MCMC kernel, and ``save_params=[]`` to :class:`pyro.infer.MCMC` so that
    nothing is also kept in memory; read the samples back with :func:`load_samples`. Every chain (every
    ``setup``, also in worker processes) writes its own files ``chain-<pid>-<k>-<chunk>.pt`` of constrained values,
    moved to the CPU. A run stopped early (Ctrl-C, an error: ``MCMC`` then does not end the chain) leaves its last
    samples in the writer's buffer: :meth:`flush` writes them.

    :param directory: output folder (created if needed).
    :param int chunk_size: samples per file.

    >>> import tempfile, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_sdebnn.infer.mcmc import SGLD
    >>> def model():
    ...     pyro.sample("z", dist.LogNormal(0.0, 1.0))
    >>> folder = tempfile.mkdtemp()
    >>> mcmc = MCMC(SGLD(model, step_size=0.1, sample_writer=SampleWriter(folder, chunk_size=4)), num_samples=10,
    ...             warmup_steps=2, save_params=[], disable_progbar=True)
    >>> mcmc.run()
    >>> samples = load_samples(folder)
    >>> samples["z"].shape, bool((samples["z"] > 0).all())
    (torch.Size([1, 10]), True)
    """

    def __init__(self, directory: Union[str, Path], chunk_size: int = 100) -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.chunk_size = chunk_size
        self._chains = 0
        self._buffer: list[dict[str, Tensor]] = []
        self._chunk = 0
        self._prefix = ""

    def start_chain(self) -> None:
        self.flush()
        self._prefix = f"chain-{os.getpid()}-{self._chains:04d}"
        self._chains += 1
        self._chunk = 0

    def write(self, sample: dict[str, Tensor]) -> None:
        self._buffer.append({k: v.detach().to("cpu", copy=True) for k, v in sample.items()})
        if len(self._buffer) >= self.chunk_size:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        stacked = {k: torch.stack([s[k] for s in self._buffer]) for k in self._buffer[0]}
        torch.save(stacked, self.directory / f"{self._prefix}-{self._chunk:06d}.pt")
        self._chunk += 1
        self._buffer = []


def load_samples(directory: Union[str, Path]) -> dict[str, Tensor]:
    """Read the samples written by :class:`SampleWriter`: ``(chains, draws, *shape)`` per site.

    (Vectorised chains keep their chain dimension after ``draws``.)

    :raises ValueError: if the directory holds no sample file, or chains of different lengths.
    """
    directory = Path(directory)
    files = sorted(directory.glob("chain-*.pt"))
    if not files:
        raise ValueError(f"no sample files in {directory}")
    chains: dict[str, list[dict[str, Tensor]]] = {}
    for f in files:
        chains.setdefault(f.name.rsplit("-", 1)[0], []).append(torch.load(f, weights_only=True))
    per_chain = [{k: torch.cat([c[k] for c in chunks]) for k in chunks[0]} for _, chunks in sorted(chains.items())]
    lengths = {name: len(next(iter(c.values()))) for name, c in zip(sorted(chains), per_chain)}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"the chains in {directory} have different numbers of draws {lengths} (e.g. a run stopped "
                         "early, or runs of another num_samples into the same directory): give each run its own "
                         "directory, or load the files of one chain with torch.load")
    return {k: torch.stack([c[k] for c in per_chain]) for k in per_chain[0]}
