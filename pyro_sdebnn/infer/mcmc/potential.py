# SPDX-License-Identifier: Apache-2.0
"""From a Pyro model to the minibatch potential of one flat unconstrained vector, and the minibatches that feed it.

The model is traced once to learn its latent sites, their supports and the plates over the data (and checked,
:mod:`~pyro_sdebnn.infer.mcmc.diagnostics`). ``MinibatchPotential`` is then a function of :math:`u \\in \\mathbb R^D`,
the latent sites mapped to unconstrained space by ``biject_to(site.support)`` and concatenated:

.. math::

    \\tilde U(u) = -\\sum_p \\frac{N_p}{b_p} \\sum_{i \\in B_p} \\log p(y_{p,i} | x_{p,i}, w)
                   - \\sum_{\\text{full-data terms } t} \\log p_t(w) - \\log p(w) - \\log |\\det J_{T}(u)|,
    \\qquad w = T(u),

with one term per data plate :math:`p` (of size :math:`N_p`, minibatch :math:`B_p` of size :math:`b_p`); observed
sites and ``pyro.factor`` terms outside every data plate are full-data terms. The minibatches are uniform draws
without replacement, so :math:`\\tilde U` is an unbiased estimate of the full-data potential [1]. Latent sites whose
prior is a ``Normal`` with fixed parameters can be taken out of the traced graph and added in closed form
(``ClosedFormGaussianPrior``; the kernels' ``closed_form_prior=`` switch).

**References**

[1] Max Welling, Yee Whye Teh (2011). "Bayesian Learning via Stochastic Gradient Langevin Dynamics". ICML 2011.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence, Sized, Union, cast

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import Message
from pyro.poutine.util import site_is_subsample
from torch import Tensor
from torch.distributions import Distribution, biject_to
from torch.distributions.transforms import ComposeTransform, IndependentTransform
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.data import DataLoader, IterableDataset

from pyro_sdebnn.data.loaders import (
    arguments,
    check_finite_tensors,
    check_same_structure,
    dataset_size,
    is_loader,
    leaf_names,
    loader_generators,
    move_batch,
    read_batch,
)
from pyro_sdebnn.infer.mcmc.diagnostics import (
    _check_latents_outside_plate,
    _check_observed_values,
    _check_subsample_size,
    _data_plate_names,
    _is_deterministic,
    _trace_explained,
    find_data_plates,
)

__all__: list[str] = []

SubsampleSize = Union[None, int, Mapping[str, int]]


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


def _is_identity(transform: Any) -> bool:
    while isinstance(transform, IndependentTransform):
        transform = transform.base_transform
    return isinstance(transform, ComposeTransform) and not transform.parts


class _DataScale(Messenger):
    """Scale every site inside a data plate ``p`` by :math:`N_p / b`, :math:`b` being the plate's size in this run:
    the scaling a subsampled ``pyro.plate`` would apply, for a model run on a minibatch itself."""

    def __init__(self, sizes: Mapping[str, int]) -> None:
        super().__init__()
        self.sizes = dict(sizes)

    def _process_message(self, msg: Message) -> None:
        if msg["type"] != "sample" or site_is_subsample(msg):
            return
        for frame in msg["cond_indep_stack"]:
            n = self.sizes.get(frame.name)
            if n is not None and frame.vectorized and frame.size != n:
                msg["scale"] = msg["scale"] * (n / frame.size)


def _slice_data(tree: Any, size: int, idx: Tensor) -> Any:
    """Every tensor of ``tree`` whose leading dimension is ``size`` (a data argument) gathered at ``idx``."""
    leaves, spec = tree_flatten(tree)
    leaves = [
        leaf[idx] if torch.is_tensor(leaf) and leaf.dim() >= 1 and leaf.shape[0] == size else leaf for leaf in leaves
    ]
    return tree_unflatten(leaves, spec)


class MinibatchPotential:
    """The minibatch potential :math:`\\tilde U(u)` of a Pyro model as a function of a flat unconstrained vector.

    .. math::

        \\tilde U(u) = -\\sum_{\\text{sites } s} \\text{scale}_s \\log p_s(v_s) - \\log|\\det J_T(u)|,

    with scale :math:`N_p/b_p` on the terms inside a subsampled data plate :math:`p` and 1 on the full-data terms
    (see the module). ``minibatch_mode`` says how a minibatch reaches the model: ``"index"`` (its plate's subsample,
    for a model indexing the data with the plate's indices), ``"slice"`` (a plain model's data arguments of leading
    size :math:`N` sliced) or ``"batch"`` (one loader batch, with ``data_size``); the last two are scaled by
    :math:`N/b` here. With several subsampled plates, ``idx`` is their indices joined by :meth:`join_indices`.

    :param callable model: a Pyro model: the weights outside the plate over the data, the likelihood inside (no local
        latent variables under subsampling).
    :param tuple model_args: positional arguments of the model (the full data; one minibatch with ``data_size``).
    :param dict model_kwargs: keyword arguments of the model.
    :param subsample_size: minibatch size :math:`b`: an int for every data plate, a dict ``{plate name: size}``
        (only the plates it names are subsampled), or ``None`` for full-batch gradients.
    :param data_plate: name (or list of names) of the plate(s) over the data; by default the plate that contains
        every observed site, else each observed site's own plate.
    :param prior_filter: optional ``(name, site) -> bool`` keeping only the prior terms of the latent sites it
        accepts (the functional kernels drop the weight-space prior).
    :param dict transforms: optional ``{site: transform}`` from constrained to unconstrained space (as for Pyro's
        ``HMC``); other sites use ``biject_to(support).inv``.
    :param int data_size: :math:`N` when ``model_args`` are one minibatch (a loader's batch); excludes
        ``subsample_size``; the model must then have one data plate.
    :param batch_keys: with ``data_size``, the names of the keyword arguments that come from the batch.

    >>> import pyro.distributions as dist
    >>> def model(x, y=None):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)) as idx:
    ...         pyro.sample("y", dist.Normal(w * x[idx], 1.0), obs=None if y is None else y[idx])
    >>> x = torch.linspace(-1, 1, 10); y = 2 * x
    >>> U = MinibatchPotential(model, (x, y), subsample_size=5)
    >>> U.dim, U.data_plate, U.data_size, U.minibatch_mode
    (1, 'data', 10, 'index')
    >>> U(torch.zeros(1), torch.arange(5)).shape
    torch.Size([])
    """

    def __init__(
        self, model: Callable, model_args: tuple = (), model_kwargs: Optional[dict] = None, *,
        subsample_size: SubsampleSize = None, data_plate: Union[None, str, Sequence[str]] = None,
        prior_filter: Optional[Callable[[str, dict], bool]] = None, transforms: Optional[dict] = None,
        data_size: Optional[int] = None, batch_keys: Sequence[str] = (),
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable, got {type(model).__name__}")
        _check_subsample_size(subsample_size)
        data_plates = _data_plate_names(data_plate)
        if data_size is not None:
            if isinstance(data_size, bool) or not isinstance(data_size, int) or data_size < 1:
                raise ValueError(f"data_size must be a positive int (the number of data points N), got {data_size!r}")
            if subsample_size is not None:
                raise ValueError("data_size= (the model arguments are one minibatch of N data points) excludes "
                                 "subsample_size=: the minibatch size is the size of the batch the model is run on")
        self.minibatch_mode = "batch" if data_size is not None else "index"  # "slice": see _check_subsampling
        self.batch_keys = frozenset(batch_keys)
        self.model = model
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs or {})
        self.prior_filter = prior_filter
        self.user_transforms = dict(transforms or {})
        leaves, spec = tree_flatten((self.model_args, self.model_kwargs))
        check_finite_tensors(
            leaves, lambda: leaf_names(spec, len(leaves), model, label="data problem: model argument '{}'",
                                       unknown="args"),
            advice=": SG-MCMC needs finite data (a non-finite datum makes the potential or its gradient non-finite, "
            "which the sampler could only report as a divergence)",
        )
        with pyro.validation_enabled(False), poutine.block():
            trace = _trace_explained(model, self.model_args, self.model_kwargs, data_plates)
        self.prototype_trace = trace
        self._find_sites(trace)
        _check_observed_values(trace, self.observed_sites)
        names, self.data_sizes, self.subsample_sizes = find_data_plates(
            trace, self.observed_sites, data_plates, subsample_size
        )
        self.data_plates, self.subsampled_plates = names, tuple(self.subsample_sizes)
        self.batch_size: Optional[int] = sum(self.subsample_sizes.values()) if self.subsample_sizes else None
        # the first data plate, for code written for one plate
        self.data_plate: Optional[str] = names[0] if names else None
        self.data_size: Optional[int] = self.data_sizes[names[0]] if names else None
        if data_size is not None:  # the arguments are one minibatch of the N = data_size points (none subsampled)
            if len(names) != 1:
                raise ValueError("with a loader the model must have exactly one plate over the data (found "
                                 f"{list(names) or 'none'}): put the likelihood in `with pyro.plate('data', len(x)):`,"
                                 " or name the plate with data_plate=")
            self.data_sizes, self.data_size = {names[0]: data_size}, data_size
        self._data_scaled_model = _DataScale(self.data_sizes)(model)  # for "slice" and "batch"
        self._constant_normal_priors = find_constant_normal_priors(model, self.model_args, self.model_kwargs, trace,
                                                                   self.sites)
        self._closed_form_prior = ClosedFormGaussianPrior(self.sites, trace, self._constant_normal_priors, prior_filter,
                                                          self.dim, self.dtype, self.device)
        self.gaussian_prior_sites = self._closed_form_prior.site_names
        self.subsample_size = subsample_size
        if self.subsample_sizes:
            # local latent variables are fine with full-batch gradients, not with a subsampled plate
            _check_latents_outside_plate(trace, self.subsampled_plates)
            self._check_subsampling()
        elif data_size is not None:
            _check_latents_outside_plate(trace, self.data_plates)

    # ----- structure -------------------------------------------------------------------------------------------
    def _find_sites(self, trace: Any) -> None:
        sites, offset = [], 0
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or site["is_observed"] or site_is_subsample(site):
                continue
            value = site["value"]
            # a Bernoulli site draws floats: its support, not its dtype, says that it is discrete
            if not torch.is_tensor(value) or not value.is_floating_point() or site["fn"].support.is_discrete:
                raise ValueError(f"latent site '{name}' is not continuous ({type(site['fn']).__name__}, support "
                                 f"{site['fn'].support}); SG-MCMC needs continuous latent sites: sum a discrete one "
                                 "out of the model (e.g. a mixture distribution such as MixtureSameFamily), or "
                                 "observe it")
            if name in self.user_transforms:  # constrained -> unconstrained, as for Pyro's HMC
                transform = self.user_transforms[name].inv
            else:
                transform = biject_to(site["fn"].support)
            shape = transform.inv.forward_shape(value.shape)
            numel = int(math.prod(shape))
            sites.append(_Site(name, torch.Size(shape), offset, numel, transform, _is_identity(transform)))
            offset += numel
        if not sites:
            raise ValueError("the model has no latent sample sites to sample")
        self.sites = sites
        self.dim = offset
        example = trace.nodes[sites[0].name]["value"]
        self.dtype, self.device = example.dtype, example.device
        self.transforms = {s.name: s.transform.inv for s in sites}
        self.observed_sites = [
            n for n, s in trace.nodes.items() if s["type"] == "sample" and s["is_observed"] and not _is_deterministic(s)
        ]

    @property
    def has_gaussian_prior(self) -> bool:
        """Whether some sites' prior terms can be taken out of the traced potential (see :meth:`gaussian_prior`)."""
        return bool(self.gaussian_prior_sites)

    def gaussian_prior(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        """:math:`-\\log p` of the constant-Normal prior sites and its gradient, in closed form on the flat vector
        (``ClosedFormGaussianPrior``)."""
        return self._closed_form_prior(flat)

    def _check_subsampling(self) -> None:
        """Run the model once on a minibatch, as the model indexing the data with the plate's indices
        (``minibatch_mode="index"``); if that fails and one plate is subsampled, as a plain model run on the data
        arguments sliced by the minibatch indices (``minibatch_mode="slice"``)."""
        error, second = self._try_minibatch(), None
        if error is None:
            return
        if len(self.subsampled_plates) == 1:
            leaves, _ = tree_flatten((self.model_args, self.model_kwargs))
            if any(torch.is_tensor(t) and t.dim() >= 1 and t.shape[0] == self.data_size for t in leaves):
                self.minibatch_mode = "slice"
                second = self._try_minibatch()
                if second is None:
                    return
                self.minibatch_mode = "index"

        def first_line(e: Exception) -> str:
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

        # when the sliced run failed too, its error is the one a plain model's author needs (e.g. a dtype the
        # likelihood refuses); the first one only says that the model does not index the data
        tried = f"; on the data sliced by the minibatch indices: {first_line(second)}" if second is not None else ""
        plates = ", ".join(f"'{p}' (size {b})" for p, b in self.subsample_sizes.items())
        p = self.subsampled_plates[0]
        raise ValueError(
            f"running the model with a minibatch of plate {plates} failed (indexing the data with the plate's indices: "
            f"{first_line(error)}{tried}). The likelihood must either index the data with the plate's indices "
            f"(`with pyro.plate('{p}', len(x)) as idx: pyro.sample(..., obs=y[idx])`, f(x[idx])) or, for a plain model "
            f"(`with pyro.plate('{p}', len(x)): pyro.sample(..., obs=y)`), take the data as arguments whose leading "
            f"dimension is the plate's size {self.data_sizes[p]} (they are then sliced by the minibatch indices)."
        ) from (second if second is not None else error)

    def _try_minibatch(self) -> Optional[Exception]:
        """Trace the model on a minibatch in the current ``minibatch_mode``: the error, or ``None`` if it worked."""
        idx = self.join_indices({p: torch.arange(b, device=self.device) for p, b in self.subsample_sizes.items()})
        values = self.unpack(torch.zeros(self.dim, dtype=self.dtype, device=self.device))[0]
        try:
            with pyro.validation_enabled(True), poutine.block():
                trace = self._trace(values, idx)
                trace.log_prob_sum()
        except Exception as e:  # noqa: BLE001 - reported by the caller
            return e
        for name in self.observed_sites:
            if name not in trace.nodes:
                return ValueError(f"observed site '{name}' is missing from the trace of a minibatch")
            site = trace.nodes[name]
            shape = site["fn"].batch_shape
            for frame in site["cond_indep_stack"]:
                b = self.subsample_sizes.get(frame.name)
                if b is not None and frame.vectorized and len(shape) >= -frame.dim and shape[frame.dim] != b:
                    return ValueError(f"observed site '{name}' has batch size {shape[frame.dim]} on plate "
                                      f"'{frame.name}' under a minibatch of {b}: index the data with the plate's "
                                      "indices (obs=y[idx]).")
        return None

    # ----- minibatch indices -----------------------------------------------------------------------------------
    def join_indices(self, indices: Mapping[str, Tensor]) -> Optional[Tensor]:
        """The ``idx`` argument of the potential from each subsampled plate's minibatch indices ``{plate: (..., b_p)}``
        (their concatenation along the last dimension, in the order of ``subsampled_plates``)."""
        if not self.subsampled_plates:
            return None
        unknown = set(indices) - set(self.subsampled_plates)
        if unknown:
            raise ValueError(f"join_indices: {sorted(unknown)} are not subsampled plates "
                             f"(subsampled: {list(self.subsampled_plates)})")
        parts = []
        for p in self.subsampled_plates:
            if p not in indices:
                raise ValueError(f"join_indices: no indices for the subsampled plate '{p}'")
            if indices[p].shape[-1] != self.subsample_sizes[p]:
                raise ValueError(f"join_indices: plate '{p}' takes {self.subsample_sizes[p]} indices, "
                                 f"got {indices[p].shape[-1]}")
            parts.append(indices[p])
        return parts[0] if len(parts) == 1 else torch.cat(parts, -1)

    def split_indices(self, idx: Tensor) -> dict[str, Tensor]:
        """Inverse of :meth:`join_indices` (views)."""
        if len(self.subsampled_plates) == 1:
            return {self.subsampled_plates[0]: idx}
        out: dict[str, Tensor] = {}
        offset = 0
        for p in self.subsampled_plates:
            b = self.subsample_sizes[p]
            out[p] = idx[..., offset : offset + b]
            offset += b
        return out

    def index_batches(self, num_chains: int = 1) -> Optional[Tensor]:
        """One pass of minibatch indices: ``(num_batches, batch_size)``, or ``(num_batches, num_chains, batch_size)``
        with independent permutations per chain, ``batch_size`` being the sum of the plates' minibatch sizes.

        Each plate is permuted afresh and cut into :math:`\\lfloor N_p / b_p \\rfloor` minibatches (uniform draws
        without replacement); the pass has as many minibatches as the plate with the fewest."""
        if not self.subsampled_plates:
            return None
        num_batches = min(self.data_sizes[p] // b for p, b in self.subsample_sizes.items())
        parts = []
        for p, b in self.subsample_sizes.items():
            n, nb = self.data_sizes[p], self.data_sizes[p] // b
            if num_chains > 1:
                perm = torch.rand(num_chains, n, device=self.device).argsort(-1)
                batches = perm[:, : nb * b].reshape(num_chains, nb, b).transpose(0, 1)
            else:
                batches = torch.randperm(n, device=self.device)[: nb * b].reshape(nb, b)
            parts.append(batches[:num_batches])
        return parts[0] if len(parts) == 1 else torch.cat(parts, -1)

    # ----- the data as inputs ----------------------------------------------------------------------------------
    def data_tensors(self) -> tuple[Tensor, ...]:
        """The tensors among the model's arguments (also inside lists, tuples and dicts), in a fixed order: the
        traced step takes them as inputs, so that nothing computed from the data is frozen into the graph."""
        # called at every step: flattened once while model_args and model_kwargs stay the same objects
        args, kwargs = self.model_args, self.model_kwargs
        cached = getattr(self, "_data_tensors", None)
        if cached is None or cached[0] is not args or cached[1] is not kwargs:
            leaves, _ = tree_flatten((args, kwargs))
            cached = self._data_tensors = (args, kwargs, tuple(leaf for leaf in leaves if torch.is_tensor(leaf)))
        return cached[2]

    @contextlib.contextmanager
    def bound_data(self, tensors: Sequence[Tensor]) -> Iterator[None]:
        """Within the block, the model runs on ``tensors`` in place of :meth:`data_tensors` (used while tracing
        the step, to make the data inputs of the graph)."""
        leaves, spec = tree_flatten((self.model_args, self.model_kwargs))
        replacement = iter(tensors)
        leaves = [next(replacement) if torch.is_tensor(leaf) else leaf for leaf in leaves]
        saved = self.model_args, self.model_kwargs
        self.model_args, self.model_kwargs = tree_unflatten(leaves, spec)
        try:
            yield
        finally:
            self.model_args, self.model_kwargs = saved

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
            x = u if s.is_identity else s.transform(u)
            values[s.name] = x
            if not s.is_identity:
                logdet = logdet + s.transform.log_abs_det_jacobian(u, x).sum()
        return values, logdet

    def pack(self, params: dict[str, Tensor]) -> Tensor:
        """Concatenate unconstrained site values (a ``params`` dict of Pyro's MCMC) into a flat vector, keeping any
        leading batch (chain) dimensions: ``(*batch, D)``."""
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

    def _trace(self, values: dict[str, Tensor], idx: Optional[Tensor]) -> Any:
        data = dict(values)
        args, kwargs = self.model_args, self.model_kwargs
        model: Callable = self.model
        if self.minibatch_mode == "slice" and idx is not None:
            assert self.data_size is not None  # "slice" is chosen only with a subsampled data plate
            args, kwargs = _slice_data((args, kwargs), self.data_size, idx)
            model = self._data_scaled_model
        elif self.minibatch_mode == "batch":
            model = self._data_scaled_model
        elif idx is not None:
            data.update(self.split_indices(idx))
        conditioned = poutine.condition(model, data=data)
        return poutine.trace(conditioned).get_trace(*args, **kwargs)

    def log_density(self, trace: Any, *, likelihood: bool = True, exclude: frozenset = frozenset()) -> Tensor | float:
        """:math:`\\sum_s \\text{scale}_s \\log p_s` over the sample sites of a trace (no validation), leaving out
        the prior terms of the latent sites in ``exclude`` (and the likelihood terms if not ``likelihood``)."""
        total: Tensor | float = 0.0
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site) or _is_deterministic(site):
                continue
            if name in self.observed_sites:
                if not likelihood:
                    continue
            elif name in exclude or (self.prior_filter is not None and not self.prior_filter(name, site)):
                continue
            fast = site["mask"] is None and name in self._constant_normal_priors
            if fast:  # already a sum
                log_p = _normal_log_prob_sum(site["value"], *self._constant_normal_priors[name])
            else:
                log_p = _no_validation(site["fn"]).log_prob(site["value"])
                if site["mask"] is not None:
                    log_p = log_p * site["mask"]
            scale = site["scale"]
            if not (isinstance(scale, float) and scale == 1.0):
                log_p = log_p * scale
            total = total + (log_p if fast else log_p.sum())
        return total

    def __call__(
        self, flat: Tensor | tuple[Tensor, ...], idx: Optional[Tensor] = None, *, exclude_gaussian_prior: bool = False
    ) -> Tensor:
        """:math:`\\tilde U(u)` for one flat vector ``(D,)`` (or its :meth:`flat_parts`) and minibatch indices
        ``idx`` of shape ``(b,)``; without the terms of :meth:`gaussian_prior` if ``exclude_gaussian_prior``."""
        values, logdet = self.unpack(flat)
        trace = self._trace(values, idx)
        exclude = self.gaussian_prior_sites if exclude_gaussian_prior else frozenset()
        value = -(self.log_density(trace, exclude=exclude) + logdet)
        if not torch.is_tensor(value):  # every term excluded: a model that is only a fixed Normal prior
            value = torch.full((), value, dtype=self.dtype, device=self.device)
        return value


# ----- the closed-form Gaussian prior -------------------------------------------------------------------------------
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
Param = Union[float, Tensor]


def _constant(t: Tensor, shape: torch.Size) -> Param:
    """A float when every element of ``t`` is the same number (a scalar, an ``expand``-ed scalar or e.g.
    ``torch.zeros(n)``), else ``t`` broadcast to ``shape`` and flattened (a detached copy)."""
    first = t.reshape(-1)[0]
    if t.numel() == 1 or all(st == 0 for st in t.stride()) or bool((t == first).all()):  # strides 0: broadcast
        return float(first)
    return t.detach().expand(shape).reshape(-1).clone()


def _constant_normal(fn: Any, shape: torch.Size) -> Optional[tuple[Param, Param]]:
    """``(loc, scale)`` when ``fn`` is a Normal (possibly ``expand``-ed or ``to_event``-ed) whose ``loc`` and
    ``scale`` need no gradient, each a float when all its elements are equal, else a flat tensor over ``shape``
    (the site's shape); ``None`` for any other distribution."""
    base = fn
    wrappers = (torch.distributions.Independent, pyro.distributions.torch_distribution.ExpandedDistribution)
    while isinstance(base, wrappers):
        base = base.base_dist
    if type(base) not in (torch.distributions.Normal, pyro.distributions.Normal):
        return None
    loc, scale = base.loc, base.scale
    if loc.requires_grad or scale.requires_grad:
        return None
    return _constant(loc, shape), _constant(scale, shape)


def _same(a: Param, b: Param) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, float) and isinstance(b, float) and a == b
    return a.shape == b.shape and bool(torch.equal(a, b))


