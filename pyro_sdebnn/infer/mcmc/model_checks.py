# SPDX-License-Identifier: Apache-2.0
"""What :class:`~pyro_sdebnn.infer.mcmc.MinibatchPotential` checks in a model and its data before sampling.

The data are finite and inside the support of their likelihood (else a ``ValueError`` names the argument or site: a
data problem, not a divergence of the sampler); the latent sites are sampled outside the data plates under
subsampling; and the plates over the data are found (the plate containing every observed site, else each observed
site's own plate) with their sizes :math:`N_p` and minibatch sizes :math:`b_p`.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample
from torch import Tensor
from torch.utils._pytree import tree_flatten


def _check_subsample_size(subsample_size: Any) -> None:
    """``subsample_size`` is ``None``, a positive int (every data plate) or a dict ``{plate name: positive int}``."""

    def positive_int(value: Any) -> bool:
        return not isinstance(value, bool) and isinstance(value, int) and value >= 1

    if subsample_size is None or positive_int(subsample_size):
        return
    if isinstance(subsample_size, Mapping):
        for name, value in subsample_size.items():
            if not isinstance(name, str):
                raise TypeError(f"subsample_size: plate names must be str, got {type(name).__name__}")
            if not positive_int(value):
                raise ValueError(f"subsample_size['{name}'] must be a positive int, got {value!r}")
        if not subsample_size:
            raise ValueError("subsample_size must name at least one plate (an empty dict subsamples nothing)")
        return
    raise ValueError(
        f"subsample_size must be a positive int (every data plate), a dict {{plate name: positive int}} or None, got "
        f"{subsample_size!r}"
    )


def _data_plate_names(data_plate: Any) -> Optional[tuple[str, ...]]:
    if data_plate is None:
        return None
    if isinstance(data_plate, str):
        return (data_plate,)
    if isinstance(data_plate, Sequence) and data_plate and all(isinstance(p, str) for p in data_plate):
        return tuple(dict.fromkeys(data_plate))
    raise TypeError(f"data_plate must be a str, a non-empty sequence of str or None, got {data_plate!r}")


def _argument_names(model: Callable, num_args: int) -> list[str]:
    """Names of the first ``num_args`` positional parameters of ``model`` (``args[i]`` where unknown)."""
    fn = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [
        p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    return [positional[i] if i < len(positional) else f"args[{i}]" for i in range(num_args)]


def _first_bad(mask: Tensor, what: str) -> str:
    """``"<count> <what>, the first at index <index>"`` for a boolean mask of bad entries."""
    count = f"{int(mask.sum())} {what}"
    return f"{count}, the first at index {tuple(int(i) for i in mask.nonzero()[0])}" if mask.dim() else count


def _check_finite_arguments(model: Callable, args: tuple, kwargs: dict) -> None:
    """A non-finite entry in a floating-point tensor argument of the model is a data problem, named here."""
    names = _argument_names(model, len(args))
    named = list(zip(names, args)) + list(kwargs.items())
    for name, arg in named:
        leaves, _ = tree_flatten(arg)
        for k, leaf in enumerate(leaves):
            if not (torch.is_tensor(leaf) and (leaf.is_floating_point() or leaf.is_complex())):
                continue
            bad = ~torch.isfinite(leaf.detach())
            if bool(bad.any()):
                where = f"'{name}'" if len(leaves) == 1 else f"'{name}' (its tensor {k})"
                raise ValueError(
                    f"data problem: model argument {where} has "
                    + _first_bad(bad, "non-finite value(s) (NaN or Inf)")
                    + ". SG-MCMC needs finite data: remove or impute these entries (a non-finite datum makes the "
                    "potential or its gradient non-finite, which the sampler could only report as a divergence)."
                )


def _is_deterministic(site: dict) -> bool:
    return bool(site["infer"].get("_deterministic", False)) if site.get("infer") else False


def _plates_of(site: dict) -> set[str]:
    return {f.name for f in site["cond_indep_stack"] if f.vectorized}


def _is_factor(site: dict) -> bool:
    """A ``pyro.factor`` site (an observed ``Unit`` distribution): a log-density term, not data."""
    return bool(site.get("infer") and site["infer"].get("is_auxiliary")) or type(site["fn"]).__name__ == "Unit"


def _check_observed_values(trace: Any, observed_sites: Sequence[str]) -> None:
    """An observed value that is not finite, or outside the support of its distribution, is a data problem."""
    for name in observed_sites:
        site = trace.nodes[name]
        if _is_factor(site):
            continue
        value = site["value"]
        if not torch.is_tensor(value):
            continue
        value = value.detach()
        if value.is_floating_point() or value.is_complex():
            bad = ~torch.isfinite(value)
            if bool(bad.any()):
                raise ValueError(
                    f"data problem: observed site '{name}' has "
                    + _first_bad(bad, "non-finite value(s) (NaN or Inf)")
                    + ". SG-MCMC needs finite data: remove or impute these entries (or mask them out of the "
                    "likelihood with `obs_mask`/`poutine.mask` and replace them by any finite value)."
                )
        try:
            inside = site["fn"].support.check(value)
        except Exception:  # noqa: BLE001 - a support that cannot be checked (dependent, unknown): not our data check
            continue
        if torch.is_tensor(inside) and not bool(inside.all()):
            raise ValueError(
                f"data problem: observed site '{name}' has "
                + _first_bad(~inside, "value(s) outside the support of its distribution")
                + f" ({site['fn'].support}). Check the data (labels, counts, encoding) against the likelihood."
            )


def _trace_explained(model: Callable, args: tuple, kwargs: dict, data_plates: Optional[Sequence[str]] = None) -> Any:
    """Trace ``model``; if it fails, explain the usual cause (weights sampled inside the data plate)."""
    tracer = poutine.trace(model)
    try:
        return tracer.get_trace(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - re-raised with an explanation or unchanged
        _check_latents_outside_plate(tracer.msngr.trace, data_plates, cause=e)
        raise


_PYROSAMPLE_HINT = (
    "With a PyroModule, PyroSample weights are drawn on first access, so call the network (or touch its weights) "
    "before entering `with pyro.plate('data', N) as idx:`."
)


def _check_latents_outside_plate(
    trace: Any, data_plates: Optional[Sequence[str]], cause: Optional[Exception] = None
) -> None:
    """Under subsampling, no latent site may be sampled inside a subsampled data plate."""
    plates = set()
    for site in trace.nodes.values():
        # on a failed trace the observed sites may not have been reached: then every plate is suspect
        if site["type"] == "sample" and (site["is_observed"] or cause is not None):
            plates |= _plates_of(site)
    if data_plates is not None:
        plates = set(data_plates)
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site["is_observed"] or site_is_subsample(site):
            continue
        inside = _plates_of(site) & plates
        if not inside:
            continue
        plate = sorted(inside)[0]
        if cause is not None:  # the model failed: typically weights drawn inside the plate get a batch dimension
            raise ValueError(
                f"Latent site '{name}' is sampled inside the data plate '{plate}' and the model then failed. Network "
                "weights must be sampled outside the plate over the data: inside it they get a batch dimension (one "
                f"weight per data point) and, under subsampling, a prior scaled by N/b. {_PYROSAMPLE_HINT}"
            ) from cause
        raise ValueError(
            f"Latent site '{name}' is sampled inside the data plate '{plate}' (one value per data point): it is a "
            "local latent variable, and local latent variables are not supported by the SG-MCMC kernels under "
            "subsampling (a minibatch step would see only the values of its minibatch, with their prior scaled by "
            "N/b). To fix it: marginalise it out of the likelihood (e.g. a Normal random effect added to a Normal "
            "likelihood widens its variance); or, if it is a global parameter such as network weights, sample it "
            f"outside the plate ({_PYROSAMPLE_HINT}); or sample without subsampling (subsample_size=None: the kernel "
            "then updates it jointly with the other latent sites); or use SVI or NUTS, which handle local latent "
            "variables."
        )


def find_data_plates(
    trace: Any, observed_sites: Sequence[str], names: Optional[tuple[str, ...]], subsample_size: Any
) -> tuple[tuple[str, ...], dict[str, int], dict[str, int]]:
    """The plates over the data (``data_plate=`` or detected), their sizes and the minibatch size of each subsampled
    one (``subsample_size=``), checked against the model's plates."""
    frames: dict[str, Any] = {}
    for site in trace.nodes.values():
        if site["type"] == "sample":
            for f in site["cond_indep_stack"]:
                if f.vectorized:
                    frames.setdefault(f.name, f)
    subsampled = subsample_size is not None
    requested = dict(subsample_size) if isinstance(subsample_size, Mapping) else None
    for name in names or ():
        if name not in frames:
            raise ValueError(f"data_plate '{name}' is not a plate of the model (plates: {sorted(frames)})")
    for name in requested or ():
        if name not in frames:
            raise ValueError(f"subsample_size: '{name}' is not a plate of the model (plates: {sorted(frames)})")
    if names is None:
        names = tuple(requested) if requested is not None else detect_data_plates(trace, observed_sites, subsampled)
    elif requested is not None:
        missing = [p for p in requested if p not in names]
        if missing:
            raise ValueError(
                f"subsample_size names plate(s) {missing}, which are not among the data plates {list(names)} "
                "given as data_plate="
            )
    if subsampled and not names:
        raise ValueError(
            "subsample_size was given but the model has no plate over the data. Put the likelihood in "
            "`with pyro.plate('data', len(x)) as idx:` and index the data with idx (obs=y[idx]); the kernel "
            "then draws the minibatch indices. (pyro.factor terms and observations outside every plate are "
            "fine: they are full-data terms.)"
        )
    sizes: dict[str, int] = {}
    for name in names:
        sub = trace.nodes.get(name)
        if sub is not None and sub["fn"].subsample_size is not None and sub["fn"].subsample_size < sub["fn"].size:
            raise ValueError(
                f"the model's plate '{name}' already subsamples (subsample_size={sub['fn'].subsample_size}). "
                "Subsampling is a kernel setting: remove subsample_size from the model's plate and pass "
                "subsample_size= to the kernel, so that ArviZ and Predictive see the full data."
            )
        sizes[name] = int(frames[name].size if sub is None else sub["fn"].size)
    if requested is not None:
        batch = {name: requested[name] for name in names if name in requested}
    elif subsampled:
        batch = {name: int(subsample_size) for name in names}
    else:
        batch = {}
    for name, b in batch.items():
        if b > sizes[name]:
            hint = "; pass a dict {plate name: size} to subsample each plate differently" if len(names) > 1 else ""
            raise ValueError(f"subsample_size={b} exceeds the data size {sizes[name]} of plate '{name}'{hint}")
    return tuple(names), sizes, batch


