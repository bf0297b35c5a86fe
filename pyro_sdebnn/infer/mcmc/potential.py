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
(Pyro's ``plate`` then scales the likelihood by :math:`N/b`). A model may have several data plates (for example
two data sets of sizes :math:`N_1` and :math:`N_2`), each subsampled with its own size :math:`b_p` and scaled by its
own :math:`N_p/b_p`; observed sites and ``pyro.factor`` terms outside every data plate are full-data terms
(scale 1):

.. math::

    \\tilde U(u) = -\\sum_p \\frac{N_p}{b_p} \\sum_{i \\in B_p} \\log p(y_{p,i} | w)
                   - \\sum_{\\text{full-data terms } t} \\log p_t(w) - \\log p(w) - \\log |\\det J_{T}(u)|.

This is an unbiased estimate of the full-data potential because the minibatches :math:`B_p` are uniform draws
without replacement of each plate (Welling and Teh, 2011). The data are validated when the potential is built:
a non-finite value in a tensor argument of the model or in an observed value, or an observed value outside the
support of its distribution, is reported as a data problem (naming the argument or site) instead of surfacing as a
divergence of the sampler.

The module is longer than the others (about 560 lines) because :class:`MinibatchPotential` carries the three
ways a minibatch reaches a model (plate indices, sliced arguments, a loader's batch) with their index bookkeeping;
what it checks in the model and data is in :mod:`~pyro_sdebnn.infer.mcmc.model_checks`, the closed-form Gaussian
prior in :mod:`~pyro_sdebnn.infer.mcmc.gaussian_prior`.

**References**

[1] `Bayesian Learning via Stochastic Gradient Langevin Dynamics`,
    Max Welling, Yee Whye Teh. ICML 2011.
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence, Union

import pyro
import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import Message
from pyro.poutine.util import site_is_subsample
from torch import Tensor
from torch.distributions import biject_to
from torch.distributions.transforms import ComposeTransform, IndependentTransform
from torch.utils._pytree import tree_flatten, tree_unflatten

from pyro_sdebnn.infer.mcmc.gaussian_prior import (
    ClosedFormGaussianPrior,
    _normal_log_prob_sum,
    find_constant_normal_priors,
)
from pyro_sdebnn.infer.mcmc.model_checks import (
    _check_finite_arguments,
    _check_latents_outside_plate,
    _check_observed_values,
    _check_subsample_size,
    _data_plate_names,
    _is_deterministic,
    _trace_explained,
    find_data_plates,
)

__all__ = ["MinibatchPotential"]

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
    """Scale every site inside a data plate ``p`` by :math:`N_p / b`, :math:`b` being the plate's size in this run.

    Used when the model is run on a minibatch itself (a batch of a loader, or the data arguments sliced by the
    minibatch indices): its plate ``pyro.plate("data", len(x))`` then has the minibatch size :math:`b`, and this
    handler restores the :math:`N/b` scaling that a subsampled ``pyro.plate`` would apply.
    """

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

        \\tilde U(u) = -\\sum_{\\text{sites } s} \\text{scale}_s \\log p_s(v_s) - \\log|\\det J_T(u)|

    where the subsample of every subsampled data plate :math:`p` is set to its minibatch indices (scale
    :math:`N_p/b_p` on the terms inside it). Observed sites and ``pyro.factor`` terms outside the data plates are
    full-data terms (scale 1). With several subsampled plates, the indices ``idx`` handed to the potential are the
    concatenation of each plate's indices in the order of ``subsampled_plates`` (see :meth:`join_indices`).

    The model reaches a minibatch in one of three ways (``minibatch_mode``): ``"index"`` when it indexes the data
    with the plate's indices (the minibatch indices are the plate's subsample); ``"slice"`` for a plain model
    (``with pyro.plate("data", len(x)): ... obs=y``) under ``subsample_size``: every tensor argument whose leading
    dimension is the plate's size :math:`N` is sliced by the minibatch indices and the sites of the data plate are
    scaled by :math:`N/b`; ``"batch"`` with ``data_size=N``: the arguments are one minibatch already (a loader's
    batch) and the data plate, of size :math:`b` = its batch size, is scaled by :math:`N/b`.

    :param callable model: a Pyro model; its likelihood sits in a plate over the data, with the network weights
        sampled outside that plate. Local latent variables (sampled inside a subsampled data plate) are not
        supported under subsampling.
    :param tuple model_args: positional arguments of the model (the full data; one minibatch with ``data_size``).
    :param dict model_kwargs: keyword arguments of the model.
    :param subsample_size: minibatch size :math:`b`: an int for every data plate, a dict
        ``{plate name: size}`` (the plates it names are the subsampled data plates; other plates are not
        subsampled), or ``None`` for full-batch gradients.
    :param data_plate: name (or list of names) of the plate(s) over the data; by default the plates of the observed
        sites (the plate that contains every observed site, else each observed site's own plate).
    :param prior_filter: optional ``(name, site) -> bool`` keeping only the prior terms of the latent sites it
        accepts (used by the functional kernels, which drop the weight-space prior).
    :param dict transforms: optional ``{site: transform}`` from constrained to unconstrained space (as for Pyro's
        ``HMC``); other sites use ``biject_to(support).inv``.
    :param int data_size: the number of data points :math:`N` when ``model_args`` are one minibatch of them (a
        batch of a loader); excludes ``subsample_size``. The model must then have one data plate.

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

    Two data sets, each subsampled with its own size, and a penalty on the weights outside the data plates:

    >>> def model2(x1, y1, x2, y2):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     pyro.factor("penalty", -w**2)
    ...     with pyro.plate("first", len(x1)) as i:
    ...         pyro.sample("y1", dist.Normal(w * x1[i], 1.0), obs=y1[i])
    ...     with pyro.plate("second", len(x2)) as j:
    ...         pyro.sample("y2", dist.Normal(w * x2[j], 1.0), obs=y2[j])
    >>> U2 = MinibatchPotential(model2, (x, y, x[:6], y[:6]), subsample_size={"first": 5, "second": 2})
    >>> U2.subsampled_plates, U2.data_sizes
    (('first', 'second'), {'first': 10, 'second': 6})
    >>> U2(torch.zeros(1), U2.join_indices({"first": torch.arange(5), "second": torch.tensor([0, 3])})).shape
    torch.Size([])

    A plain model (no plate indices), under subsampling and on one batch of a loader:

    >>> def plain(x, y=None):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)):
    ...         pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)
    >>> MinibatchPotential(plain, (x, y), subsample_size=5).minibatch_mode
    'slice'
    >>> U3 = MinibatchPotential(plain, (x[:4], y[:4]), data_size=10)
    >>> U3.minibatch_mode, U3.data_size
    ('batch', 10)
    """

    # the model's data plates, set by ``_find_data_plates`` (and ``_use_batch_data_size`` for a loader's batch)
    data_plates: tuple[str, ...]
    data_sizes: dict[str, int]
    subsample_sizes: dict[str, int]
    subsampled_plates: tuple[str, ...]
    batch_size: Optional[int]
    # the first data plate, for code written for one plate
    data_plate: Optional[str]
    data_size: Optional[int]

    def __init__(
        self,
        model: Callable,
        model_args: tuple = (),
        model_kwargs: Optional[dict] = None,
        *,
        subsample_size: SubsampleSize = None,
        data_plate: Union[None, str, Sequence[str]] = None,
        prior_filter: Optional[Callable[[str, dict], bool]] = None,
        transforms: Optional[dict] = None,
        data_size: Optional[int] = None,
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable, got {type(model).__name__}")
        _check_subsample_size(subsample_size)
        data_plates = _data_plate_names(data_plate)
        if data_size is not None:
            if isinstance(data_size, bool) or not isinstance(data_size, int) or data_size < 1:
                raise ValueError(f"data_size must be a positive int (the number of data points N), got {data_size!r}")
            if subsample_size is not None:
                raise ValueError(
                    "data_size= (the model arguments are one minibatch of N data points) excludes subsample_size=: "
                    "the minibatch size is the size of the batch the model is run on"
                )
        # how a minibatch reaches the model: "index" (the subsample of the data plate indexes the full data),
        # "slice" (the data arguments are sliced by the minibatch indices and the data plate scaled by N/b) or
        # "batch" (the arguments are a minibatch already, e.g. a loader's batch; the data plate scaled by N/b)
        self.minibatch_mode = "batch" if data_size is not None else "index"
        self.model = model
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs or {})
        self.prior_filter = prior_filter
        self.user_transforms = dict(transforms or {})
        _check_finite_arguments(model, self.model_args, self.model_kwargs)
        with pyro.validation_enabled(False), poutine.block():
            trace = _trace_explained(model, self.model_args, self.model_kwargs, data_plates)
        self.prototype_trace = trace
        self._find_sites(trace)
        _check_observed_values(trace, self.observed_sites)
        self._find_data_plates(trace, data_plates, subsample_size)
        if data_size is not None:
            self._use_batch_data_size(data_size)
        # the model with its data plates scaled by N / (the plate's size in the run): for a minibatch run as data
        self._data_scaled_model = _DataScale(self.data_sizes)(model)
        self._constant_normal_priors = find_constant_normal_priors(
            model, self.model_args, self.model_kwargs, trace, self.sites
        )
        self._closed_form_prior = ClosedFormGaussianPrior(
            self.sites, trace, self._constant_normal_priors, prior_filter, self.dim, self.dtype, self.device
        )
        self.gaussian_prior_sites = self._closed_form_prior.site_names
        self.subsample_size = subsample_size
        if self.subsample_sizes:
            # local latent variables are fine with full-batch gradients, not with a subsampled plate
            _check_latents_outside_plate(trace, self.subsampled_plates)
            self._check_subsampling()
        elif data_size is not None:
            _check_latents_outside_plate(trace, self.data_plates)

    def _use_batch_data_size(self, data_size: int) -> None:
        """The model arguments are one minibatch of ``data_size`` points: the data plate is scaled by ``N/b``."""
        if len(self.data_plates) != 1:
            raise ValueError(
                "with a loader the model must have exactly one plate over the data (found "
                f"{list(self.data_plates) or 'none'}): put the likelihood in `with pyro.plate('data', len(x)):`, or "
                "name the plate with data_plate="
            )
        assert self.data_plate is not None  # set with the one data plate
        self.data_sizes = {self.data_plate: data_size}
        self.data_size = data_size
        self.subsample_sizes = {}
        self.subsampled_plates = ()
        self.batch_size = None


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

    @property
    def has_gaussian_prior(self) -> bool:
        """Whether some sites' prior terms can be taken out of the traced potential (see :meth:`gaussian_prior`)."""
        return bool(self.gaussian_prior_sites)

    def gaussian_prior(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        """:math:`-\\log p` of the constant-Normal prior sites and its gradient, in closed form on the flat vector
        (:class:`~pyro_sdebnn.infer.mcmc.gaussian_prior.ClosedFormGaussianPrior`)."""
        return self._closed_form_prior(flat)


    def _find_data_plates(
        self, trace: Any, names: Optional[tuple[str, ...]], subsample_size: SubsampleSize
    ) -> None:
        names, sizes, batch = find_data_plates(trace, self.observed_sites, names, subsample_size)
        self.data_plates = names
        self.data_sizes = sizes
        self.subsample_sizes = batch
        self.subsampled_plates = tuple(batch)
        self.batch_size = sum(batch.values()) if batch else None
        # the first data plate, for code written for one plate
        self.data_plate = names[0] if names else None
        self.data_size = sizes[names[0]] if names else None

    def _check_subsampling(self) -> None:
        """Run the model once on a minibatch, as the model indexing the data with the plate's indices
        (``minibatch_mode="index"``); if that fails and one plate is subsampled, as a plain model run on the data
        arguments sliced by the minibatch indices (``minibatch_mode="slice"``)."""
        plates = ", ".join(f"'{p}' (size {b})" for p, b in self.subsample_sizes.items())
        error = self._try_minibatch()
        if error is None:
            return
        if len(self.subsampled_plates) == 1:
            self.minibatch_mode = "slice"
            leaves, _ = tree_flatten((self.model_args, self.model_kwargs))
            sliced = any(torch.is_tensor(t) and t.dim() >= 1 and t.shape[0] == self.data_size for t in leaves)
            second = self._try_minibatch() if sliced else None
            if sliced and second is None:
                return
            self.minibatch_mode = "index"
        e = error
        first_line = str(e).splitlines()[0] if str(e) else ""
        p = self.subsampled_plates[0]
        raise ValueError(
            f"running the model with a minibatch of plate {plates} failed ({type(e).__name__}: {first_line}). "
            "The likelihood must either index the data with the plate's indices "
            f"(`with pyro.plate('{p}', len(x)) as idx: pyro.sample(..., obs=y[idx])`, f(x[idx])) or, for a plain "
            f"model (`with pyro.plate('{p}', len(x)): pyro.sample(..., obs=y)`), take the data as arguments whose "
            f"leading dimension is the plate's size {self.data_sizes[p]} (they are then sliced by the minibatch "
            "indices)."
        ) from e

    def _try_minibatch(self) -> Optional[Exception]:
        """Trace the model on a minibatch in the current ``minibatch_mode``: the error, or ``None`` if it worked."""
        idx = self.join_indices(
            {p: torch.arange(b, device=self.device) for p, b in self.subsample_sizes.items()}
        )
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
                if b is None or not frame.vectorized:
                    continue
                if len(shape) >= -frame.dim and shape[frame.dim] != b:
                    return ValueError(
                        f"observed site '{name}' has batch size {shape[frame.dim]} on plate '{frame.name}' under a "
                        f"minibatch of {b}: index the data with the plate's indices (obs=y[idx])."
                    )
        return None

    # ----- minibatch indices -----------------------------------------------------------------------------------
    def join_indices(self, indices: Mapping[str, Tensor]) -> Optional[Tensor]:
        """The ``idx`` argument of the potential from each subsampled plate's minibatch indices ``{plate: (..., b_p)}``
        (their concatenation along the last dimension, in the order of ``subsampled_plates``)."""
        if not self.subsampled_plates:
            return None
        unknown = set(indices) - set(self.subsampled_plates)
        if unknown:
            raise ValueError(
                f"join_indices: {sorted(unknown)} are not subsampled plates "
                f"(subsampled: {list(self.subsampled_plates)})"
            )
        parts = []
        for p in self.subsampled_plates:
            if p not in indices:
                raise ValueError(f"join_indices: no indices for the subsampled plate '{p}'")
            if indices[p].shape[-1] != self.subsample_sizes[p]:
                raise ValueError(
                    f"join_indices: plate '{p}' takes {self.subsample_sizes[p]} indices, got {indices[p].shape[-1]}"
                )
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

        Each plate is permuted afresh and cut into :math:`\\lfloor N_p / b_p \\rfloor` minibatches; the pass has as
        many minibatches as the plate with the fewest (each minibatch is a uniform draw without replacement of
        every plate, so the potential is an unbiased estimate of the full-data potential)."""
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
        # read at every step: flattened once while model_args and model_kwargs stay the same objects
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
        self._bound_originals = {id(new): old for new, old in zip(tensors, self.data_tensors())}
        self.model_args, self.model_kwargs = tree_unflatten(leaves, spec)
        try:
            yield
        finally:
            self.model_args, self.model_kwargs = saved
            self._bound_originals = {}

    def _original(self, value: Any) -> Any:
        """The model argument that ``value`` stands in for within :meth:`bound_data` (else ``value``)."""
        return getattr(self, "_bound_originals", {}).get(id(value), value)

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
        args = self.model_args if args is None else args
        kwargs = self.model_kwargs if kwargs is None else kwargs
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
        value = -(self.log_density(trace, exclude=exclude) + logdet)
        if not torch.is_tensor(value):  # every term excluded: a model that is only a fixed Normal prior
            value = torch.full((), value, dtype=self.dtype, device=self.device)
        return value