def _normal_log_prob_sum(value: Tensor, loc: Param, scale: Param) -> Tensor:
    r""":math:`-\frac12 \sum_i (w_i - \mu_i)^2 / s_i^2 - \sum_i \log s_i - \frac n2 \log 2\pi`: a few passes over
    the weights instead of those of ``Normal.log_prob``."""
    flat = value.reshape(-1)
    centred = flat if isinstance(loc, float) and loc == 0.0 else flat - loc
    if isinstance(scale, float):
        return -0.5 / scale**2 * torch.dot(centred, centred) - flat.numel() * (math.log(scale) + _HALF_LOG_2PI)
    return -0.5 * (centred / scale).pow(2).sum() - scale.log().sum() - flat.numel() * _HALF_LOG_2PI


def find_constant_normal_priors(model: Callable, args: tuple, kwargs: dict, trace: Any,
                                sites: Sequence[Any]) -> dict[str, tuple[Param, Param]]:
    """Latent sites whose prior is a Normal with fixed parameters, recognised by their values.

    However the prior is written -- ``Normal(0., 1.).expand([m, n]).to_event(2)``, ``Normal(torch.zeros(m, n),
    1.).to_event(2)`` or a ``PyroSample`` -- a site qualifies when its distribution is a (reshaped) Normal whose
    ``loc`` and ``scale`` need no gradient and take the same values in the prototype trace and in a second run of
    the model with fresh draws of every latent variable (so they depend on no other latent variable, e.g. a
    hierarchical scale). They are read at the model's arguments when the potential is built: a prior whose numbers
    change with the arguments of later calls (such as the minibatch) is outside this rule.
    """
    with pyro.validation_enabled(False), poutine.block(), torch.no_grad():
        second = poutine.trace(model).get_trace(*args, **kwargs)
    out = {}
    for s in sites:
        site, other = trace.nodes[s.name], second.nodes.get(s.name)
        if other is None or other.get("type") != "sample" or site["mask"] is not None or other["mask"] is not None:
            continue
        fn, shape = site["fn"], site["value"].shape
        if fn.batch_shape + fn.event_shape != shape:
            continue
        params = _constant_normal(fn, shape)
        other_fn = cast(Distribution, other["fn"])  # a sample site's fn is its distribution
        if params is None or other_fn.batch_shape + other_fn.event_shape != shape:
            continue
        again = _constant_normal(other_fn, shape)
        if again is not None and all(_same(a, b) for a, b in zip(params, again)):
            out[s.name] = params
    return out