def detect_data_plates(trace: Any, observed_sites: Sequence[str], subsampled: bool) -> tuple[str, ...]:
    """The plate that contains every observed site in a plate; else the plate of each observed site (a site in
    several plates takes the one of them that is another site's only plate). Observed sites outside every plate
    (``pyro.factor``, a likelihood over all the data at once) are full-data terms."""
    order: dict[str, int] = {}
    for site in trace.nodes.values():
        if site["type"] == "sample":
            for f in site["cond_indep_stack"]:
                if f.vectorized:
                    order.setdefault(f.name, len(order))
    plated = {n: _plates_of(trace.nodes[n]) for n in observed_sites}
    plated = {n: p for n, p in plated.items() if p}
    if not plated:
        return ()
    common = set.intersection(*plated.values())
    if len(common) == 1:
        return tuple(common)
    singles = {next(iter(p)) for p in plated.values() if len(p) == 1}
    names = set(singles)
    for site, plates in plated.items():
        if len(plates) == 1:
            continue
        candidates = plates & singles
        if len(candidates) != 1:
            if not subsampled:
                return ()  # full-batch gradients do not need to know the plates over the data
            raise ValueError(
                f"observed site '{site}' sits in several plates {sorted(plates)}: pass data_plate= (a plate name "
                "or a list of names) to say which are over the data, or subsample_size={plate name: size} to "
                "name the subsampled plates and their minibatch sizes"
            )
        names |= candidates
    return tuple(sorted(names, key=order.__getitem__))
