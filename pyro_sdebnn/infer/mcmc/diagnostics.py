# SPDX-License-Identifier: Apache-2.0
"""Checks of the SG-MCMC kernels: the model and its data before sampling, divergences while sampling, the run after.

- *Model and data* (at set-up, ``MinibatchPotential``): the data are finite and inside the support of their
  likelihood (else a ``ValueError`` names the argument or site: a data problem, not a divergence), the latent sites
  are sampled outside the subsampled data plates, and the plates over the data are found with their sizes
  :math:`N_p` and minibatch sizes :math:`b_p`.
- *Divergences* (once per returned sample, per chain): a non-finite state, potential or gradient, or an energy that
  leaves the typical set (below; ``energy_threshold``, applied by the kernel's ``_check_chains``). A flagged chain
  stops the run (:class:`SamplerDivergenceError`) or, with ``on_divergence="continue"``, restarts from its last
  healthy state.
- *The run* (at the end of ``MCMC.run``, ``RunChecks``): one :class:`SamplerWarning` per problem, as Stan prints
  them: a site whose split :math:`\\hat R` across the chains exceeds 1.1 (Gelman et al. [1]), a chain sitting at a
  support boundary for more than half of its draws, divergences.

The energy rule. A step size above the stability limit (:math:`\\eta > 4/\\lambda_{\\max}` for SGLD) makes the chain
grow geometrically long before it overflows. The energy :math:`E` of a sample is the potential at the start of its
last inner step (:math:`U + \\|v\\|^2/2` for SGHMC), which certifies the state the *previous* sample returned (a
restart goes back to the last certified state); a chain is flagged when

.. math::

    E > m + 20\\, s + T (D + 10) + 10^{-3} (|m| + 1),

with :math:`m` the smaller of the medians of its last 32 and of all its healthy energies (kept decimated to 128)
and :math:`s` the smaller of their median absolute deviations times 1.4826; before 8 samples, when
:math:`E > m + 100 (|m| + T (D + 10) + 1)` with :math:`m` the lowest energy so far. :math:`T (D + 10)` is twice the
mean excess :math:`T D / 2` of the energy over its minimum in a Gaussian posterior of dimension :math:`D`.

**References**

[1] Andrew Gelman, John B. Carlin, Hal S. Stern, David B. Dunson, Aki Vehtari, Donald B. Rubin (2013). "Bayesian Data
Analysis", 3rd edition, Chapman & Hall/CRC, Section 11.4.
"""

from __future__ import annotations

import math
import re
import sys
from types import FrameType
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch
from pyro import poutine
from pyro.infer.mcmc.api import MCMC
from pyro.poutine.util import site_is_subsample
from torch import Tensor
from torch.distributions.transforms import ComposeTransform

from pyro_sdebnn.data.loaders import _named

__all__ = ["SamplerDivergenceError", "SamplerWarning"]


# ----- the model and its data --------------------------------------------------------------------------------------
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
    raise ValueError(f"subsample_size must be a positive int (every data plate), a dict {{plate name: positive int}} "
                     f"or None, got {subsample_size!r}")


def _data_plate_names(data_plate: Any) -> Optional[tuple[str, ...]]:
    if data_plate is None:
        return None
    if isinstance(data_plate, str):
        return (data_plate,)
    if isinstance(data_plate, Sequence) and data_plate and all(isinstance(p, str) for p in data_plate):
        return tuple(dict.fromkeys(data_plate))
    raise TypeError(f"data_plate must be a str, a non-empty sequence of str or None, got {data_plate!r}")


def _first_bad(mask: Tensor, what: str) -> str:
    """``"<count> <what>, the first at index <index>"`` for a boolean mask of bad entries."""
    count = f"{int(mask.sum())} {what}"
    return f"{count}, the first at index {tuple(int(i) for i in mask.nonzero()[0])}" if mask.dim() else count


def _is_deterministic(site: dict) -> bool:
    return bool(site["infer"].get("_deterministic", False)) if site.get("infer") else False


def _plates_of(site: dict) -> set[str]:
    return {f.name for f in site["cond_indep_stack"] if f.vectorized}


