# SPDX-License-Identifier: Apache-2.0
"""Shared machinery of the SG-MCMC kernels: the minibatch potential of a Pyro model and the kernel base class.

A Pyro model is traced once (in :meth:`SGMCMCKernel.setup`) to learn its latent sites, their supports and
the plate over the data. From that the kernel builds a *functional* potential of one flat unconstrained
vector :math:`u \\in \\mathbb R^D` (the concatenation of all latent sites mapped to unconstrained space by
``biject_to(site.support)``):

.. math::

    \\tilde U(u) = -\\frac{N}{b} \\sum_{i \\in B} \\log p(y_i | x_i, w) - \\log p(w)
                   - \\log |\\det J_{T}(u)|, \\qquad w = T(u),

where the minibatch :math:`B` of size :math:`b` is injected as the ``subsample`` of the model's data plate
(Pyro's ``plate`` then scales the likelihood by :math:`N/b`). The whole inner step (potential, gradient,
noise, update) is then traced once into an FX graph with ``make_fx`` so that Pyro's handler machinery is
out of the inner loop, and optionally compiled (``backend="compile"``); ``backend="eager"`` keeps the
per-step Pyro trace (works for any model, slowest).

Run eagerly, every node of that graph costs a few microseconds of dispatch, which dominates on small networks.
The graph is therefore kept lean: constant-Normal weight priors are taken out of the autograd graph and applied
in closed form on the flat vector (:meth:`MinibatchPotential.gaussian_prior`), constants are folded, identity
operations, aliases and dead nodes are removed, and the graph takes and returns flat tensors (no pytree handling
per call). On the 2-50-50-1 network this halves the node count (161 -> 77 ATen calls per step).
``backend="auto"`` runs this graph eagerly and compiles it once it has cost ``compile_after`` seconds
(see :meth:`SGMCMCKernel._auto_switch`).
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from typing import Any, Callable, NamedTuple, Optional, Union

import pyro
import torch
from pyro import poutine
from pyro.infer.autoguide.initialization import InitMessenger, init_to_sample
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from pyro.poutine.util import site_is_subsample
from torch import Tensor
from torch.distributions import biject_to
from torch.distributions.transforms import ComposeTransform, IndependentTransform

from pyro_sdebnn.infer.mcmc.schedules import StepSizeSchedule, as_schedule

__all__ = ["MinibatchPotential", "SGMCMCKernel", "SamplerDivergenceError"]

_BACKENDS = ("auto", "eager", "fx", "compile")
_ON_DIVERGENCE = ("raise", "continue")


class SamplerDivergenceError(RuntimeError):
    """Raised when an SG-MCMC chain produces a non-finite potential, gradient or position (or one whose square
    overflows), or when an op of the step raises on such a state (chained as ``__cause__``)."""


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


def _arg_key(arg: Any) -> Any:
    """Identity of a model argument; tensors by storage (``MCMC.run`` hands over fresh ``detach()``-ed views)."""
    if torch.is_tensor(arg):
        return ("tensor", arg.data_ptr(), tuple(arg.shape), tuple(arg.stride()), arg.dtype, str(arg.device))
    return ("object", id(arg))


_NO_OPS = {torch.ops.aten.lift_fresh_copy.default, torch.ops.aten.alias.default, torch.ops.aten.detach.default}
_aten = torch.ops.aten
# (op, scalar) pairs that return their tensor argument unchanged (when dtype and shape are unchanged)
_IDENTITIES = {
    (_aten.add.Tensor, 0.0), (_aten.sub.Tensor, 0.0), (_aten.mul.Tensor, 1.0), (_aten.div.Tensor, 1.0),
    (_aten.pow.Tensor_Scalar, 1.0), (_aten.mul.Scalar, 1.0),
}
_SHAPE_OPS = {_aten.expand.default, _aten.view.default, _aten.reshape.default}


def _meta(node: Any) -> Optional[Tensor]:
    value = node.meta.get("val") if hasattr(node, "meta") else None
    return value if isinstance(value, Tensor) else None


def _is_pure(target: Any) -> bool:
    return (
        isinstance(target, torch._ops.OpOverload)
        and not target._schema.is_mutable
        and torch.Tag.nondeterministic_seeded not in target.tags
        and "empty" not in target.__name__
    )


def _fold_constants(graph: Any) -> None:
    """Evaluate once the nodes that depend on constants only (GP kernel hyper-parameters, ``arange``, ``eye``,
    prior scales ...) and store their values as graph constants."""
    values: dict = {}
    count = 0
    for node in list(graph.graph.nodes):
        if node.op == "get_attr":
            value = getattr(graph, node.target)
            if isinstance(value, Tensor):
                values[node] = value
            continue
        if node.op != "call_function" or not _is_pure(node.target):
            continue
        flat_inputs: list = []
        torch.fx.node.map_arg((node.args, node.kwargs), flat_inputs.append)
        if not all(n in values for n in flat_inputs):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
        value = node.target(*args, **kwargs)
        if not isinstance(value, Tensor):
            continue
        name = f"_folded_constant{count}"
        count += 1
        graph.register_buffer(name, value, persistent=False)
        with graph.graph.inserting_before(node):
            folded = graph.graph.get_attr(name)
        folded.meta = dict(node.meta)
        node.replace_all_uses_with(folded)
        graph.graph.erase_node(node)
        values[folded] = value
    graph.graph.eliminate_dead_code()


def _drop_identities(graph: Any) -> None:
    """Replace ``x + 0``, ``x * 1``, ``x ** 1``, no-op ``expand``/``view``, ``t(t(x))`` and ``x[arange(len(x))]``
    by ``x`` (Pyro's distributions and the GP kernel leave many of them in the traced step)."""
    for node in list(graph.graph.nodes):
        if node.op != "call_function":
            continue
        target, args = node.target, node.args
        source = args[0] if args and isinstance(args[0], torch.fx.Node) else None
        out, inp = _meta(node), (_meta(source) if source is not None else None)
        if source is None or out is None or inp is None or out.dtype != inp.dtype or out.shape != inp.shape:
            continue
        same = False
        if target is _aten.index.Tensor:
            index = args[1][0] if len(args[1]) == 1 else None
            if isinstance(index, torch.fx.Node) and index.op == "get_attr":
                value = getattr(graph, index.target)
                same = value.dim() == 1 and torch.equal(value, torch.arange(inp.shape[0], device=value.device))
        elif len(args) == 2 and isinstance(args[1], (int, float)) and not node.kwargs:
            try:
                same = (target, float(args[1])) in _IDENTITIES
            except (TypeError, ValueError):
                same = False
        elif target in _SHAPE_OPS:
            same = out.stride() == inp.stride()
        elif target is _aten.t.default:
            same = source.target is _aten.t.default and isinstance(source.args[0], torch.fx.Node)
            if same:
                source = source.args[0]
        if same:
            node.replace_all_uses_with(source)
            graph.graph.erase_node(node)


def _lean_graph(graph: Any) -> None:
    """Strip a ``make_fx`` graph for eager execution: drop aliases/detaches (no autograd runs through the step),
    fold constants, drop identity operations and dead nodes, and the pytree (un)flattening of its generated code.
    Every remaining node is one ATen call (each costs a few microseconds of dispatch on small tensors)."""
    mutates = any(
        isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
        for n in graph.graph.nodes if n.op == "call_function"
    )
    if not mutates:  # a functional graph: aliases are values, constants can be shared between calls
        for node in list(graph.graph.nodes):
            if node.op == "call_function" and node.target in _NO_OPS and len(node.args) == 1:
                node.replace_all_uses_with(node.args[0])
                graph.graph.erase_node(node)
        _fold_constants(graph)
        _drop_identities(graph)
    graph.graph.eliminate_dead_code()
    graph.graph._codegen = torch.fx.graph.CodeGen()
    graph.recompile()


def _compile_graph(
    graph: Any, on_failure: Optional[Callable[[Exception], Callable]] = None, options: Optional[dict] = None
) -> Callable:
    """``torch.compile`` the step graph (compiled on the first call; ``options`` are Inductor options). If that first
    call fails and ``on_failure`` is given, the step continues with ``on_failure(error)`` instead of raising."""
    import torch._inductor.config as inductor_config

    # on CPU the compiler's own random-number generation is very slow; use ATen's generator instead
    inductor_config.fallback_random = True
    compiled = torch.compile(graph, dynamic=False, options=options)
    state: dict[str, Any] = {"fn": None}

    def run(*args: Tensor) -> tuple:
        if state["fn"] is not None:
            return state["fn"](*args)
        try:  # the first call compiles; the compiler's own deprecation notices are not ours
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = compiled(*args)
            state["fn"] = compiled
            return out
        except Exception as e:  # noqa: BLE001 - re-raised unless the caller has a fallback
            if on_failure is None:
                raise
            state["fn"] = on_failure(e)
            return state["fn"](*args)

    return run


def _representable_bound(dtype: torch.dtype) -> float:
    """:math:`\\sqrt{\\text{finfo(dtype).max}}`: beyond it the square of a coordinate overflows to ``inf``."""
    return math.sqrt(torch.finfo(dtype).max)


def _finite_state(state: tuple) -> Tensor:
    """Whether every coordinate of the state is finite and its square representable, as one 0-d bool tensor.

    A coordinate above :math:`\\sqrt{\\text{finfo.max}}` (about 1.8e19 in float32) is finite, but the kinetic energy,
    a Gaussian prior term or a squared norm of it is ``inf`` and a network evaluated there can overflow at other inputs
    (``inf - inf = nan`` in a matrix product): the chain has numerically diverged, even if the minibatch potential
    still happens to be finite. The bound is the dtype's, not a tuning threshold. ``NaN`` fails the comparison.
    """
    return torch.stack([(t.abs() <= _representable_bound(t.dtype)).all() for t in state]).all()


class SGMCMCKernel(MCMCKernel):
    """Base class of the SG-MCMC kernels: minibatch potential, backends, schedules, divergences, warm start.

    Subclasses define ``_state_type`` (a ``NamedTuple`` whose first field is ``position``),
    :meth:`_init_state` and :meth:`_update` (a pure rule from :mod:`pyro_sdebnn.ops.sgmcmc`).

    Returned ``params`` are unconstrained, as for Pyro's ``HMC``: ``MCMC`` maps them back through
    ``kernel.transforms``. With ``vectorized_chains=K > 1`` every site carries a leading chain dimension
    ``(K, *shape)``; use :func:`pyro_sdebnn.infer.mcmc.get_samples` or :func:`pyro_sdebnn.infer.mcmc.from_pyro`
    to move it to ArviZ's chain dimension.

    >>> from pyro_sdebnn.infer.mcmc import SGLD, SGHMC
    >>> issubclass(SGLD, SGMCMCKernel) and issubclass(SGHMC, SGMCMCKernel)
    True
    """

    _state_type: type = NamedTuple
    _name = "SGMCMC"

    def __init__(
        self,
        model: Callable,
        *,
        step_size: Union[float, StepSizeSchedule] = 1e-3,
        num_steps: int = 1,
        subsample_size: Optional[int] = None,
        data_plate: Optional[str] = None,
        temperature: float = 1.0,
        init_strategy: Callable = init_to_sample,
        map_steps: int = 0,
        map_lr: float = 1e-3,
        vectorized_chains: int = 1,
        on_divergence: str = "raise",
        backend: str = "auto",
        sample_writer: Any = None,
        transforms: Optional[dict] = None,
        compile_after: float = 2.0,
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable, got {type(model).__name__}")
        if isinstance(compile_after, bool) or not isinstance(compile_after, (int, float)) or not compile_after >= 0:
            raise ValueError(f"compile_after must be a non-negative number of seconds, got {compile_after!r}")
        self.compile_after = float(compile_after)
        self.model = model
        self.user_transforms = transforms
        self.step_size = as_schedule(step_size)
        for name, value in (("num_steps", num_steps), ("vectorized_chains", vectorized_chains)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(map_steps, bool) or not isinstance(map_steps, int) or map_steps < 0:
            raise ValueError(f"map_steps must be a non-negative int, got {map_steps!r}")
        if subsample_size is not None and (
            isinstance(subsample_size, bool) or not isinstance(subsample_size, int) or subsample_size < 1
        ):
            raise ValueError(f"subsample_size must be a positive int or None, got {subsample_size!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise ValueError(f"temperature must be a non-negative float, got {temperature!r}")
        if not map_lr > 0:
            raise ValueError(f"map_lr must be positive, got {map_lr!r}")
        if on_divergence not in _ON_DIVERGENCE:
            raise ValueError(f"on_divergence must be one of {_ON_DIVERGENCE}, got {on_divergence!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
        if not callable(init_strategy):
            raise TypeError("init_strategy must be a Pyro init function such as init_to_sample")
        self.num_steps = num_steps
        self.subsample_size = subsample_size
        self.data_plate = data_plate
        self.temperature = float(temperature)
        self.init_strategy = init_strategy
        self.map_steps = map_steps
        self.map_lr = float(map_lr)
        self.vectorized_chains = vectorized_chains
        self.on_divergence = on_divergence
        self.backend = backend
        self.sample_writer = sample_writer
        self.potential: Optional[MinibatchPotential] = None
        self.transforms: Optional[dict] = None
        self._initial_params: Optional[dict[str, Tensor]] = None
        self._graph_key: Any = None
        self._step_fn: Optional[Callable] = None
        self.backend_used: Optional[str] = None
        self._auto: Optional[dict] = None
        self._reset()

    # ----- subclass interface ------------------------------------------------------------------------------------
    def _init_state(self, position: Tensor) -> tuple:
        raise NotImplementedError

    def _update(self, noise: Tensor, state: tuple, grad: Tensor, step_size: Tensor) -> tuple:
        raise NotImplementedError

    def _build_potential(self, args: tuple, kwargs: dict) -> MinibatchPotential:
        return MinibatchPotential(
            self.model, args, kwargs, subsample_size=self.subsample_size, data_plate=self.data_plate,
            transforms=self.user_transforms,
        )

    def _potential_and_grad_inputs(self) -> tuple:
        """Extra tensor inputs of the potential for the next step (none for weight-space kernels)."""
        return ()

    def _potential_fn(
        self, flat: Tensor, idx: Optional[Tensor], *extra: Tensor, exclude_gaussian_prior: bool = False
    ) -> Tensor:
        return self.potential(flat, idx, exclude_gaussian_prior=exclude_gaussian_prior)

    # ----- bookkeeping -------------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._t = 0  # inner gradient steps taken
        self._sample_count = 0  # calls to sample()
        self._warmup_steps = 0
        self._divergences: list[int] = []
        self._state: Optional[tuple] = None
        self._last_params: Optional[dict] = None
        self._last_potential: Optional[Tensor] = None
        self._batches: Optional[Tensor] = None
        self._batch_pos = 0
        self._eta_tensor: Optional[Tensor] = None

    @property
    def initial_params(self) -> Optional[dict[str, Tensor]]:
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: Optional[dict[str, Tensor]]) -> None:
        self._initial_params = params

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        self._reset()
        self._warmup_steps = warmup_steps
        key = (tuple(_arg_key(a) for a in args), tuple((k, _arg_key(v)) for k, v in sorted(kwargs.items())))
        if self.potential is None or key != self._graph_key:
            self.potential = self._build_potential(args, kwargs)
            self.transforms = dict(self.potential.transforms)
            self._step_fn = None
            self._graph_key = key
            self._args = args  # keep the arguments alive: ids are only meaningful while they are
        U = self.potential
        if self._initial_params is None:
            self._initial_params = self._draw_initial_params()
        position = U.pack(self._initial_params).to(U.dtype)
        if self.vectorized_chains > 1 and position.dim() == 1:
            position = position.expand(self.vectorized_chains, -1).clone()
        if self.map_steps:
            position = self._map_fit(position)
            self._initial_params = U.split(position)
        self._state = self._init_state(position)
        self._last_params = self._initial_params
        # the step graph is built on the first sample(): MCMC's parent process calls setup() only to learn the
        # transforms when the chains ran in worker processes
        if self.sample_writer is not None:
            self.sample_writer.start_chain()

    def _draw_initial_params(self) -> dict[str, Tensor]:
        U = self.potential
        draws = []
        for _ in range(self.vectorized_chains):
            with poutine.block(), pyro.validation_enabled(False), torch.no_grad():
                trace = poutine.trace(InitMessenger(self.init_strategy)(self.model)).get_trace(
                    *U.model_args, **U.model_kwargs
                )
            draws.append({s.name: s.transform.inv(trace.nodes[s.name]["value"]).detach() for s in U.sites})
        if self.vectorized_chains == 1:
            return draws[0]
        return {k: torch.stack([d[k] for d in draws]) for k in draws[0]}

    # ----- minibatches -------------------------------------------------------------------------------------------
    def _next_indices(self) -> Optional[Tensor]:
        U = self.potential
        if self.subsample_size is None or U.data_plate is None:
            return None
        n, b = U.data_size, self.subsample_size
        nb = n // b
        if self._batches is None or self._batch_pos >= nb:
            if self.vectorized_chains > 1:
                perm = torch.rand(self.vectorized_chains, n, device=U.device).argsort(-1)
                self._batches = perm[:, : nb * b].reshape(self.vectorized_chains, nb, b).transpose(0, 1)
            else:
                self._batches = torch.randperm(n, device=U.device)[: nb * b].reshape(nb, b)
            self._batch_pos = 0
        idx = self._batches[self._batch_pos]
        self._batch_pos += 1
        return idx

    # ----- the step function -------------------------------------------------------------------------------------
    def _single_step(self, state: tuple, idx: Optional[Tensor], step_size: Tensor, *extra: Tensor) -> tuple:
        """One inner step for one chain: returns ``(new_state_tuple, potential)``."""
        # differentiate w.r.t. the per-site pieces, not the flat vector: the gradient of a slice of the flat vector
        # is a zero-padded copy of length D per site; one concatenation of the pieces' gradients is one pass
        U = self.potential
        parts = U.flat_parts(state[0])
        split = U.has_gaussian_prior  # Gaussian weight priors in closed form, outside the autograd graph
        grads, value = torch.func.grad_and_value(self._potential_fn)(parts, idx, *extra, exclude_gaussian_prior=split)
        grad = torch.cat(grads)
        if split:
            prior_value, prior_grad = U.gaussian_prior(state[0])
            grad, value = grad + prior_grad, value + prior_value
        noise = torch.randn_like(state[0])
        new_state = self._update(noise, self._state_type(*state), grad, step_size)
        return tuple(new_state), value

    def _eager_step(self, state: tuple, idx: Optional[Tensor], step_size: Tensor, *extra: Tensor) -> tuple:
        def one(chain_state: tuple, chain_idx: Optional[Tensor]) -> tuple:
            # no argument validation in the hot loop, as in the traced step (the model was validated at set-up):
            # a non-finite state gives a non-finite potential, reported as a divergence, not a validation error
            with torch.enable_grad(), pyro.validation_enabled(False):
                position = chain_state[0].detach().requires_grad_()
                value = self._potential_fn(position, chain_idx, *extra)
                (grad,) = torch.autograd.grad(value, position)
            with torch.no_grad():
                new_state = self._update(
                    torch.randn_like(position), self._state_type(*chain_state), grad, step_size
                )
            return tuple(new_state), value.detach()

        if self.vectorized_chains == 1:
            return one(state, idx)
        outs = [one(tuple(t[k] for t in state), None if idx is None else idx[k]) for k in range(self.vectorized_chains)]
        new_state = tuple(torch.stack([o[0][j] for o in outs]) for j in range(len(state)))
        return new_state, torch.stack([o[1] for o in outs])

    def _example_inputs(self) -> tuple:
        idx = self._next_indices()
        self._batch_pos -= 1  # peek only
        eta = torch.tensor(self.step_size(0), dtype=self.potential.dtype, device=self.potential.device)
        return tuple(self._state), idx, eta, *self._potential_and_grad_inputs()

    def _choose_backend(self) -> str:
        # "auto" starts with the traced graph run eagerly; sample() compiles it later (see _auto_switch)
        return "fx" if self.backend == "auto" else self.backend

    def _make_step_fn(self) -> Callable:
        backend = self._choose_backend()
        if backend == "eager":
            self.backend_used = "eager"
            return self._eager_step
        from torch.fx.experimental.proxy_tensor import make_fx

        def step(state: tuple, idx: Optional[Tensor], step_size: Tensor, *extra: Tensor) -> tuple:
            if self.vectorized_chains == 1:
                return self._single_step(state, idx, step_size, *extra)
            in_dims = (0, None if idx is None else 0, None) + (None,) * len(extra)
            return torch.func.vmap(self._single_step, in_dims=in_dims, randomness="different")(
                state, idx, step_size, *extra
            )

        state, idx, eta, *extra = self._example_inputs()
        num_state, has_idx = len(state), idx is not None

        def flat_step(*flat: Tensor) -> tuple[Tensor, ...]:  # flat tensors in and out: no pytree in the hot loop
            new_state, value = step(
                flat[:num_state], flat[num_state] if has_idx else None, flat[num_state + has_idx],
                *flat[num_state + has_idx + 1 :],
            )
            return (*new_state, value)

        try:
            with pyro.validation_enabled(False), poutine.block(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph = make_fx(flat_step)(*state, *([idx] if has_idx else []), eta, *extra)
        except Exception as e:  # noqa: BLE001 - any untraceable model falls back to the generic eager path
            if self.backend != "auto":
                raise RuntimeError(
                    f"backend={self.backend!r}: could not trace the model's step into a graph ({e}); "
                    "use backend='eager'"
                ) from e
            warnings.warn(
                f"{self._name}: could not trace the model's step into a graph ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}); falling back to the slower per-step Pyro trace "
                "(backend='eager'; pass it explicitly to silence this warning)",
                RuntimeWarning,
                stacklevel=2,
            )
            self.backend_used = "eager"
            return self._eager_step
        _lean_graph(graph)
        self._graph_module, self._graph_layout = graph, (num_state, has_idx)
        self._auto = {"fx_seconds": 0.0, "fx_steps": 0, "compiled": None, "decided": self.backend != "auto"}
        self.backend_used = backend
        return self._wrap_graph(_compile_graph(graph) if backend == "compile" else graph.forward)

    def _wrap_graph(self, run: Callable) -> Callable:
        num_state, has_idx = self._graph_layout

        def step_fn(state: tuple, idx: Optional[Tensor], step_size: Tensor, *extra: Tensor) -> tuple:
            out = run(*state, idx, step_size, *extra) if has_idx else run(*state, step_size, *extra)
            return out[:num_state], out[num_state]

        step_fn.graph_module = self._graph_module  # type: ignore[attr-defined]
        return step_fn

    def _compile_failed(self, error: Exception) -> Callable:
        first_line = str(error).splitlines()[0] if str(error) else ""
        warnings.warn(
            f"{self._name}: compiling the step failed ({type(error).__name__}: {first_line}); continuing with the "
            "eager graph (backend='fx')",
            RuntimeWarning,
            stacklevel=2,
        )
        self._auto["decided"] = True
        self.backend_used = "fx"
        self._step_fn = self._wrap_graph(self._graph_module.forward)
        return self._graph_module.forward

    def _auto_switch(self, seconds: float) -> None:
        """``backend="auto"``: compile the step graph once the eager graph has cost ``compile_after`` seconds, then
        keep the compiled step only if it is measured faster.

        The kernel does not know how many samples ``MCMC`` will ask for, so this is the ski-rental rule: run the
        (cheap to build) eager graph until the time spent in it equals the (unknown in advance, few seconds) cost
        of compiling, then compile. A short run never pays the compilation; a long run pays at most about twice the
        best total time of either choice. The second compiled ``sample()`` call (the first includes compiling) is
        timed against the eager steps; a compiled step that is not faster is dropped.
        """
        auto = self._auto
        if auto["decided"]:
            return
        if auto["compiled"] is None:
            auto["fx_seconds"] += seconds
            auto["fx_steps"] += self.num_steps
            if auto["fx_seconds"] >= self.compile_after:
                auto["compiled"] = "compiling"
                self._step_fn = self._wrap_graph(_compile_graph(self._graph_module, self._compile_failed))
                self.backend_used = "compile"
        elif auto["compiled"] == "compiling":  # this call included the compilation: time the next one
            auto["compiled"] = "timing"
        else:
            auto["decided"] = True
            if seconds / self.num_steps >= auto["fx_seconds"] / auto["fx_steps"]:
                self._step_fn = self._wrap_graph(self._graph_module.forward)
                self.backend_used = "fx"

    # ----- warm start from a MAP fit ---------------------------------------------------------------------------
    def _map_fit(self, position: Tensor) -> Tensor:
        position = position.detach().clone().requires_grad_()
        optim = torch.optim.Adam([position], lr=self.map_lr)
        with pyro.validation_enabled(False):  # a diverging fit is reported below, not as a validation error
            for _ in range(self.map_steps):
                idx = self._next_indices()
                optim.zero_grad()
                if self.vectorized_chains == 1:
                    value = self._potential_fn(position, idx, *self._potential_and_grad_inputs())
                else:
                    value = sum(
                        self._potential_fn(
                            position[k], None if idx is None else idx[k], *self._potential_and_grad_inputs()
                        )
                        for k in range(self.vectorized_chains)
                    )
                value.backward()
                optim.step()
        if not bool(_finite_state((position.detach(),))):
            raise SamplerDivergenceError(f"{self._name}: the MAP warm start diverged; use a smaller map_lr")
        return position.detach()

    # ----- MCMCKernel API --------------------------------------------------------------------------------------
    def build_step_fn(self) -> Callable:
        """The inner step ``(state, idx, step_size, *extra) -> (state, potential)`` (traced/compiled once)."""
        if self._step_fn is None:
            self._step_fn = self._make_step_fn()
        return self._step_fn

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        U = self.potential
        self.build_step_fn()
        if params is not self._last_params:  # the runner (or a user) handed us other parameters
            position = U.pack(params).to(U.dtype)
            self._state = (position,) + tuple(self._state[1:])
        start_state, start_t = self._state, self._t
        state = self._state
        values = []
        constant = self.step_size.is_constant
        eta = self._eta_tensor if constant else None
        if eta is None:
            eta = self._eta_tensor = torch.tensor(self.step_size(self._t), dtype=U.dtype, device=U.device)
        step_fn = self._step_fn
        started = time.perf_counter()
        error: Optional[Exception] = None
        with torch.no_grad():  # the traced graph holds its own backward pass; no autograd across steps
            for _ in range(self.num_steps):
                if not constant:
                    eta = torch.tensor(self.step_size(self._t), dtype=U.dtype, device=U.device)
                try:
                    state, value = step_fn(state, self._next_indices(), eta, *self._potential_and_grad_inputs())
                except (RuntimeError, ValueError) as e:
                    # an op that refuses non-finite input (a distribution's argument validation in the eager
                    # step, torch.bernoulli or a Cholesky factorisation in the model ...): a divergence if the
                    # state it was handed had diverged (checked below), the model's own error otherwise
                    error = e
                    break
                values.append(value)
                self._t += 1
        if error is not None:
            finite_so_far = torch.isfinite(torch.stack(values)).all() if values else torch.tensor(True, device=U.device)
            if bool(finite_so_far & _finite_state(state)):
                raise error
            failed_at = self._t
            # the step that produced the non-finite state (the incoming state itself if the first step failed)
            last_good = max(failed_at - start_t - 1, 0)
            self._t = start_t + self.num_steps  # the schedule moves on as after a completed sample
            values = values[:last_good]
            values.extend([torch.full_like(start_state[0][..., 0], float("nan"))] * (self.num_steps - last_good))
        potentials = torch.stack(values)
        ok = error is None and bool(torch.isfinite(potentials).all() & _finite_state(state))  # one sync per sample
        if self.backend == "auto" and self.backend_used != "eager" and error is None:
            self._auto_switch(time.perf_counter() - started)
        sample_index = self._sample_count - self._warmup_steps
        self._sample_count += 1
        if not ok:
            flat = potentials.reshape(self.num_steps, -1)
            bad = (~torch.isfinite(flat)).any(-1).nonzero()
            step = start_t + (int(bad[0]) if len(bad) else self.num_steps - 1)
            if self.on_divergence == "raise":
                reason = (
                    f"the step raised {type(error).__name__} on a non-finite state at inner step {failed_at}"
                    if error is not None
                    else "the potential or its gradient is not finite, or the state overflowed"
                )
                raise SamplerDivergenceError(
                    f"{self._name} diverged at inner step {step} (step size {self.step_size(step):.3g}): {reason}. "
                    "Use a smaller step_size (or a decaying schedule), or pass on_divergence='continue' to record a "
                    "divergence and restart from the last finite state."
                ) from error
            if sample_index >= 0:
                self._divergences.append(sample_index)
            state = (start_state[0],) + tuple(torch.zeros_like(t) for t in start_state[1:])
        self._state = tuple(state)
        self._last_potential = potentials[-1]
        params = U.split(self._state[0])
        self._last_params = params
        if self.sample_writer is not None and sample_index >= 0:
            self.sample_writer.write({s.name: s.transform(params[s.name]) for s in U.sites})
        return params

    def cleanup(self) -> None:
        if self.sample_writer is not None:
            self.sample_writer.flush()
        self._initial_params = None  # the next chain draws its own initial values

    def logging(self) -> dict[str, str]:
        out = {"step size": f"{self.step_size(max(self._t - 1, 0)):.2e}"}
        if self._last_potential is not None:
            out["potential"] = f"{float(self._last_potential.mean()):.4g}"
        return out

    def diagnostics(self) -> dict[str, Any]:
        return {
            "divergences": list(self._divergences),
            "acceptance rate": 1.0,  # SG-MCMC has no accept/reject step
            "backend": self.backend_used,
        }