class ClosedFormGaussianPrior:
    """The constant-Normal prior terms of a potential, in closed form on the flat vector:

    .. math::

        -\\log p(u) = \\tfrac12 (u - \\mu)^\\top \\Lambda (u - \\mu) + c, \\qquad \\nabla = \\Lambda (u - \\mu),

    with :math:`\\Lambda` diagonal (zero on the other sites). The traced step leaves these terms out of its autograd
    graph and adds them here (a speed device, on by default: the kernels' ``closed_form_prior=False`` turns it off).
    The sites are those whose prior ``find_constant_normal_priors`` finds, on real support (no transform), unmasked,
    unscaled and kept by ``prior_filter`` (typically all network weights).
    """

    def __init__(
        self, sites: Sequence[Any], trace: Any, constant_normal_priors: dict, prior_filter: Optional[Callable],
        dim: int, dtype: torch.dtype, device: Any,
    ) -> None:
        def taken(s: Any) -> bool:
            site = trace.nodes[s.name]
            return (s.is_identity and s.name in constant_normal_priors and site["mask"] is None
                    and isinstance(site["scale"], float) and site["scale"] == 1.0
                    and (prior_filter is None or bool(prior_filter(s.name, site))))

        all_sites, sites = sites, [s for s in sites if taken(s)]
        self.site_names = frozenset(s.name for s in sites)
        self._gaussian_scalar: Optional[tuple[float, float]] = None
        self._gaussian_vectors: Optional[tuple[Tensor, Tensor]] = None
        self._gaussian_const = 0.0
        if not sites:
            return
        params = [constant_normal_priors[s.name] for s in sites]
        self._gaussian_const = sum(
            s.numel * _HALF_LOG_2PI + (s.numel * math.log(sc) if isinstance(sc, float) else float(sc.log().sum()))
            for s, (_, sc) in zip(sites, params)
        )
        scalars = all(isinstance(v, float) for p in params for v in p)
        if len(sites) == len(all_sites) and scalars and len(set(params)) == 1:  # one Normal(loc, scale) everywhere
            self._gaussian_scalar = params[0]
            return
        precision = torch.zeros(dim, dtype=dtype, device=device)
        loc = torch.zeros(dim, dtype=dtype, device=device)
        for s, (mu, sc) in zip(sites, params):
            precision[s.offset : s.offset + s.numel] = sc**-2 if isinstance(sc, float) else sc.to(dtype).pow(-2)
            loc[s.offset : s.offset + s.numel] = mu
        self._gaussian_vectors = (precision, loc)

    def __call__(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        """:math:`-\\log p` of the constant-Normal prior sites and its gradient (see the class). The potential called
        with ``exclude_gaussian_prior=True`` gives the rest, so the sum of both is :math:`\\tilde U`."""
        if self._gaussian_scalar is not None:
            mu, sc = self._gaussian_scalar
            centred = flat if mu == 0.0 else flat - mu
            grad = centred * sc**-2
        else:
            assert self._gaussian_vectors is not None, "no constant-Normal prior site (see site_names)"
            precision, loc = self._gaussian_vectors
            centred = flat - loc
            grad = centred * precision
        return 0.5 * torch.linalg.vecdot(centred, grad) + self._gaussian_const, grad


# ----- the minibatches of a loader ----------------------------------------------------------------------------------
def is_data_loader(arg: Any) -> bool:
    """Whether a model argument handed to ``mcmc.run`` is a loader: an iterable of batches with a ``dataset``
    (a :class:`~torch.utils.data.DataLoader`), or an iterator such as a generator (refused later for want of a
    dataset length). Tensors, containers, NumPy arrays and modules (an ``nn.Sequential`` is iterable) are model
    arguments."""
    if isinstance(arg, (np.ndarray, torch.nn.Module)):
        return False
    if not (isinstance(arg, DataLoader) or hasattr(arg, "dataset") or isinstance(arg, Iterator)):
        return False
    try:
        return is_loader(arg)
    except TypeError:
        return False


def in_dataset_order(loader: Any, *, full_batches: bool = False) -> Any:
    """A loader over the same data as ``loader`` that reads ``loader.dataset`` in data-set order, once: the full-data
    log-likelihood's ``i``-th entry must be data point ``i`` (``az.loo``'s pointwise results map back to its rows).

    For a :class:`~torch.utils.data.DataLoader` over a map-style data set this is a ``DataLoader`` over
    ``loader.dataset`` with the loader's batch size (64 for a loader given a ``batch_sampler``), ``collate_fn``,
    workers and memory pinning, unshuffled and keeping the last batch; any other loader is read as it is. With
    ``full_batches=True`` (for a model whose plate fixes ``subsample_size=b``) every batch has the loader's batch size
    :math:`b`: the last one is the last :math:`b` points, overlapping the one before by :math:`b - (N \\bmod b)`
    points, which the reader drops.

    >>> from torch.utils.data import TensorDataset
    >>> loader = DataLoader(TensorDataset(torch.arange(5.0), torch.arange(5)), batch_size=2, shuffle=True,
    ...                     drop_last=True)
    >>> [y.tolist() for _, y in in_dataset_order(loader)]
    [[0, 1], [2, 3], [4]]
    >>> [y.tolist() for _, y in in_dataset_order(loader, full_batches=True)]
    [[0, 1], [2, 3], [3, 4]]
    """
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    n, b = len(cast(Sized, loader.dataset)), loader.batch_size or 64  # a map-style data set has a length
    if full_batches and b < n:
        starts = list(range(0, n - b, b)) + [n - b]
        order: dict[str, Any] = {"batch_sampler": [list(range(i, i + b)) for i in starts]}
    else:
        order = {"batch_size": b, "shuffle": False, "drop_last": False}
    return DataLoader(
        loader.dataset, collate_fn=loader.collate_fn, num_workers=loader.num_workers, pin_memory=loader.pin_memory,
        worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context, **order,
    )


def _reshuffles(sampler: Any) -> bool:
    """Whether ``sampler`` is one of torch's samplers that draw a fresh random order every epoch."""
    data = torch.utils.data
    if isinstance(sampler, data.DistributedSampler):
        return bool(sampler.shuffle)
    return isinstance(sampler, (data.RandomSampler, data.SubsetRandomSampler, data.WeightedRandomSampler))


def short_batch_size(loader: Any, drop_last: Optional[bool]) -> Optional[int]:
    """The batch size below which a loader's batches are passed over (its ``batch_size``), or ``None`` to keep all.

    A loader of ``batch_size`` :math:`b` over :math:`N` points ends every epoch with a batch of :math:`N \\bmod b`
    points, scaled by :math:`N / (N \\bmod b)`: its gradient noise and curvature (which sets the adapted step) can be
    tens of times a full batch's. ``drop_last=None`` passes it over when the loader reshuffles every epoch (torch's
    ``RandomSampler``, ``SubsetRandomSampler``, ``WeightedRandomSampler``, or ``DistributedSampler`` with
    ``shuffle=True``): each full batch is then a uniform draw, so the potential stays unbiased, and every point is
    still seen over the epochs. Any other loader keeps it: an unshuffled one would leave out the same points in every
    epoch, and a sampler of the user's own has an order the kernel cannot know. ``True`` passes it over for any loader
    with a ``batch_size``, ``False`` keeps it; a loader with one batch, that drops it itself, or without a
    ``batch_size`` (a custom ``batch_sampler``) keeps every batch.
    """
    batch_size = getattr(loader, "batch_size", None)
    if drop_last is False or getattr(loader, "drop_last", False) or not isinstance(batch_size, int):
        return None
    sampler = getattr(loader, "sampler", None)
    if isinstance(getattr(loader, "dataset", None), IterableDataset) or not isinstance(sampler, Sized):
        return None  # no sampler of known length: the loader's own order and sizes
    if drop_last is None and not _reshuffles(sampler):
        return None
    n = len(sampler)  # this process's points per epoch (a DistributedSampler's shard)
    return batch_size if n > batch_size and n % batch_size else None


_END = object()  # the end of an epoch's iterator


class BatchStream:
    """An endless stream of the batches of a loader, epoch after epoch, each as the tensors of the model's arguments
    (``pyro_sdebnn.data.loaders.read_batch``: a tuple or list batch is ``model(*batch)``, a dict batch
    ``model(**batch)``, a tensor ``model(batch)``), each batch read, checked and moved in one pass.

    :param loader: an iterable of batches whose ``dataset`` has a length (e.g. a
        :class:`~torch.utils.data.DataLoader`).
    :param device: where the batches go (the model's device); ``None`` leaves them where they are.
    :param dtype: the model's floating-point dtype (inputs only; integer labels keep theirs).
    :param model: the model the batches are for: the first batch is checked against its signature, and a non-finite
        batch is reported under the name of the model's argument that holds it.
    :param drop_last: pass over the loader's short last batch: ``None`` (automatic: when the loader reshuffles),
        ``True`` or ``False`` (see :func:`short_batch_size`).
    :param dict kwargs: the keyword arguments the model gets besides each batch (those of ``mcmc.run``): a dict
        batch must not repeat them, and the first batch is checked with them. They are not part of :meth:`next`.
    :raises TypeError: if the loader's ``dataset`` has no length.
    :raises ValueError: from :meth:`next`, for a batch holding a NaN or an infinity.
    """

    def __init__(
        self, loader: Any, device: Any = None, dtype: Optional[torch.dtype] = None, model: Optional[Any] = None,
        drop_last: Optional[bool] = None, kwargs: Optional[dict] = None,
    ) -> None:
        self.loader = loader
        self.size = dataset_size(loader)
        self.device, self.dtype, self.model = device, dtype, model
        self.kwargs = dict(kwargs or {})
        self.spec: Any = None  # the structure of the first batch (every batch must have it); None before it is read
        self.keys: tuple[str, ...] = ()  # the first batch's own keyword arguments (a dict batch's keys)
        self.position = 0  # batches taken from the current epoch's iterator
        self.epoch_rng: Optional[Tensor] = None  # torch's CPU RNG state from which that iterator was made
        self.generators = loader_generators(loader)
        self.epoch_generators: list[Tensor] = []  # the states of the loader's generators at that point
        # the one batch size taken: the loader's batch_size (drop_last) or the plate's subsample_size (follow_model)
        self.fixed_batch_size: Optional[int] = short_batch_size(loader, drop_last)
        self.passed_over = 0  # batches of another size passed over
        self._batches: Optional[Iterator] = None

    @property
    def drops_short_batch(self) -> bool:
        """Whether every epoch ends with a short batch that the stream passes over (a batch size is fixed, by
        ``drop_last`` or by the model's ``subsample_size``, and the loader's last batch is shorter)."""
        return self.fixed_batch_size is not None and short_batch_size(self.loader, True) is not None

    def _start_epoch(self, skip: int = 0, lookahead: bool = False) -> None:
        self.epoch_rng = torch.get_rng_state()
        self.epoch_generators = [g.get_state() for g in self.generators]
        raw = iter(self.loader)  # a DataLoader draws its shuffling (and its workers' seeds) here
        for i in range(skip + int(lookahead)):
            try:
                batch = next(raw)
            except StopIteration:
                raise ValueError(f"the loader has fewer than {skip + int(lookahead)} batches per epoch: it is not "
                                 "the loader of the checkpoint") from None
        if lookahead:  # a sampler draws its order lazily, on the epoch's first batch: draw it from this state
            raw = itertools.chain([batch], raw)
        self._batches = raw
        self.position = skip

    def follow_model(self, potential: Any) -> None:
        """Read from the model's ``MinibatchPotential`` whether its data plate fixes its own ``subsample_size``
        (``pyro.plate("data", len(x), subsample_size=b)``): Pyro's plate then cannot run on a shorter batch, so
        :meth:`next` passes over the batches of another size, as ``drop_last=True`` would."""
        site = potential.prototype_trace.nodes.get(potential.data_plate) if potential.data_plate else None
        fixed = getattr(site["fn"], "subsample_size", None) if site is not None and site_is_subsample(site) else None
        if fixed is not None:
            self.fixed_batch_size = int(fixed)

    def _raw_next(self) -> Any:
        if self._batches is None:
            self._start_epoch()
        assert self._batches is not None  # set by _start_epoch
        batch = next(self._batches, _END)
        if batch is _END and self.position != 0:  # the epoch is over: start the next one
            self._start_epoch()
            batch = next(self._batches, _END)
        if batch is _END:
            raise ValueError("the loader yielded no batch in an epoch")
        return batch

    def next(self) -> tuple[Tensor, ...]:
        """The tensors of the next batch (``arguments(tensors, self.spec)`` are the model's), on the model's device,
        starting a new epoch when the loader is exhausted.

        :raises TypeError: for a batch that is not a tuple, list, dict or tensor of tensors, or (the first) that does
            not fit the model's signature (``pyro_sdebnn.data.loaders.batch_arguments``).
        :raises ValueError: for a batch whose tensors do not share their first dimension, holding a NaN or an
            infinity, or of another structure than the first batch (tuple length, dict keys)."""
        while True:
            first = self.spec is None  # checked against the model's signature and the keyword arguments
            leaves, spec, size = read_batch(self._raw_next(), self.position, kwargs=self.kwargs if first else None,
                                            model=self.model if first else None)
            if self.fixed_batch_size is None or size == self.fixed_batch_size:
                break
            # another size (the short last batch; the potential was built on the first, of the fixed size): passed
            # over, counted in the checkpoint's position
            self.position += 1
            self.passed_over += 1
        check_finite_tensors(leaves, lambda: leaf_names(spec, len(leaves), self.model), batch_index=self.position)
        if first:
            self.spec, self.keys = spec, tuple(arguments(leaves, spec)[1])
        else:
            check_same_structure(spec, self.spec, self.position)
        self.position += 1
        return tuple(move_batch(t, self.device, self.dtype) for t in leaves)

    def state_dict(self) -> dict[str, Any]:
        """Where the stream is: ``{"epoch_rng": ByteTensor or None, "generators": [ByteTensor, ...],
        "position": int, "size": int, "passed_over": int, "batching": dict}``."""
        rng = None if self.epoch_rng is None else self.epoch_rng.clone()
        generators = [state.clone() for state in self.epoch_generators]
        return {"epoch_rng": rng, "generators": generators, "position": int(self.position), "size": int(self.size),
                "passed_over": int(self.passed_over), "batching": self._batching()}

    def _batching(self) -> dict[str, Any]:
        """How a :class:`~torch.utils.data.DataLoader` cuts its data set into batches (batch size, ``drop_last``, the
        sampler's type); empty for another iterable. A resumed run must see the same batches."""
        loader = self.loader
        if not isinstance(loader, torch.utils.data.DataLoader):
            return {}
        return {"batch_size": -1 if loader.batch_size is None else int(loader.batch_size),
                "drop_last": bool(loader.drop_last), "sampler": type(loader.sampler).__name__}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the loader's generators are put back in their state at the start of the
        epoch, its iterator is made again from the recorded random state and the batches already taken are skipped;
        torch's global random state is left as it was.

        :raises ValueError: if the loader has another size, batch size, ``drop_last``, sampler type (``shuffle``) or
            other generators than the checkpoint's.
        """
        if int(state["size"]) != self.size:
            raise ValueError(f"the loader has {self.size} data points but the checkpoint was taken with "
                             f"{int(state['size'])}")
        saved_batching, batching = state.get("batching"), self._batching()  # a checkpoint may lack it
        if saved_batching and batching and {k: saved_batching.get(k) for k in batching} != batching:
            raise ValueError(f"the loader cuts its data into batches as {batching}, but the checkpoint's loader did "
                             f"as {dict(saved_batching)}: resume on a loader built as the saved run's (the same "
                             "batch_size, drop_last and shuffle)")
        self.passed_over = int(state.get("passed_over", 0))
        if state["epoch_rng"] is None:
            self._batches, self.position, self.epoch_rng = None, 0, None
            return
        saved = list(state.get("generators", []))
        if len(saved) != len(self.generators):
            raise ValueError(f"the loader draws its order from {len(self.generators)} torch.Generator(s) (generator= "
                             f"of the DataLoader or of its sampler) but the checkpoint's loader from {len(saved)}: "
                             "resume on a loader built as the saved run's")
        for g, g_state in zip(self.generators, saved):
            g.set_state(g_state)
        position = int(state["position"])
        with torch.random.fork_rng(devices=[]):  # torch's random state is put back on exit
            torch.set_rng_state(state["epoch_rng"])
            self._start_epoch(skip=position, lookahead=position == 0)
            self.epoch_rng = state["epoch_rng"].clone()
            self.epoch_generators = [g_state.clone() for g_state in saved]