def _is_factor(site: dict) -> bool:
    """A ``pyro.factor`` site (an observed ``Unit`` distribution): a log-density term, not data."""
    return bool(site.get("infer") and site["infer"].get("is_auxiliary")) or type(site["fn"]).__name__ == "Unit"


def _check_observed_values(trace: Any, observed_sites: Sequence[str]) -> None:
    """An observed value that is not finite, outside the support of its distribution, or paired with every prediction
    (:func:`_check_observed_shape`) is a data problem."""
    for name in observed_sites:
        site = trace.nodes[name]
        if _is_factor(site) or not torch.is_tensor(site["value"]):
            continue
        value = site["value"].detach()
        _check_observed_shape(name, site, value)
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


def _check_observed_shape(name: str, site: dict, value: Tensor) -> None:
    """A likelihood must not pair every observation with every prediction (``N^2`` log-likelihood terms): a value and
    a distribution whose shapes broadcast into a larger one than either (``y`` of shape ``(N, 1)`` against predictions
    of shape ``(N,)``), or a value broadcast along batch dimensions of size above 1 left of the site's plates
    (predictions ``(N, 1)`` inside ``pyro.plate("data", N)``, which Pyro expands to ``(N, N)``). A value that fills
    such a dimension itself (a ``(T, N)`` value in a plate of size ``N``) is valid."""
    fn = site["fn"]
    shape = fn.batch_shape + fn.event_shape
    try:
        joint = torch.broadcast_shapes(value.shape, shape)
    except RuntimeError:  # shapes that do not broadcast: the likelihood's own error says so
        return
    batch = joint[: len(joint) - len(fn.event_shape)]
    dims = [-f.dim for f in site["cond_indep_stack"] if f.vectorized and f.dim is not None]
    undeclared = batch[: max(0, len(batch) - max(dims))] if dims else ()
    paired = math.prod(joint) > value.numel()  # each observation meets several predictions
    if paired and (math.prod(joint) > math.prod(shape) or any(n != 1 for n in undeclared)):
        plates = ", ".join(f"'{f.name}' (dim {f.dim})" for f in site["cond_indep_stack"] if f.vectorized)
        raise ValueError(
            f"data problem: observed site '{name}' has a value of shape {tuple(value.shape)} and a distribution of "
            f"shape {tuple(shape)}" + (f" inside plate(s) {plates}" if plates else "") + f": {tuple(batch)} "
            "log-likelihood terms, every observation paired with every prediction (e.g. predictions of shape (N, 1) "
            "against targets of shape (N,), or the reverse). Give both the same shape (e.g. .squeeze(-1))."
        )


