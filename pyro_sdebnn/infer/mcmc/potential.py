# SPDX-License-Identifier: Apache-2.0
"""The minibatch potential of a Pyro model, as a function of one flat unconstrained vector.

A Pyro model is traced once to learn its latent sites, their supports and the plate over the data. From that
:class:`MinibatchPotential` builds a *functional* potential of one flat unconstrained vector
:math:`u \\in \\mathbb R^D` (the concatenation of all latent sites mapped to unconstrained space by
``biject_to(site.support)``):

.. math::

    \\tilde U(u) = -\\frac{N}{b} \\sum_{i \\in B} \\log p(y_i | x_i, w) - \\log p(w)
                   - \\log |\\det J_{T}(u)|, \\qquad w = T(u),

where the minibatch :math:`B` of size :math:`b` is injected as the ``subsample`` of the model's data plate
(Pyro's ``plate`` then scales the likelihood by :math:`N/b`).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, NamedTuple, Optional

import pyro
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample
from torch import Tensor
from torch.distributions import biject_to
from torch.distributions.transforms import ComposeTransform, IndependentTransform

__all__ = ["MinibatchPotential"]


class _Site(NamedTuple):
    name: str
    shape: torch.Size
    offset: int
    numel: int
    transform: Any  # biject_to(support): unconstrained -> constrained
    is_identity: bool


def _no_validation(fn: Any) -> Any:
    """A shallow copy of a distribution with argument/sample validation switched off (recursively)."""
    fn = copy.copy(fn)
    if hasattr(fn, "_validate_args"):
        fn._validate_args = False
    if hasattr(fn, "base_dist"):
        fn.base_dist = _no_validation(fn.base_dist)
    return fn


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _constant_normal(fn: Any) -> Optional[tuple[float, float]]:
    r"""``(loc, scale)`` when ``fn`` is a (reshaped) Normal with one constant ``loc`` and ``scale``, else ``None``.

    Pyro's ``Normal.log_prob`` takes about 7 elementwise passes (and as many in the backward) over the weights;
    on a 784-400-400-10 network that made the prior cost as much as the likelihood (issue 6). For such priors the
    potential uses :math:`-\frac{1}{2 s^2}\|w - \mu\|^2 - n(\log s + \frac12\log 2\pi)` instead.
    """
    base = fn
    wrappers = (torch.distributions.Independent, pyro.distributions.torch_distribution.ExpandedDistribution)
    while isinstance(base, wrappers):
        base = base.base_dist
    if type(base) not in (torch.distributions.Normal, pyro.distributions.Normal):
        return None
    loc, scale = base.loc, base.scale

    def _scalar(t: Tensor) -> bool:  # one element, possibly broadcast by ``expand`` (all strides 0)
        return t.numel() == 1 or all(st == 0 for st in t.stride())

    if not (_scalar(loc) and _scalar(scale)) or loc.requires_grad or scale.requires_grad:
        return None
    return float(loc.reshape(-1)[0]), float(scale.reshape(-1)[0])


def _normal_log_prob_sum(value: Tensor, loc: float, scale: float) -> Tensor:
    flat = value.reshape(-1)
    centred = flat if loc == 0.0 else flat - loc
    return -0.5 / scale**2 * torch.dot(centred, centred) - flat.numel() * (math.log(scale) + _HALF_LOG_2PI)


def _is_identity(transform: Any) -> bool:
    while isinstance(transform, IndependentTransform):
        transform = transform.base_transform
    return isinstance(transform, ComposeTransform) and not transform.parts


def _is_deterministic(site: dict) -> bool:
    return bool(site["infer"].get("_deterministic", False)) if site.get("infer") else False


def _plates_of(site: dict) -> set[str]:
    return {f.name for f in site["cond_indep_stack"] if f.vectorized}


def _trace_explained(model: Callable, args: tuple, kwargs: dict, data_plate: Optional[str] = None) -> Any:
    """Trace ``model``; if it fails, explain the usual cause (weights sampled inside the data plate)."""
    tracer = poutine.trace(model)
    try:
        return tracer.get_trace(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - re-raised with an explanation or unchanged
        _check_latents_outside_plate(tracer.msngr.trace, data_plate, cause=e)
        raise


def _check_latents_outside_plate(trace: Any, data_plate: Optional[str], cause: Optional[Exception] = None) -> None:
    plates = set()
    for site in trace.nodes.values():
        # on a failed trace the observed sites may not have been reached: then every plate is suspect
        if site["type"] == "sample" and (site["is_observed"] or cause is not None):
            plates |= _plates_of(site)
    if data_plate is not None:
        plates = {data_plate}
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site["is_observed"] or site_is_subsample(site):
            continue
        inside = _plates_of(site) & plates
        if inside:
            msg = (
                f"Latent site '{name}' is sampled inside the data plate '{sorted(inside)[0]}'. Network weights must be "
                "sampled outside the plate over the data: inside it they get a batch dimension (one weight per data "
                "point) and, under subsampling, a prior scaled by N/b. With a PyroModule, PyroSample weights are drawn "
                "on first access, so call the network (or touch its weights) before entering "
                "`with pyro.plate('data', N) as idx:`."
            )
            if cause is not None:
                raise ValueError(msg) from cause
            raise ValueError(msg)


class MinibatchPotential:
    """The minibatch potential :math:`\\tilde U(u)` of a Pyro model as a function of a flat unconstrained vector.

    .. math::

        \\tilde U(u) = -\\sum_{\\text{sites } s} \\text{scale}_s \\log p_s(v_s) - \\log|\\det J_T(u)|

    where the data plate's subsample is set to the minibatch indices (scale :math:`N/b` on the likelihood).

    :param callable model: a Pyro model; its likelihood must sit in a plate over the data whose indices index
        the data (``with pyro.plate("data", len(x)) as idx: ... obs=y[idx]``), with the network weights
        sampled outside that plate.
    :param tuple model_args: positional arguments of the model (the full data).
    :param dict model_kwargs: keyword arguments of the model.
    :param int subsample_size: minibatch size :math:`b`; ``None`` for full-batch gradients.
    :param str data_plate: name of the plate over the data; by default the plate that contains every observed site.
    :param prior_filter: optional ``(name, site) -> bool`` keeping only the prior terms of the latent sites it
        accepts (used by the functional kernels, which drop the weight-space prior).
    :param dict transforms: optional ``{site: transform}`` from constrained to unconstrained space (as for Pyro's
        ``HMC``); other sites use ``biject_to(support).inv``.

    >>> import pyro.distributions as dist
    >>> def model(x, y=None):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)) as idx:
    ...         pyro.sample("y", dist.Normal(w * x[idx], 1.0), obs=None if y is None else y[idx])
    >>> x = torch.linspace(-1, 1, 10); y = 2 * x
    >>> U = MinibatchPotential(model, (x, y), subsample_size=5)
    >>> U.dim, U.data_plate, U.data_size
    (1, 'data', 10)
    >>> U(torch.zeros(1), torch.arange(5)).shape
    torch.Size([])
    """

    def __init__(
        self,
        model: Callable,
        model_args: tuple = (),
        model_kwargs: Optional[dict] = None,
        *,
        subsample_size: Optional[int] = None,
        data_plate: Optional[str] = None,
        prior_filter: Optional[Callable[[str, dict], bool]] = None,
        transforms: Optional[dict] = None,
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable, got {type(model).__name__}")
        if subsample_size is not None and (
            isinstance(subsample_size, bool) or not isinstance(subsample_size, int) or subsample_size < 1
        ):
            raise ValueError(f"subsample_size must be a positive int or None, got {subsample_size!r}")
        if data_plate is not None and not isinstance(data_plate, str):
            raise TypeError(f"data_plate must be a str or None, got {type(data_plate).__name__}")
        self.model = model
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs or {})
        self.prior_filter = prior_filter
        self.user_transforms = dict(transforms or {})
        with pyro.validation_enabled(False), poutine.block():
            trace = _trace_explained(model, self.model_args, self.model_kwargs, data_plate)
        self.prototype_trace = trace
        self._find_sites(trace)
        self._find_data_plate(trace, data_plate, subsample_size)
        self._constant_normal_priors = self._find_constant_normal_priors(trace)
        self._build_gaussian_prior(trace)
        self.subsample_size = subsample_size
        if subsample_size is not None:
            # local latent variables are fine with full-batch gradients, not with a subsampled plate
            _check_latents_outside_plate(trace, self.data_plate)
            self._check_subsampling()

    # ----- structure -------------------------------------------------------------------------------------------
    def _find_sites(self, trace: Any) -> None:
        sites, offset = [], 0
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or site["is_observed"] or site_is_subsample(site):
                continue
            value = site["value"]
            if not torch.is_tensor(value) or not value.is_floating_point():
                raise ValueError(f"latent site '{name}' is not continuous; SG-MCMC needs continuous latent sites")
            if name in self.user_transforms:  # constrained -> unconstrained, as for Pyro's HMC
                transform = self.user_transforms[name].inv
            else:
                transform = biject_to(site["fn"].support)
            unconstrained_shape = transform.inv.forward_shape(value.shape)
            numel = int(math.prod(unconstrained_shape))
            is_identity = _is_identity(transform)
            sites.append(_Site(name, torch.Size(unconstrained_shape), offset, numel, transform, is_identity))
            offset += numel
        if not sites:
            raise ValueError("the model has no latent sample sites to sample")
        self.sites = sites
        self.dim = offset
        example = next(iter(trace.nodes[s.name]["value"] for s in sites))
        self.dtype, self.device = example.dtype, example.device
        self.transforms = {s.name: s.transform.inv for s in sites}
        self.observed_sites = [
            n for n, s in trace.nodes.items() if s["type"] == "sample" and s["is_observed"] and not _is_deterministic(s)
        ]

    def _find_constant_normal_priors(self, trace: Any) -> dict[str, tuple[float, float]]:
        """Latent sites whose prior is one fixed Normal object (e.g. a ``PyroSample``) with scalar loc and scale.

        Found outside any graph tracing, from the prototype trace and a second trace (same distribution object in
        both, so the prior does not depend on other latent variables or the arguments).
        """
        with pyro.validation_enabled(False), poutine.block(), torch.no_grad():
            second = poutine.trace(self.model).get_trace(*self.model_args, **self.model_kwargs)
        out = {}
        for s in self.sites:
            site = trace.nodes[s.name]
            fn = site["fn"]
            if s.name in second.nodes and second.nodes[s.name]["fn"] is fn and site["mask"] is None:
                params = _constant_normal(fn)
                if params is not None and fn.batch_shape + fn.event_shape == site["value"].shape:
                    out[s.name] = params
        return out

    def _build_gaussian_prior(self, trace: Any) -> None:
        """Coordinates of the flat vector whose prior is a constant Normal on an unconstrained site (typically all
        network weights): their prior term and its gradient have a closed form on the flat vector (see
        :meth:`gaussian_prior`), which keeps about a third of the graph nodes out of the traced step."""
        sites = []
        for s in self.sites:
            site = trace.nodes[s.name]
            if not (s.is_identity and s.name in self._constant_normal_priors and site["mask"] is None):
                continue
            if not (isinstance(site["scale"], float) and site["scale"] == 1.0):
                continue
            if self.prior_filter is not None and not self.prior_filter(s.name, site):
                continue
            sites.append(s)
        self.gaussian_prior_sites = frozenset(s.name for s in sites)
        self._gaussian_scalar: Optional[tuple[float, float]] = None
        self._gaussian_vectors: Optional[tuple[Tensor, Tensor]] = None
        self._gaussian_const = 0.0
        if not sites:
            return
        params = [self._constant_normal_priors[s.name] for s in sites]
        self._gaussian_const = sum(s.numel * (math.log(sc) + _HALF_LOG_2PI) for s, (_, sc) in zip(sites, params))
        if len(sites) == len(self.sites) and len(set(params)) == 1:  # one Normal(loc, scale) for every coordinate
            self._gaussian_scalar = params[0]
            return
        precision = torch.zeros(self.dim, dtype=self.dtype, device=self.device)
        loc = torch.zeros(self.dim, dtype=self.dtype, device=self.device)
        for s, (mu, sc) in zip(sites, params):
            precision[s.offset : s.offset + s.numel] = sc**-2
            loc[s.offset : s.offset + s.numel] = mu
        self._gaussian_vectors = (precision, loc)

    @property
    def has_gaussian_prior(self) -> bool:
        """Whether some sites' prior terms can be taken out of the traced potential (see :meth:`gaussian_prior`)."""
        return bool(self.gaussian_prior_sites)

    def gaussian_prior(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        """:math:`-\\log p` of the constant-Normal prior sites and its gradient, in closed form on the flat vector.

        .. math::

            -\\log p(u) = \\tfrac12 (u - \\mu)^\\top \\Lambda (u - \\mu) + c, \\qquad
            \\nabla = \\Lambda (u - \\mu)

        with :math:`\\Lambda` diagonal (zero on the other sites). ``__call__(..., exclude_gaussian_prior=True)``
        gives the remaining potential, so the sum of both is :math:`\\tilde U`.
        """
        if self._gaussian_scalar is not None:
            mu, sc = self._gaussian_scalar
            centred = flat if mu == 0.0 else flat - mu
            grad = centred * sc**-2
        else:
            precision, loc = self._gaussian_vectors
            centred = flat - loc
            grad = centred * precision
        return 0.5 * (centred * grad).sum(-1) + self._gaussian_const, grad

    def _find_data_plate(self, trace: Any, data_plate: Optional[str], subsample_size: Optional[int]) -> None:
        frames: dict[str, Any] = {}
        for site in trace.nodes.values():
            if site["type"] == "sample":
                for f in site["cond_indep_stack"]:
                    if f.vectorized:
                        frames[f.name] = f
        if data_plate is None:
            candidates = None
            for name in self.observed_sites:
                plates = _plates_of(trace.nodes[name])
                candidates = plates if candidates is None else candidates & plates
            candidates = sorted(candidates or ())
            if len(candidates) > 1:
                if subsample_size is not None:
                    raise ValueError(
                        f"several plates contain all observed sites ({candidates}); pass data_plate= to name the plate "
                        "over the data"
                    )
                candidates = []
            data_plate = candidates[0] if candidates else None
        elif data_plate not in frames:
            raise ValueError(f"data_plate '{data_plate}' is not a plate of the model (plates: {sorted(frames)})")
        if data_plate is None:
            if subsample_size is not None:
                raise ValueError(
                    "subsample_size was given but the model has no plate over the data. Put the likelihood in "
                    "`with pyro.plate('data', len(x)) as idx:` and index the data with idx (obs=y[idx]); the kernel "
                    "then draws the minibatch indices."
                )
            self.data_plate, self.data_size = None, None
            return
        self.data_plate = data_plate
        sub = trace.nodes.get(data_plate)
        full_size = frames[data_plate].size if sub is None else sub["fn"].size
        if sub is not None and sub["fn"].subsample_size is not None and sub["fn"].subsample_size < sub["fn"].size:
            raise ValueError(
                f"the model's plate '{data_plate}' already subsamples (subsample_size="
                f"{sub['fn'].subsample_size}). Subsampling is a kernel setting: remove subsample_size from the model's "
                "plate and pass subsample_size= to the kernel, so that ArviZ and Predictive see the full data."
            )
        self.data_size = int(full_size)

    def _check_subsampling(self) -> None:
        if self.subsample_size > self.data_size:
            raise ValueError(f"subsample_size={self.subsample_size} exceeds the data size {self.data_size}")
        idx = torch.arange(self.subsample_size, device=self.device)
        values = self.unpack(torch.zeros(self.dim, dtype=self.dtype, device=self.device))[0]
        try:
            with pyro.validation_enabled(True), poutine.block():
                trace = self._trace(values, idx)
                trace.log_prob_sum()
        except Exception as e:  # noqa: BLE001 - re-raised with an explanation
            raise ValueError(
                f"running the model with a minibatch of size {self.subsample_size} on plate '{self.data_plate}' "
                "failed. "
                "The likelihood must index the data with the plate's indices: "
                f"`with pyro.plate('{self.data_plate}', len(x)) as idx: pyro.sample(..., obs=y[idx])` (f(x[idx]))."
            ) from e
        for name in self.observed_sites:
            site = trace.nodes[name]
            frame = next(f for f in site["cond_indep_stack"] if f.name == self.data_plate)
            shape = site["fn"].batch_shape
            if len(shape) >= -frame.dim and shape[frame.dim] != self.subsample_size:
                raise ValueError(
                    f"observed site '{name}' has batch size {shape[frame.dim]} on plate '{self.data_plate}' under a "
                    f"minibatch of {self.subsample_size}: index the data with the plate's indices (obs=y[idx])."
                )

    # ----- evaluation ------------------------------------------------------------------------------------------
    def flat_parts(self, flat: Tensor) -> tuple[Tensor, ...]:
        """The per-site pieces ``(numel_s,)`` of a flat vector ``(D,)`` (views)."""
        return tuple(flat[s.offset : s.offset + s.numel] for s in self.sites)

    def unpack(self, flat: Tensor | tuple[Tensor, ...]) -> tuple[dict[str, Tensor], Tensor | float]:
        """Map a flat unconstrained vector ``(D,)`` (or its :meth:`flat_parts`) to constrained site values and
        :math:`\\log|\\det J_T|`."""
        parts = flat if isinstance(flat, tuple) else self.flat_parts(flat)
        values: dict[str, Tensor] = {}
        logdet: Tensor | float = 0.0
        for s, part in zip(self.sites, parts):
            u = part.reshape(s.shape)
            if s.is_identity:
                values[s.name] = u
            else:
                x = s.transform(u)
                values[s.name] = x
                logdet = logdet + s.transform.log_abs_det_jacobian(u, x).sum()
        return values, logdet

    def pack(self, params: dict[str, Tensor]) -> Tensor:
        """Concatenate unconstrained site values (a ``params`` dict of Pyro's MCMC) into a flat vector.

        Sites may carry leading batch (chain) dimensions, which are kept: ``(*batch, D)``.
        """
        parts = []
        for s in self.sites:
            v = params[s.name]
            batch = v.shape[: v.dim() - len(s.shape)]
            parts.append(v.reshape(batch + (s.numel,)))
        return torch.cat(parts, -1)

    def split(self, flat: Tensor) -> dict[str, Tensor]:
        """Inverse of :meth:`pack` (views into ``flat``)."""
        batch = flat.shape[:-1]
        return {s.name: flat[..., s.offset : s.offset + s.numel].reshape(batch + s.shape) for s in self.sites}

    def _trace(
        self, values: dict[str, Tensor], idx: Optional[Tensor], args: Optional[tuple] = None,
        kwargs: Optional[dict] = None,
    ) -> Any:
        data = dict(values)
        if idx is not None:
            data[self.data_plate] = idx
        conditioned = poutine.condition(self.model, data=data)
        args = self.model_args if args is None else args
        kwargs = self.model_kwargs if kwargs is None else kwargs
        return poutine.trace(conditioned).get_trace(*args, **kwargs)

    def log_density(
        self, trace: Any, *, likelihood: bool = True, prior: bool = True, exclude: frozenset = frozenset()
    ) -> Tensor | float:
        """:math:`\\sum_s \\text{scale}_s \\log p_s` over the sample sites of a trace (no validation), leaving out
        the prior terms of the latent sites in ``exclude``."""
        total: Tensor | float = 0.0
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site) or _is_deterministic(site):
                continue
            observed = name in self.observed_sites
            if observed and not likelihood:
                continue
            if not observed:
                if not prior or name in exclude:
                    continue
                if self.prior_filter is not None and not self.prior_filter(name, site):
                    continue
            if site["mask"] is None and name in self._constant_normal_priors:
                fast = _normal_log_prob_sum(site["value"], *self._constant_normal_priors[name])
                scale = site["scale"]
                total = total + (fast if isinstance(scale, float) and scale == 1.0 else fast * scale)
                continue
            log_p = _no_validation(site["fn"]).log_prob(site["value"])
            if site["mask"] is not None:
                log_p = log_p * site["mask"]
            scale = site["scale"]
            if not (isinstance(scale, float) and scale == 1.0):
                log_p = log_p * scale
            total = total + log_p.sum()
        return total

    def __call__(
        self, flat: Tensor | tuple[Tensor, ...], idx: Optional[Tensor] = None, *, exclude_gaussian_prior: bool = False
    ) -> Tensor:
        """:math:`\\tilde U(u)` for one flat vector ``(D,)`` (or its :meth:`flat_parts`) and minibatch indices
        ``idx`` of shape ``(b,)``; without the terms of :meth:`gaussian_prior` if ``exclude_gaussian_prior``."""
        values, logdet = self.unpack(flat)
        trace = self._trace(values, idx)
        exclude = self.gaussian_prior_sites if exclude_gaussian_prior else frozenset()
        return -(self.log_density(trace, exclude=exclude) + logdet)