def _trace_explained(model: Callable, args: tuple, kwargs: dict, data_plates: Optional[Sequence[str]] = None) -> Any:
    """Trace ``model``; if it fails, explain the usual cause (weights sampled inside the data plate)."""
    tracer = poutine.trace(model)
    try:
        return tracer.get_trace(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - re-raised with an explanation or unchanged
        _check_latents_outside_plate(tracer.msngr.trace, data_plates, cause=e)
        _check_dtypes_agree(model, tracer.msngr.trace, args, kwargs, cause=e)
        raise


# torch's names of the integer dtypes in its dtype-mismatch errors ("mat1 and mat2 must have the same dtype, but got
# Byte and Float", "... but got: unsigned char != float", "Input type (unsigned char) and bias type (float) should be
# the same", "expected scalar type Byte but found Float")
_MISMATCH = re.compile(r"same dtype|should be the same|expected scalar type")
_INTEGER_NAMES = {
    torch.uint8: r"\bByte\b|unsigned char", torch.int8: r"\bChar\b|(?<!un)signed char",
    torch.int16: r"\bShort\b|short int", torch.int32: r"\bInt\b|(?<!long )(?<!short )\bint\b",
    torch.int64: r"\bLong\b|long int", torch.bool: r"\bBool\b|\bbool\b",
}


def _check_dtypes_agree(model: Callable, trace: Any, args: tuple, kwargs: dict, cause: Exception) -> None:
    """After a failed trace: data of another dtype than the latent sites drawn so far is named: floating-point data
    of another precision (float64 data and float32 priors, the usual ``mat1 and mat2 must have the same dtype`` deep
    in torch), and integer data that torch's error names (images stored as bytes)."""
    named = [(f"argument {name!r}", t) for name, t in _named(args, kwargs, model, unknown="args")
             if isinstance(t, Tensor)]
    data_dtypes = {arg_name: t.dtype for arg_name, t in named if t.is_floating_point()}
    text = str(cause)
    integers = [(arg_name, t.dtype) for arg_name, t in named
                if t.dtype in _INTEGER_NAMES and _MISMATCH.search(text) and re.search(_INTEGER_NAMES[t.dtype], text)]
    for site_name, site in trace.nodes.items():
        value = site.get("value")
        if site["type"] != "sample" or site["is_observed"] or not isinstance(value, Tensor) \
                or not value.is_floating_point():
            continue
        for arg_name, dtype in integers:
            raise TypeError(
                f"the model failed on integer data: the model's {arg_name} is {dtype}, latent site '{site_name}' is "
                f"{value.dtype} (torch: {text.splitlines()[0]}). Convert the data (.to({value.dtype})); pixels "
                "stored as bytes are usually also scaled to [0, 1], as torchvision's ToTensor() does."
            ) from cause
        for arg_name, dtype in data_dtypes.items():
            if dtype != value.dtype:
                raise TypeError(
                    f"the model failed on data of another dtype than its latent sites: the model's {arg_name} is "
                    f"{dtype}, latent site '{site_name}' is {value.dtype} (drawn from its prior). Convert the data "
                    f"(.to({value.dtype})) or build the priors in {dtype} (tensors of that dtype as their "
                    "parameters, or torch.set_default_dtype before building the model)."
                ) from cause
        return


_PYROSAMPLE_HINT = (
    "With a PyroModule, PyroSample weights are drawn on first access, so call the network (or touch its weights) "
    "before entering `with pyro.plate('data', N) as idx:`."
)


def _check_latents_outside_plate(trace: Any, data_plates: Optional[Sequence[str]],
                                 cause: Optional[Exception] = None) -> None:
    """Under subsampling, no latent site may be sampled inside a subsampled data plate."""
    if data_plates is not None:
        plates = set(data_plates)
    else:  # on a failed trace the observed sites may not have been reached: then every plate is suspect
        plates = {p for s in trace.nodes.values() if s["type"] == "sample" and (s["is_observed"] or cause is not None)
                  for p in _plates_of(s)}
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site["is_observed"] or site_is_subsample(site):
            continue
        inside = _plates_of(site) & plates
        if not inside:
            continue
        plate = sorted(inside)[0]
        if cause is not None:
            raise ValueError(
                f"Latent site '{name}' is sampled inside the data plate '{plate}' and the model then failed. Network "
                "weights must be sampled outside the plate over the data: inside it they get a batch dimension (one "
                f"weight per data point) and, under subsampling, a prior scaled by N/b. {_PYROSAMPLE_HINT}"
            ) from cause
        observed = name[: -len("_unobserved")] if name.endswith("_unobserved") else None
        if observed is not None and f"{observed}_observed" in trace.nodes:  # Pyro's obs_mask imputes the masked data
            raise ValueError(
                f"Latent site '{name}' holds the entries of '{observed}' that its obs_mask hides: Pyro imputes them "
                f"as latent variables inside the data plate '{plate}' (one per masked data point), and local latent "
                "variables are not supported by the SG-MCMC kernels under subsampling (a minibatch step would see "
                "only the values of its minibatch). To leave the masked entries out of the likelihood instead, "
                f"sample '{observed}' under pyro.poutine.mask(mask=...) in place of obs_mask=; or drop those data "
                "points; or sample without subsampling (subsample_size=None), which imputes them jointly with the "
                "other latent sites."
            )
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
    for label, given in (("data_plate ", names), ("subsample_size: ", requested)):
        for name in given or ():
            if name not in frames:
                raise ValueError(f"{label}'{name}' is not a plate of the model (plates: {sorted(frames)})")
    if names is None:
        names = tuple(requested) if requested is not None else detect_data_plates(
            trace, observed_sites, subsampled, list(frames))
    elif requested is not None:
        missing = [p for p in requested if p not in names]
        if missing:
            raise ValueError(f"subsample_size names plate(s) {missing}, which are not among the data plates "
                             f"{list(names)} given as data_plate=")
    if subsampled and not names and not observed_sites and frames:
        # the plate is there, but nothing in it is observed: typically mcmc.run(x) with y left out (obs=None)
        raise ValueError(
            f"subsample_size was given but the model observes no data: it has the plate(s) {sorted(frames)} but no "
            "site with obs= set (was the model run without its observations, e.g. mcmc.run(x) instead of "
            "mcmc.run(x, y)?). Without observations the kernel would sample the prior, with every obs=None site as "
            "a latent variable."
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


def detect_data_plates(trace: Any, observed_sites: Sequence[str], subsampled: bool,
                       order: list[str]) -> tuple[str, ...]:
    """The plate that contains every observed site in a plate; else the plate of each observed site (a site in
    several plates takes the one of them that is another site's only plate), in the order of ``order`` (the model's
    plates as the trace meets them). Observed sites outside every plate (``pyro.factor``, a likelihood over all the
    data at once) are full-data terms."""
    plated = {n: p for n in observed_sites if (p := _plates_of(trace.nodes[n]))}
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
    return tuple(sorted(names, key=order.index))


# ----- divergences ------------------------------------------------------------------------------------------------
# thresholds of the energy check (the rule of the module docstring)
_MAD_MULTIPLE = 20.0  # robust standard deviations above the reference level
_HISTORY = 128  # energies kept over the whole run (decimated by two whenever full)
_RECENT = 32  # the most recent energies
_MIN_HISTORY = 8  # samples before the spread is estimated
_EARLY_MULTIPLE = 100.0  # before that: the energy may not exceed its lowest value by 100 (|level| + T (D + 10) + 1)
_MAX_HALVINGS = 30  # the warm-up step-size search gives up below 2**-30 of the initial step size


class SamplerDivergenceError(RuntimeError):
    """Raised when an SG-MCMC chain produces a non-finite potential, gradient or position (or one whose square
    overflows), or when an op of the step raises on such a state (chained as ``__cause__``)."""


def _representable_bound(dtype: torch.dtype) -> float:
    """:math:`\\sqrt{\\text{finfo(dtype).max}}`: beyond it the square of a coordinate overflows to ``inf``."""
    return math.sqrt(torch.finfo(dtype).max)


def _finite_state(state: tuple) -> Tensor:
    """Whether every coordinate of the state is finite and its square representable, as one 0-d bool tensor.

    Beyond :math:`\\sqrt{\\text{finfo.max}}` a squared norm, a Gaussian prior term or the kinetic energy is ``inf``
    and a network can overflow at other inputs: the chain has diverged even if the minibatch potential is still
    finite. The bound is the dtype's, not a tuning threshold; ``NaN`` fails the comparison.
    """
    return torch.stack([(t.abs() <= _representable_bound(t.dtype)).all() for t in state]).all()


def _chain_finite(state: tuple) -> Tensor:
    """Per chain, whether its state is finite with a representable square (:func:`_finite_state`): a bool tensor of
    shape ``(chains,)`` for a ``(chains, D)`` state, ``(1,)`` for a ``(D,)`` one."""
    chains = state[0].shape[0] if state[0].dim() > 1 else 1
    return torch.stack([(t.abs() <= _representable_bound(t.dtype)).reshape(chains, -1).all(-1) for t in state]).all(0)


def _rows(history: Any) -> np.ndarray:
    """The energies of a history (a sequence of ``(chains,)`` rows) as one ``(len, chains)`` array."""
    return np.concatenate(history).reshape(len(history), -1)


def _median(rows: np.ndarray) -> np.ndarray:
    """``np.median(rows, 0)`` of finite rows, bit for bit, cheaper on the short histories of the check."""
    rows = np.sort(rows, 0)
    half = len(rows) // 2
    return rows[half] if len(rows) % 2 else (rows[half - 1] + rows[half]) / 2


def energy_threshold(recent: Sequence[np.ndarray], history: Sequence[np.ndarray],
                     base: float) -> Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per chain ``(threshold, level, spread)`` of the energy check (module docstring) from the recent healthy
    energies and the (decimated) history of all of them, ``base`` being :math:`T (D + 10)`; ``None`` before the first
    healthy energy; the spread is NaN before ``_MIN_HISTORY`` samples. The smaller of the two medians and spreads, so
    that neither a slow rise (which drags the recent median up) nor the initial descent (which inflates the all-time
    statistics) hides a divergence."""
    if not recent:
        return None
    if len(recent) < _MIN_HISTORY:  # too few for a spread: a rise by orders of magnitude only
        level = np.min(_rows(recent), 0)
        return level + _EARLY_MULTIPLE * (np.abs(level) + base + 1), level, np.full_like(level, np.nan)
    stats = []
    for rows in (_rows(history), _rows(recent)):
        median = _median(rows)
        stats.append((median, 1.4826 * _median(np.abs(rows - median))))
    level = np.minimum(stats[0][0], stats[1][0])
    spread = np.minimum(stats[0][1], stats[1][1])
    allowance = base + 1e-3 * (np.abs(level) + 1)
    return level + _MAD_MULTIPLE * spread + allowance, level, spread


# ----- the end-of-run checks -------------------------------------------------------------------------------------
RHAT_THRESHOLD = 1.1
_BOUNDARY_TOL = 1e-6


class SamplerWarning(UserWarning):
    """A problem with a finished SG-MCMC run: :math:`\\hat R > 1.1`, a chain stuck at a support boundary,
    divergences. Filter it as any warning (``warnings.simplefilter("ignore", SamplerWarning)``)."""


def _drivers(kernel: Any, depth: int) -> Iterator[tuple[FrameType, Any]]:
    """``(frame, self)`` of the frames above the caller (nearest first, at most ``depth``) whose ``self`` drives
    ``kernel`` (holds it as ``.kernel``): Pyro's ``MCMC`` and its samplers, which ``MCMCKernel.setup`` is not given."""
    frame: Optional[FrameType] = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        if owner is not None and owner is not kernel and getattr(owner, "kernel", None) is kernel:
            yield frame, owner
        frame = frame.f_back


def find_runner(kernel: Any) -> tuple[Any, Any]:
    """The object of Pyro's ``MCMC`` that calls ``kernel.setup`` (``_UnarySampler`` or ``_Worker``: its ``num_samples``
    and ``num_chains``) and the progress bar of its ``run`` (or ``None``), read from the caller's frames;
    ``(None, None)`` when the kernel is driven by hand."""
    for frame, owner in _drivers(kernel, 8):
        if isinstance(getattr(owner, "num_samples", None), int):
            bar = frame.f_locals.get("progress_bar")
            return owner, bar if hasattr(bar, "set_description") else None
    return None, None


def find_mcmc(kernel: Any) -> Any:
    """The ``MCMC`` whose ``run`` calls ``kernel.setup`` in this process, read from the caller's frames; ``None``
    when the kernel is driven by hand or in a worker process."""
    return next((owner for _, owner in _drivers(kernel, 16) if isinstance(owner, MCMC)), None)


def check_mcmc_transforms(kernel: Any, mcmc: Any) -> None:
    """``MCMC`` maps the kernel's unconstrained samples back through ``mcmc.transforms``: given by the user as
    ``MCMC(transforms=...)``, they must be the kernel's own (``kernel.transforms``), or the samples come back wrong
    without an error (the kernel samples in its own coordinates)."""
    theirs = getattr(mcmc, "transforms", None)
    if theirs is None or theirs is kernel.transforms:
        return
    bad = []
    for name, ours in kernel.transforms.items():
        other = theirs.get(name) if isinstance(theirs, dict) else None
        identity = isinstance(ours, ComposeTransform) and not ours.parts
        if not (other == ours or (other is None and identity)):
            bad.append(f"{name!r}: MCMC's {' '.join(repr(other).split())}, the kernel's {' '.join(repr(ours).split())}")
    if bad:
        raise ValueError(
            "MCMC(transforms=...) would map the samples back through other transforms than the kernel samples in ("
            + "; ".join(bad) + f"): pass them to the kernel instead ({kernel._name}(model, transforms=...)), which "
            "then samples in those coordinates, and leave MCMC's transforms=None"
        )


def split_rhat(count: Tensor, mean: Tensor, m2: Tensor) -> Tensor:
    """Split :math:`\\hat R` per coordinate from ``(halves,)`` counts and ``(halves, D)`` means and sums of squared
    deviations (all halves of equal length). Constant coordinates give 1; halves that differ while constant, inf.

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(4, 1000, 1, generator=g)  # four halves of the same law
    >>> r = split_rhat(torch.full((4,), 1000.0), x.mean(1), ((x - x.mean(1, keepdim=True)) ** 2).sum(1))
    >>> bool(r < 1.01)
    True
    """
    n = count[0]
    w = (m2 / (n - 1)).mean(0)
    b_over_n = mean.var(0)  # B / n
    var_plus = (n - 1) / n * w + b_over_n
    rhat = (var_plus / w).sqrt()
    return torch.where(w > 0, rhat, torch.where(b_over_n > 0, torch.full_like(w, math.inf), torch.ones_like(w)))


def _bounds(site: Any) -> Optional[tuple[Optional[float], Optional[float]]]:
    """``(lower, upper)`` of a site's support where its transform saturates (``None`` on an unbounded side): a side is
    bounded where the transform gives the same finite value at :math:`u = \\pm 10^4` and :math:`\\pm 2 \\cdot 10^4`.
    ``None`` for sites without a bound and for transforms that change the number of elements (a simplex's)."""
    if site.is_identity:
        return None
    out = []
    for sign in (-1.0, 1.0):
        with torch.no_grad():
            try:
                near, far = (site.transform(torch.full(tuple(site.shape), sign * r, dtype=torch.float64))
                             for r in (1e4, 2e4))
            except Exception:  # noqa: BLE001 - a transform that cannot be evaluated there has no bound we can find
                return None
        if near.numel() != site.numel:
            return None
        value = near.reshape(-1)[0]
        same = bool(torch.isfinite(near).all() and (near == far).all() and (near == value).all())
        out.append(float(value) if same else None)
    lower, upper = out
    if lower is not None and upper is not None and lower > upper:
        lower, upper = upper, lower
    return None if lower is None and upper is None else (lower, upper)


class RunChecks:
    """The running statistics of the post-warm-up draws of a run (all its chains) and the end-of-run warnings."""

    def __init__(self, potential: Any, num_samples: Optional[int], num_chains: int) -> None:
        self.potential = potential
        self.num_samples = num_samples
        self.num_chains = num_chains  # MCMC's chains (each may hold vectorised chains)
        self.chains_done = 0
        self.halves: list[tuple[Tensor, Tensor, Tensor]] = []  # (count, mean, m2) per finished half, per chain
        self.boundary_sites = [(s, b) for s in potential.sites if (b := _bounds(s)) is not None]
        self.boundary: list[tuple[str, int, int, float]] = []  # (site, chain, draws at the bound, bound)
        self.divergences = 0
        self.chain_offset = 0
        self._begin_chain()

    def _begin_chain(self) -> None:
        self._seen = 0
        self._acc: Optional[list] = None  # per half: [count, mean, m2], each (K, D)
        self._at_bound: dict[str, Tensor] = {}

    def constrained(self, position: Tensor) -> Tensor:
        """The position with every site in its constrained space, flat ``([K,] D')``."""
        batch = position.shape[:-1]
        parts = []
        for s in self.potential.sites:
            u = position[..., s.offset : s.offset + s.numel]
            if not s.is_identity:
                u = s.transform(u.reshape(batch + s.shape)).reshape(batch + (-1,))
            parts.append(u)
        return torch.cat(parts, -1)

    def observe(self, position: Tensor) -> None:
        """Record one post-warm-up draw ``([K,] D)`` (unconstrained)."""
        position = position.detach()
        if position.dim() == 1:
            position = position.unsqueeze(0)
        for s, (lo, hi) in self.boundary_sites:
            y = s.transform(position[:, s.offset : s.offset + s.numel].reshape((-1,) + s.shape))
            y = y.reshape(position.shape[0], -1)
            width = (hi - lo) if lo is not None and hi is not None else None
            near = torch.zeros_like(y, dtype=torch.bool)
            for b in (lo, hi):
                if b is not None:
                    tol = _BOUNDARY_TOL * (width if width is not None else max(1.0, abs(b)))
                    near = near | ((y - b).abs() <= tol)
            hits = near.any(-1).to(torch.long)
            self._at_bound[s.name] = hits if s.name not in self._at_bound else self._at_bound[s.name] + hits
        i, n = self._seen, self.num_samples
        self._seen += 1
        if n is None or n < 4 or n // 2 <= i < n - n // 2:  # R-hat reads the first and the last half only
            return
        h = 0 if i < n // 2 else 1
        x = self.constrained(position)
        if x.device.type in ("cpu", "cuda"):  # float64 sums where the device has them (not on MPS)
            x = x.to(torch.float64)
        if self._acc is None:
            self._acc = [[0, torch.zeros_like(x), torch.zeros_like(x)] for _ in range(2)]
        acc = self._acc[h]
        acc[0] += 1
        delta = x - acc[1]
        acc[1] = acc[1] + delta / acc[0]
        acc[2] = acc[2] + delta * (x - acc[1])

    def end_chain(self, divergences: int) -> bool:
        """Close the chain just run; ``True`` when it was the run's last."""
        self.divergences += divergences
        k = None
        if self._acc is not None and self._acc[0][0] > 1 and self._acc[0][0] == self._acc[1][0]:
            for count, mean, m2 in self._acc:
                self.halves.append((torch.full((mean.shape[0],), float(count)), mean, m2))
        for name, hits in self._at_bound.items():
            for c, h in enumerate(hits.tolist()):
                if self._seen and h > self._seen / 2:
                    self.boundary.append((name, self.chain_offset + c, int(h), self._seen))
            k = hits.shape[0]
        self.chain_offset += k if k is not None else (0 if self._acc is None else self._acc[0][1].shape[0])
        self.chains_done += 1
        self._begin_chain()
        return self.chains_done >= self.num_chains

    def messages(self, name: str, faster: Optional[str] = None) -> list[str]:
        """One line per problem found in the run; ``faster`` names a kernel that mixes in fewer steps (for the R-hat
        line)."""
        out = []
        if self.halves:
            count, mean, m2 = (torch.cat(parts) for parts in zip(*self.halves))
            chains = mean.shape[0] // 2
            if chains >= 2:
                rhat = split_rhat(count, mean, m2)
                offset = 0
                # each site's number of constrained elements (a transform may change it, e.g. a simplex's)
                zero = torch.zeros(1, self.potential.dim, dtype=self.potential.dtype, device=self.potential.device)
                for s in self.potential.sites:
                    u = zero[..., s.offset : s.offset + s.numel]
                    numel = u.numel() if s.is_identity else s.transform(u.reshape((1,) + s.shape)).numel()
                    worst = float(rhat[offset : offset + numel].max()) if numel else 1.0
                    offset += numel
                    if not worst <= RHAT_THRESHOLD:
                        out.append(
                            f"{name}: site {s.name!r} has split R-hat {worst:.3g} > {RHAT_THRESHOLD} across {chains} "
                            "chains: the chains have not mixed; run a longer chain (a larger num_steps) or check the "
                            "model and step size"
                            + (f"; {faster}, whose momentum carries it along loosely determined directions, often "
                               "mixes in fewer steps" if faster else "")
                        )
        for site, chain, hits, seen in self.boundary:
            out.append(
                f"{name}: chain {chain} sat at a support boundary of site {site!r} for {hits} of its {seen} draws: "
                "the chain is stuck where the transform saturates; check the prior's support and the step size"
            )
        if self.divergences:
            out.append(f"{name}: {self.divergences} divergence(s) (restarted chains); "
                       "see diagnostics()['divergence log']")
        return out
