# SPDX-License-Identifier: Apache-2.0
"""fSGLD and fSGHMC [1]: SG-MCMC with a Gaussian-process prior on the network outputs, and its potential.

The prior is a Gaussian process :math:`GP(m, k)` on the function the network computes, evaluated at a finite set
of measurement points :math:`X_M` (as in functional variational BNNs [2]); the weights get no prior of their own.
Per step, with minibatch :math:`B` (size :math:`b`) and measurement points :math:`X_M`:

.. math::

    \\tilde U(w) = \\frac{N}{b} \\sum_{i \\in B} -\\log p(y_i | f(x_i; w))
        + \\tfrac12 (f_M - m_M)^\\top (K + \\delta I)^{-1} (f_M - m_M),
    \\qquad f_M = f(X_M; w),\\ K = k(X_M, X_M).

The gradient comes from one backward pass of the surrogate :math:`\\frac{N}{b}\\text{NLL} + \\langle
\\mathrm{sg}(\\alpha), f_M \\rangle` with :math:`\\alpha = (K+\\delta I)^{-1}(f_M - m_M)` solved in float64, so that
:math:`\\nabla \\tilde U = \\nabla\\text{NLL} + J_M^\\top \\alpha` without any Jacobian. The outputs :math:`f` are read
from a ``pyro.deterministic`` site (default ``"f"``) or, for a model written as for NUTS, from the parameter of its
likelihood (the ``loc`` of a ``Normal``, the ``logits`` of a ``Bernoulli`` or ``Categorical``, the latter normalised
to log-probabilities). When it reproduces the two-trace potential and gradient at set-up, the model is traced once
per step on the concatenated inputs :math:`[x_B; X_M]` (one forward and backward pass on :math:`b + M` inputs, the
padded targets at :math:`X_M` masked out of the likelihood); otherwise twice, on the minibatch and on :math:`X_M`.
Observed sites and ``pyro.factor`` terms outside the data plate are full-data terms (not rescaled).

**References**

[1] `Functional Stochastic Gradient MCMC for Bayesian Neural Networks`,
Mengjing Wu, Junyu Xuan, Jie Lu. arXiv:2409.16632, 2024.

[2] `Functional Variational Bayesian Neural Networks`,
Shengyang Sun, Guodong Zhang, Jiaxin Shi, Roger Grosse. ICLR 2019.
"""


from __future__ import annotations

import contextlib
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import pyro
import torch
from pyro import poutine
from pyro.contrib.gp.kernels import Kernel
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from pyro_sdebnn.data.loaders import batch_length
from pyro_sdebnn.distributions import GPFunctionalPrior
from pyro_sdebnn.infer.mcmc.diagnostics import _is_factor
from pyro_sdebnn.infer.mcmc.potential import MinibatchPotential, SubsampleSize, _no_validation
from pyro_sdebnn.infer.mcmc.schedules import StepSizeSchedule
from pyro_sdebnn.infer.mcmc.sghmc import SGHMC
from pyro_sdebnn.infer.mcmc.sgld import SGLD
from pyro_sdebnn.ops.gp import cholesky_with_jitter, gp_precision_matvec, gp_precision_residual

if TYPE_CHECKING:
    from pyro_sdebnn.infer.mcmc.kernel import SGMCMCKernel

    # the mixin is only ever mixed into an SG-MCMC kernel (SGLD, SGHMC), whose attributes and methods it uses
    _KernelBase = SGMCMCKernel
else:
    _KernelBase = object

__all__ = ["FSGHMC", "FSGLD", "MeasurementPoints"]


class _NoSampling(Messenger):
    """Replace draws at unobserved, unconditioned sites (the likelihood at ``X_M``) by the distribution's mean.

    Running the model on the measurement points only serves to read the network outputs; a random draw there
    would be wasted work and cannot be vectorised over chains (``vmap`` refuses in-place randomness).
    """

    def _pyro_sample(self, msg: Any) -> None:
        if msg["value"] is None and not msg["is_observed"] and not site_is_subsample(msg):
            msg["value"] = msg["fn"].mean


def _plus(a: Tensor | float, b: Tensor | float) -> Tensor | float:
    """``a + b`` where either may be the Python ``0.0`` of an absent term (no likelihood outside the data plate, no
    prior kept, no Jacobian): that addition is skipped rather than recorded in the traced step."""
    if isinstance(b, float) and b == 0.0:
        return a
    if isinstance(a, float) and a == 0.0:
        return b
    return a + b


def _default_measurement_args(points: Tensor) -> tuple[tuple, dict]:
    return (points,), {}


def likelihood_outputs(fn: Any) -> Tensor:
    """The network outputs behind a likelihood distribution: ``Normal.loc``, ``Bernoulli.logits`` or
    ``Categorical.logits`` (log-probabilities), through ``Independent``, ``expand`` and ``mask`` wrappers.

    >>> import pyro.distributions as dist
    >>> likelihood_outputs(dist.Normal(torch.ones(3), 1.0).to_event(1))
    tensor([1., 1., 1.])
    >>> likelihood_outputs(dist.Bernoulli(logits=torch.zeros(2)).mask(False))
    tensor([0., 0.])
    """
    inner = fn
    while not isinstance(inner, (pyro.distributions.Normal, pyro.distributions.Bernoulli,
                                 pyro.distributions.Categorical)) and hasattr(inner, "base_dist"):
        inner = inner.base_dist
    if isinstance(inner, pyro.distributions.Normal):
        out = inner.loc
    elif isinstance(inner, (pyro.distributions.Bernoulli, pyro.distributions.Categorical)):
        out = inner.logits
    else:
        raise ValueError(
            f"cannot read network outputs from a {type(fn).__name__} likelihood (Normal, Bernoulli and Categorical "
            "are read): record them with `pyro.deterministic('f', f)` inside the data plate"
        )
    shape = fn.batch_shape + fn.event_shape + out.shape[len(inner.batch_shape) + len(inner.event_shape):]
    return out if out.shape == shape else out.expand(shape)  # a loc broadcast by the scale, an .expand()


class FunctionalPotential(MinibatchPotential):
    """Minibatch likelihood plus a GP functional prior on the model's outputs at measurement points.

    :param callable model: Pyro model recording its network outputs in a deterministic site ``output_site``.
    :param tuple model_args: the full data.
    :param dict model_kwargs: model keyword arguments.
    :param Kernel gp_kernel: covariance :math:`k` (``pyro.contrib.gp`` kernel, e.g. ``RBF`` or ``NNGP``).
    :param gp_mean: ``None`` (zero), a tensor broadcastable to ``(M,)``/``(M, C)`` or a callable of :math:`X_M`.
    :param float jitter: relative jitter :math:`\\delta / \\overline{\\operatorname{diag} K}` (raised at set-up if
        the Cholesky factorisation of an example set fails).
    :param str output_site: name of the deterministic site with the network outputs ``(n,)`` or ``(n, C)``; or of
        the likelihood site, whose distribution gives them (``likelihood_outputs``). Without a site of that
        name, the default ``"f"`` reads them from the model's one observed site in the data plate.
    :param prior_sites: latent sites whose own priors are kept (e.g. an observation-noise scale); the priors of
        all other latent sites (the weights) are dropped.
    :param float weight_prior_scale: optional weak isotropic Gaussian prior on the other sites (a deviation
        from the paper, for numerical safety; default off).
    :param callable measurement_args: maps :math:`X_M` to the model's ``(args, kwargs)`` (default ``((X_M,), {})``).
    :param callable output_fn: alternatively, ``output_fn(values, X_M) -> f(X_M)`` computing the network outputs
        directly from the constrained latent ``values`` (a dict by site name); then the model is not run on
        :math:`X_M` and ``output_site`` is unused.
    :param Tensor example_points: an example set of measurement points, used to check the model and the jitter.
    :param concatenate_inputs: ``None`` (default): trace the model once on :math:`[x_B; X_M]` when that reproduces
        the two-trace potential and gradient at a random point, else trace twice; ``True``: require the
        concatenated path (``ValueError`` if the model does not allow it); ``False``: always trace twice.
    :param int data_size: :math:`N` when ``model_args`` are one batch of a loader (``minibatch_mode="batch"``, see
        ``MinibatchPotential``): the positional arguments are the batch
        :math:`(x_B, y_B)`, concatenated with the measurement arguments on the concatenated path.

    >>> import pyro.contrib.gp as gp
    >>> from pyro_sdebnn.infer.mcmc import BayesianMLP
    >>> x = torch.linspace(-1, 1, 8).unsqueeze(-1); y = x[:, 0] ** 2
    >>> points = torch.linspace(-2, 2, 5).unsqueeze(-1)
    >>> U = FunctionalPotential(BayesianMLP([1, 4, 1]), (x, y), gp_kernel=gp.kernels.RBF(1), example_points=points)
    >>> U(torch.zeros(U.dim), None, points).shape
    torch.Size([])
    """

    def __init__(
        self,
        model: Callable,
        model_args: tuple = (),
        model_kwargs: Optional[dict] = None,
        *,
        gp_kernel: Kernel,
        example_points: Tensor,
        gp_mean: Union[None, Tensor, Callable[[Tensor], Tensor]] = None,
        jitter: float = 1e-4,
        output_site: str = "f",
        prior_sites: Iterable[str] = (),
        weight_prior_scale: Optional[float] = None,
        measurement_args: Optional[Callable[[Tensor], tuple[tuple, dict]]] = None,
        output_fn: Optional[Callable[[dict, Tensor], Tensor]] = None,
        concatenate_inputs: Optional[bool] = None,
        subsample_size: SubsampleSize = None,
        data_plate: Union[None, str, Sequence[str]] = None,
        transforms: Optional[dict] = None,
        data_size: Optional[int] = None,
        batch_keys: Sequence[str] = (),
    ) -> None:
        if not isinstance(gp_kernel, Kernel):
            raise TypeError(f"gp_kernel must be a pyro.contrib.gp.kernels.Kernel, got {type(gp_kernel).__name__}")
        if not jitter > 0:
            raise ValueError(f"jitter must be positive, got {jitter!r}")
        if weight_prior_scale is not None and not weight_prior_scale > 0:
            raise ValueError(f"weight_prior_scale must be positive or None, got {weight_prior_scale!r}")
        prior_sites = frozenset(prior_sites)
        super().__init__(
            model,
            model_args,
            model_kwargs,
            subsample_size=subsample_size,
            data_plate=data_plate,
            prior_filter=lambda name, site: name in prior_sites,
            transforms=transforms,
            data_size=data_size,
            batch_keys=batch_keys,
        )
        unknown = prior_sites - {s.name for s in self.sites}
        if unknown:
            raise ValueError(f"prior_sites {sorted(unknown)} are not latent sites of the model")
        self.gp_kernel = gp_kernel
        self.gp_mean = gp_mean
        self.output_site = output_site
        self.prior_sites = prior_sites
        self.weight_prior_scale = weight_prior_scale
        self.measurement_args = measurement_args or _default_measurement_args
        if output_fn is not None and not callable(output_fn):
            raise TypeError(f"output_fn must be callable, got {type(output_fn).__name__}")
        self.output_fn = output_fn
        # check the model on an example set: the output site exists and has one row per measurement point
        values = {s.name: s.transform(torch.zeros(s.shape, dtype=self.dtype, device=self.device)) for s in self.sites}
        with torch.no_grad(), pyro.validation_enabled(False):
            f = self.measurement_outputs(values, example_points)
        if f.shape[0] != example_points.shape[0] or f.dim() not in (1, 2):
            raise ValueError(
                f"output site '{output_site}' has shape {tuple(f.shape)} at {example_points.shape[0]} measurement "
                "points; expected (M,) or (M, C)"
            )
        self.event_dim = f.dim()
        with torch.no_grad():
            cov = self.kernel_matrix(example_points.to(torch.float64)).to(torch.float64)
        scale_tril, self.jitter, _ = cholesky_with_jitter(cov, jitter)
        if concatenate_inputs not in (None, True, False):
            raise TypeError(f"concatenate_inputs must be None, True or False, got {concatenate_inputs!r}")
        self.concatenated = False
        if concatenate_inputs is not False:
            reason = self._check_concatenation(example_points, scale_tril)
            if reason is None:
                self.concatenated = True
            elif concatenate_inputs:
                raise ValueError(f"concatenate_inputs=True but the model cannot be evaluated on [x_B; X_M]: {reason}")

    def measurement_outputs(self, values: dict[str, Tensor], points: Tensor) -> Tensor:
        """The network outputs :math:`f(X_M; w)` read from the model's ``output_site`` (or ``output_fn``)."""
        if self.output_fn is not None:
            return self.output_fn(values, points)
        args, kwargs = self.measurement_args(points)
        with poutine.block(), _NoSampling():
            trace = poutine.trace(poutine.condition(self.model, data=values)).get_trace(*args, **kwargs)
        return self._outputs(trace)

    def _outputs(self, trace: Any) -> Tensor:
        """The network outputs in a trace: the value of the deterministic ``output_site``, or the parameter of the
        likelihood at that site, or (no such site, default name) at the model's one likelihood site."""
        site = trace.nodes.get(self.output_site)
        if site is None:
            likelihoods = [
                n for n in self.observed_sites
                if not _is_factor(self.prototype_trace.nodes[n])
                and any(f.name == self.data_plate for f in self.prototype_trace.nodes[n]["cond_indep_stack"])
            ]
            if self.output_site != "f" or len(likelihoods) != 1 or likelihoods[0] not in trace.nodes:
                raise ValueError(
                    f"the model has no site '{self.output_site}'"
                    + (f" and {len(likelihoods)} likelihood sites in the data plate" if self.output_site == "f" else "")
                    + f": record the network outputs with `pyro.deterministic('{self.output_site}', f)` inside the "
                    "data plate, or pass output_site= (a deterministic site, or the likelihood site to read its "
                    "Normal loc / Bernoulli or Categorical logits)"
                )
            site = trace.nodes[likelihoods[0]]
        if site["type"] == "sample" and not site["infer"].get("_deterministic", False):
            return likelihood_outputs(site["fn"])
        return site["value"]

    @contextlib.contextmanager
    def bound_data(self, tensors: Sequence[Tensor]) -> Iterator[None]:
        """:meth:`MinibatchPotential.bound_data`, remembering which model argument each of ``tensors`` stands in for
        (:meth:`_original`)."""
        self._bound_originals = {id(new): old for new, old in zip(tensors, self.data_tensors())}
        try:
            with super().bound_data(tensors):
                yield
        finally:
            self._bound_originals = {}

    def _original(self, value: Any) -> Any:
        """The model argument that ``value`` stands in for within :meth:`bound_data` (else ``value``)."""
        return getattr(self, "_bound_originals", {}).get(id(value), value)

    # ----- one trace on the concatenated inputs [x_B; X_M] ------------------------------------------------------
    def _concatenated_args(self, idx: Optional[Tensor], points: Tensor) -> tuple[tuple, dict, int]:
        """Model arguments with every data argument (leading size N) gathered at ``idx`` and extended by its
        measurement-point counterpart (``measurement_args(X_M)``; a missing/``None`` counterpart, e.g. the
        targets, is padded with copies of the first minibatch row, masked out of the likelihood). On a loader's
        batch (``minibatch_mode="batch"``) the data arguments are those of the batch (the positional ones and a dict
        batch's keys, ``batch_keys``), e.g. :math:`(x_B, y_B)`, of size :math:`b` = their first dimension."""
        m_args, m_kwargs = self.measurement_args(points)
        num_points = points.shape[0]
        on_batch = self.minibatch_mode == "batch"
        batch_size: Any  # the minibatch size b (the data size N for full-batch gradients)
        if on_batch:
            batch_size = batch_length(self.model_args, {k: v for k, v in self.model_kwargs.items()
                                                        if k in self.batch_keys})
        else:
            batch_size = self.data_size if idx is None else idx.shape[-1]

        def is_data(value: Any, positional: bool) -> bool:
            if not (torch.is_tensor(value) and value.dim() >= 1):
                return False
            return positional if on_batch else value.shape[0] == self.data_size

        def extend(value: Any, counterpart: Any, present: bool, positional: bool = False) -> Any:
            if not is_data(value, positional):
                if present and counterpart is not value and counterpart is not self._original(value):
                    raise ValueError("a non-data argument differs between the data and measurement calls")
                return value
            batch = value if idx is None else value[idx]
            if counterpart is None:
                pad = batch.narrow(-value.dim(), 0, 1)
                pad = pad.expand(*batch.shape[: batch.dim() - value.dim()], num_points, *value.shape[1:])
            elif torch.is_tensor(counterpart) and counterpart.shape[1:] == value.shape[1:]:
                pad = counterpart.to(value.dtype)
            else:
                raise ValueError("a measurement argument does not match the shape of its data argument")
            return torch.cat([batch, pad], -value.dim())

        args = tuple(
            extend(a, m_args[i] if i < len(m_args) else None, i < len(m_args), True)
            for i, a in enumerate(self.model_args)
        )
        kwargs = {k: extend(v, m_kwargs.get(k), k in m_kwargs, k in self.batch_keys)
                  for k, v in self.model_kwargs.items()}
        return args, kwargs, batch_size

    def _concatenated_terms(
        self, values: dict[str, Tensor], idx: Optional[Tensor], points: Tensor, exclude: frozenset = frozenset()
    ) -> tuple[Tensor | float, Tensor]:
        """:math:`\\frac{N}{b}\\sum_B \\log p(y|f) + \\log p(\\text{kept priors})` and :math:`f_M` from one trace."""
        args, kwargs, b = self._concatenated_args(idx, points)
        # the data plate spans b + M entries: the N/b scaling is applied below to the first b (not by _DataScale)
        trace = poutine.trace(poutine.condition(self.model, data=values)).get_trace(*args, **kwargs)
        total: Tensor | float = 0.0
        full_data: Tensor | float = 0.0  # observed sites and factors outside the data plate: not subsampled
        for name in self.observed_sites:
            site = trace.nodes[name]
            log_p = _no_validation(site["fn"]).log_prob(site["value"])
            if site["mask"] is not None:
                log_p = log_p * site["mask"]
            frame = next((fr for fr in site["cond_indep_stack"] if fr.name == self.data_plate), None)
            if frame is not None:
                log_p = log_p.narrow(log_p.dim() + frame.dim, 0, b)  # drop the padded measurement-point rows
            scale = site["scale"]
            term = log_p.sum() if isinstance(scale, float) and scale == 1.0 else (log_p * scale).sum()
            if frame is None:
                full_data = _plus(full_data, term)
            else:
                total = _plus(total, term)
        assert self.data_size is not None  # this path is taken only for a model with one data plate
        total = _plus(_plus(total * (self.data_size / b), full_data),
                      self.log_density(trace, likelihood=False, exclude=exclude))
        outputs = self._outputs(trace)
        return total, outputs.narrow(0, b, outputs.shape[0] - b)

    def _check_concatenation(self, points: Tensor, scale_tril: Tensor) -> Optional[str]:
        """``None`` if the concatenated path reproduces the two-trace value and gradient, else the reason."""
        if self.output_fn is not None:
            return "output_fn computes the outputs outside the model"
        if self.data_plate is None:
            return "the model has no plate over the data"
        if len(self.data_plates) > 1:
            return f"the model has several data plates {list(self.data_plates)}"
        generator = torch.Generator(device=self.device).manual_seed(0)
        flat = 0.1 * torch.randn(self.dim, generator=generator, dtype=self.dtype, device=self.device)
        assert self.data_size is not None  # set with the data plate, checked above
        b = self.subsample_sizes.get(self.data_plate)
        idx = None if b is None else torch.randperm(self.data_size, generator=generator, device=self.device)[:b]
        results = []
        try:
            for concatenated in (False, True):
                self.concatenated = concatenated
                u = flat.clone().requires_grad_()
                with pyro.validation_enabled(False), poutine.block():
                    value = self(u, idx, points, scale_tril)
                (grad,) = torch.autograd.grad(value, u)
                results.append((value.detach(), grad))
        except Exception as e:  # noqa: BLE001 - any failure means: not concatenable
            return f"{type(e).__name__}: {e}"
        finally:
            self.concatenated = False
        (v0, g0), (v1, g1) = results
        tol = 1e-3 if self.dtype in (torch.float16, torch.bfloat16, torch.float32) else 1e-8
        if not (torch.isfinite(v1) and torch.isfinite(g1).all()):
            return "non-finite potential on the concatenated inputs"
        if (v1 - v0).abs() > tol * (1 + v0.abs()) or (g1 - g0).norm() > tol * (1 + g0.norm()):
            return (
                f"the concatenated potential ({float(v1):.6g}) or its gradient differs from the two-trace one "
                f"({float(v0):.6g}); the data plate or the data arguments do not follow the inputs"
            )
        return None

    def mean_at(self, points: Tensor, like: Tensor) -> Tensor | float:
        if self.gp_mean is None:
            return 0.0
        mean = self.gp_mean(points) if callable(self.gp_mean) else self.gp_mean
        return torch.as_tensor(mean, dtype=like.dtype, device=like.device)

    def cholesky(self, points: Tensor, *, batched: bool = False) -> Tensor:
        """Cholesky factor of :math:`K + \\delta I` in float64 (traceable: a failed factorisation gives NaNs).

        With ``batched=True``, ``points`` holds a leading dimension of independent sets ``(T, M, ...)`` and the
        factors ``(T, M, M)`` come from one kernel evaluation (``torch.func.vmap`` over the sets, or a loop for
        kernels that do not vectorise) and one batched factorisation."""
        points = points.to(torch.float64)
        cov = (self._batched_kernel(points) if batched else self.kernel_matrix(points)).to(torch.float64)
        scale_tril, info = torch.linalg.cholesky_ex(self._with_jitter(cov, fresh=batched))
        return scale_tril.masked_fill_((info > 0)[..., None, None], float("nan"))

    def _with_jitter(self, cov: Tensor, *, fresh: bool) -> Tensor:
        """:math:`K + \\delta I` with :math:`\\delta` = ``jitter`` times the mean diagonal of each matrix; in place
        on a ``fresh`` batch of kernel matrices that owns its memory (the same sums as adding :math:`\\delta I`,
        without two passes over the matrices and two allocations)."""
        delta = self.jitter * cov.diagonal(dim1=-2, dim2=-1).mean(-1)
        if fresh and cov._base is None and cov.is_contiguous():
            cov.diagonal(dim1=-2, dim2=-1).add_(delta[..., None])
            return cov
        # a kernel's output may be a view (``Constant``'s expanded variance) or a tensor the kernel keeps
        return cov + delta[..., None, None] * torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)

    def precision(self, points: Tensor, *, batched: bool = False) -> Tensor:
        """:math:`(K + \\delta I)^{-1}` in float64 from :meth:`cholesky` (``cholesky_inverse``; NaNs if the
        factorisation fails). Passed as ``precision=`` it replaces the per-step triangular solves by one product."""
        return torch.cholesky_inverse(self.cholesky(points, batched=batched))

    def kernel_matrix(self, points: Tensor) -> Tensor:
        """:math:`k(X_M, X_M)`, evaluated in a private Pyro param-store scope: ``pyro.contrib.gp`` kernels read their
        hyper-parameters from the global store by name, so without the scope a second kernel (e.g. one refitted per
        data split) would silently take the first one's values (as
        :class:`~pyro_sdebnn.distributions.GPFunctionalPrior` also guards against)."""
        with pyro.get_param_store().scope():
            return self.gp_kernel(points)

    def _batched_kernel(self, points: Tensor) -> Tensor:
        if getattr(self, "_kernel_vmaps", True):
            try:
                return torch.func.vmap(self.kernel_matrix)(points)
            except Exception:  # noqa: BLE001 - a kernel that does not vectorise: evaluate set by set
                self._kernel_vmaps = False
        return torch.stack([self.kernel_matrix(p) for p in points])

    def __call__(
        self, flat: Tensor | tuple[Tensor, ...], idx: Optional[Tensor] = None, points: Optional[Tensor] = None,
        scale_tril: Optional[Tensor] = None, *, precision: Optional[Tensor] = None,
        exclude_gaussian_prior: bool = False,
    ) -> Tensor:
        if points is None:  # a default only so that the signature overrides MinibatchPotential.__call__
            raise TypeError("FunctionalPotential: points (the measurement set X_M, a tensor) is required")
        values, logdet = self.unpack(flat)
        exclude = self.gaussian_prior_sites if exclude_gaussian_prior else frozenset()
        if self.concatenated:  # one forward pass on [x_B; X_M]
            log_p, f = self._concatenated_terms(values, idx, points, exclude)
        else:  # two traces: minibatch, then measurement points
            log_p = self.log_density(self._trace(values, idx), exclude=exclude)
            f = self.measurement_outputs(values, points)
        potential = -_plus(log_p, logdet)
        residual = f if self.gp_mean is None else f - self.mean_at(points, f)
        fixed = residual.detach()  # sg(r): alpha and the surrogate below carry no gradient through it
        if precision is not None:
            alpha = gp_precision_matvec(precision, fixed, self.event_dim).to(f.dtype)
        else:
            if scale_tril is None:
                scale_tril = self.cholesky(points)
            alpha = gp_precision_residual(scale_tril, fixed, self.event_dim).to(f.dtype)
        # value: alpha^T (r - r/2) = 1/2 r^T alpha; gradient: J_M^T alpha (the surrogate loss of the module docstring)
        potential = potential + (alpha * (residual - 0.5 * fixed)).sum()
        if self.weight_prior_scale is not None:
            parts = flat if isinstance(flat, tuple) else self.flat_parts(flat)
            weak = sum(part.pow(2).sum() for s, part in zip(self.sites, parts) if s.name not in self.prior_sites)
            potential = potential + 0.5 * weak / self.weight_prior_scale**2
        return potential


# ----- measurement points ----------------------------------------------------------------------------------------
class MeasurementPoints:
    """Measurement points :math:`X_M`: ``num_data`` training inputs plus ``num_box`` uniform points in a box.

    The box is the coordinate-wise range of the training inputs widened by ``margin`` times that range on each
    side, so the functional prior also acts where there is no data (which is what gives the extrapolation
    uncertainty). With ``redraw=True`` (default) every call draws a fresh set; with ``redraw=False`` one set is
    drawn at construction and returned every time (the kernels then cache its Cholesky factor).

    :param Tensor inputs: training inputs ``(N,)``, ``(N, d)`` or ``(N, ...)`` (e.g. images).
    :param int num_data: training inputs per set (drawn without replacement; all of them if ``>= N``).
    :param int num_box: uniform box points per set.
    :param float margin: relative widening of the box on each side.
    :param bool redraw: draw new sets (``False``: one fixed set).
    :param int redraw_every: with ``redraw``, keep each set for this many calls (default 1: a new set every step).
        The kernels factorise the kernel matrix once per set, so ``redraw_every > 1`` amortises the
        :math:`O(M^3)` Cholesky factorisation (a deviation from Wu, Xuan and Lu (2024), who draw a new set every
        step).
    :param int prefetch: with ``redraw``, the fSGLD/fSGHMC kernels draw this many independent sets at once
        (:meth:`draw_sets`) and evaluate and factorise their kernel matrices in one batched call, then use one
        set per ``redraw_every`` steps. The sets do not depend on the chain, so this changes nothing but the cost:
        per-call overheads of the draw, the kernel evaluation and the factorisation are paid once per ``prefetch``
        sets instead of once per step. Default ``None``: 64, fewer where the batch of ``M x M`` float64 factors
        would exceed 8 MiB.
    :param torch.Generator generator: optional generator (on the inputs' device) for reproducible sets.

    >>> x = torch.linspace(-1.0, 1.0, 10)
    >>> sampler = MeasurementPoints(x, num_data=4, num_box=3, margin=0.5)
    >>> xm = sampler()
    >>> xm.shape, bool(xm.min() >= -2.0), bool(xm.max() <= 2.0)
    (torch.Size([7]), True, True)
    """

    def __init__(
        self,
        inputs: Tensor,
        num_data: int = 40,
        num_box: int = 40,
        *,
        margin: float = 0.5,
        redraw: bool = True,
        redraw_every: int = 1,
        prefetch: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
    ) -> None:
        if not isinstance(inputs, Tensor) or inputs.dim() < 1 or inputs.shape[0] < 1:
            raise ValueError("inputs must be a tensor of shape (N, ...) with N >= 1")
        for name, value in (("num_data", num_data), ("num_box", num_box)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if num_data + num_box < 1:
            raise ValueError("num_data + num_box must be at least 1")
        if isinstance(redraw_every, bool) or not isinstance(redraw_every, int) or redraw_every < 1:
            raise ValueError(f"redraw_every must be a positive int, got {redraw_every!r}")
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1):
            raise ValueError(f"prefetch must be a positive int or None, got {prefetch!r}")
        if not margin >= 0:
            raise ValueError(f"margin must be non-negative, got {margin!r}")
        self.inputs = inputs
        self.num_data = min(num_data, inputs.shape[0])
        self.num_box = num_box
        self.margin = float(margin)
        self.redraw = bool(redraw)
        self.redraw_every = redraw_every
        self.prefetch = prefetch if prefetch is not None else max(1, min(64, 2**20 // self.num_points**2))
        self.generator = generator
        self._calls = 0
        self._current: Optional[Tensor] = None
        low, high = inputs.min(0).values, inputs.max(0).values
        width = high - low
        self.low, self.high = low - self.margin * width, high + self.margin * width
        self._fixed = None if self.redraw else self.draw()

    @property
    def num_points(self) -> int:
        """:math:`M`, the number of points per set."""
        return self.num_data + self.num_box

    def draw(self) -> Tensor:
        """A fresh set of measurement points ``(M, ...)``."""
        return self.draw_sets(1)[0]

    def draw_sets(self, count: int, generator: Optional[torch.Generator] = None) -> Tensor:
        """``count`` independent fresh sets ``(count, M, ...)`` (training inputs drawn without replacement
        within each set), from ``generator`` (default: the sampler's).

        >>> MeasurementPoints(torch.arange(10.0), num_data=3, num_box=2).draw_sets(4).shape
        torch.Size([4, 5])
        """
        return self.sets_from_uniforms(*self.draw_uniforms(count, generator))

    def draw_uniforms(self, count: int, generator: Optional[torch.Generator] = None) -> tuple[Tensor, Tensor]:
        """The random numbers behind :meth:`draw_sets`: ``count x N`` keys (each set takes the training inputs
        with the ``num_data`` largest keys: a uniform draw without replacement) and ``(count, num_box, ...)``
        uniforms for the box points (empty tensors for a part that is not used)."""
        x, generator = self.inputs, self.generator if generator is None else generator
        num_keys = x.shape[0] if self.num_data else 0
        keys = torch.rand(count, num_keys, generator=generator, device=x.device) if num_keys else x.new_empty(count, 0)
        shape = (count, self.num_box) + x.shape[1:]
        if self.num_box:
            box = torch.rand(shape, generator=generator, dtype=x.dtype, device=x.device)
        else:
            box = x.new_empty(shape)
        return keys, box

    def sets_from_uniforms(self, keys: Tensor, box: Tensor) -> Tensor:
        """Sets ``(count, M, ...)`` from the output of :meth:`draw_uniforms` (deterministic, traceable)."""
        parts = []
        if self.num_data:
            parts.append(self.inputs[keys.topk(self.num_data, dim=1, sorted=False).indices])
        if self.num_box:
            parts.append(self.low + box * (self.high - self.low))
        return torch.cat(parts, 1)

    def __call__(self) -> Tensor:
        if self._fixed is not None:
            return self._fixed
        if self._current is None or self._calls % self.redraw_every == 0:
            self._current = self.draw()
        self._calls += 1
        return self._current


# ----- the kernels -----------------------------------------------------------------------------------------------
class FunctionalKernelMixin(_KernelBase):
    """Turns an SG-MCMC kernel into its functional variant (fSGLD from SGLD, fSGHMC from SGHMC)."""

    potential: Optional[FunctionalPotential]  # the potential _build_potential returns

    def __init__(
        self,
        model: Callable,
        *,
        gp_prior: Any,
        measurement_points: Optional[MeasurementPoints] = None,
        num_measurement_data: int = 40,
        num_measurement_box: int = 40,
        gp_mean: Any = None,
        jitter: float = 1e-4,
        output_site: str = "f",
        prior_sites: Iterable[str] = (),
        weight_prior_scale: Optional[float] = None,
        measurement_args: Optional[Callable] = None,
        output_fn: Optional[Callable] = None,
        concatenate_inputs: Optional[bool] = None,
        **kwargs: Any,
    ) -> None:
        """The functional-prior arguments (documented on :class:`~pyro_sdebnn.infer.mcmc.FSGLD`); ``kwargs`` go to
        the weight-space kernel (SGLD / SGHMC)."""
        self._fixed_prior = None
        if isinstance(gp_prior, GPFunctionalPrior):
            # a prior over fixed measurement points: reuse its kernel, jitter, mean and cached Cholesky factor
            if gp_mean is not None:
                raise ValueError("gp_mean: a GPFunctionalPrior carries its own mean; pass it there, not both")
            self._fixed_prior = gp_prior
            gp_kernel, jitter, gp_mean = gp_prior.kernel, gp_prior.jitter, gp_prior.loc
        elif isinstance(gp_prior, Kernel):
            gp_kernel = gp_prior
        else:
            raise TypeError(
                "gp_prior must be a pyro.contrib.gp.kernels.Kernel (e.g. RBF, NNGP) or a GPFunctionalPrior, got "
                f"{type(gp_prior).__name__}"
            )
        if measurement_points is not None and not isinstance(measurement_points, MeasurementPoints):
            raise TypeError("measurement_points must be a MeasurementPoints sampler or None")
        self.gp_kernel = gp_kernel
        self.measurement_points = measurement_points
        self.num_measurement_data = num_measurement_data
        self.num_measurement_box = num_measurement_box
        self.gp_mean = gp_mean
        self.jitter = jitter
        self.output_site = output_site
        self.prior_sites = tuple(prior_sites)
        self.weight_prior_scale = weight_prior_scale
        self.measurement_args = measurement_args
        self.output_fn = output_fn
        self.concatenate_inputs = concatenate_inputs
        self._points_cache: Optional[tuple] = None
        self._sampler: Optional[MeasurementPoints] = None  # set up per run: the user's sampler or a default one
        self._set_queue: deque = deque()
        self._set_uses_left = 0
        super().__init__(model, **kwargs)

    def _build_potential(self, args: tuple, kwargs: dict) -> MinibatchPotential:
        # the sampler in use: the user's, or a default one over this run's inputs (rebuilt for every new data set)
        self._sampler = self.measurement_points
        if self._fixed_prior is not None:
            example = self._fixed_prior.inputs
        else:
            if self._sampler is None:
                if self._stream is not None:
                    raise ValueError(
                        f"{self._name} over a loader needs measurement_points=: the default draws them from the full "
                        "training inputs, which a loader does not hold in memory. Pass a MeasurementPoints sampler "
                        "over a subset of the inputs on the model's device, e.g. measurement_points=MeasurementPoints("
                        "next(iter(loader))[0]) (or a GPFunctionalPrior on fixed points as gp_prior=)"
                    )
                if not args or not torch.is_tensor(args[0]):
                    raise ValueError("pass measurement_points= (the model's first argument is not the input tensor)")
                self._sampler = MeasurementPoints(args[0], self.num_measurement_data, self.num_measurement_box)
            example = self._sampler()
            if args and torch.is_tensor(args[0]) and example.device != args[0].device:
                raise ValueError(
                    f"measurement_points: the sampler's inputs are on {example.device} but the data reach the model "
                    f"on {args[0].device}; build the MeasurementPoints from inputs on the model's device"
                )
        potential = FunctionalPotential(
            self._model,
            args,
            kwargs,
            gp_kernel=self.gp_kernel,
            example_points=example,
            gp_mean=self.gp_mean,
            jitter=self.jitter,
            output_site=self.output_site,
            prior_sites=self.prior_sites,
            weight_prior_scale=self.weight_prior_scale,
            measurement_args=self.measurement_args,
            output_fn=self.output_fn,
            concatenate_inputs=self.concatenate_inputs,
            subsample_size=self.subsample_size,
            data_plate=self.data_plate,
            transforms=self.user_transforms,
            data_size=None if self._stream is None else self._stream.size,
            batch_keys=self._batch_keys(),
        )
        self._points_cache = None
        self._set_queue.clear()
        self._set_uses_left = 0
        # what the step receives with X_M: the precision matrix (one product per step) where it is computed once
        # (fixed points), else the Cholesky factor of each fresh set (two triangular solves per step)
        if self._fixed_prior is not None:
            self._factor_kind = "precision"
            self._points_cache = (example, torch.cholesky_inverse(self._fixed_prior.scale_tril64))
        else:
            assert self._sampler is not None  # the user's sampler or the default one, set above
            fixed = not self._sampler.redraw
            self._factor_kind = "precision" if fixed else "cholesky"
            if fixed:
                points = self._sampler()
                self._points_cache = (points, potential.precision(points))
        return potential

    def _potential_and_grad_inputs(self) -> tuple:
        """``(X_M, factor)`` for the next step, the factor being the Cholesky factor or the precision matrix of
        :math:`K + \\delta I` (``_factor_kind``): a fixed set, or the next of ``prefetch`` fresh sets drawn and
        factorised together (each kept for ``redraw_every`` steps)."""
        sampler = self._sampler  # set by _build_potential unless the prior has fixed points
        if self._fixed_prior is None and sampler is not None and sampler.redraw:
            if self._set_uses_left == 0:
                if not self._set_queue:
                    sets, factors = self._next_batch()
                    self._set_queue.extend(zip(sets.unbind(0), factors.unbind(0)))
                self._points_cache = self._set_queue.popleft()
                self._set_uses_left = sampler.redraw_every
            self._set_uses_left -= 1
        assert self._points_cache is not None  # the fixed set cached by _build_potential, or the fresh one above
        return self._points_cache

    def _next_batch(self) -> tuple[Tensor, Tensor]:
        """The next ``prefetch`` sets and their factors, drawn from the sampler's generator (else torch's) and
        factorised in one batched call (one kernel evaluation, one batched Cholesky factorisation)."""
        assert self._sampler is not None and self.potential is not None  # both set by _build_potential
        sets = self._sampler.draw_sets(self._sampler.prefetch)
        factorise = self.potential.precision if self._factor_kind == "precision" else self.potential.cholesky
        with torch.no_grad():
            return sets, factorise(sets, batched=True)

    # ----- checkpoints ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state of :meth:`SGMCMCKernel.state_dict <pyro_sdebnn.infer.mcmc.kernel.SGMCMCKernel.state_dict>`
        plus, under ``"functional"``, the measurement-set stream: the current set and its factor and how many more
        steps use it, the sets (and factors) of the current batch not used yet, the state of the sampler's own generator
        (if it has one; otherwise the sets come from torch's, saved with the chain), and the jitter :math:`\\delta`
        chosen at set-up. The unused sets are stored rather than drawn again (at most one batch of ``prefetch``
        factors).
        """
        sd = super().state_dict()
        assert self.potential is not None  # super().state_dict() raised before the first run
        generator = None if self._sampler is None else self._sampler.generator
        cache = self._points_cache
        sd["functional"] = {
            "jitter": float(self.potential.jitter),
            "factor_kind": str(self._factor_kind),
            "current": None if cache is None else [cache[0].clone(), cache[1].clone()],
            "uses_left": int(self._set_uses_left),
            "queue": [[points.clone(), factor.clone()] for points, factor in self._set_queue],
            "generator": None if generator is None else generator.get_state(),
        }
        return sd

    def _restore(self, sd: dict[str, Any], warmup_steps: int) -> None:
        """Restore the chain (:meth:`SGMCMCKernel._restore`), then the measurement-set stream of
        :meth:`state_dict`."""
        assert self.potential is not None  # setup restores after building the potential
        saved = sd.get("functional")
        if not isinstance(saved, dict):
            raise ValueError(
                f"the checkpoint has no measurement-set state: it was not written by an {self._name} kernel"
            )
        current = saved["current"]
        if current is not None and self._sampler is not None and current[0].shape[0] != self._sampler.num_points:
            raise ValueError(
                f"the checkpoint's measurement sets have {current[0].shape[0]} points but measurement_points draws "
                f"{self._sampler.num_points}: resume with the sampler settings of the saved run"
            )
        generator = None if self._sampler is None else self._sampler.generator
        if saved["generator"] is not None and generator is None:
            raise ValueError(
                "the checkpoint's measurement points came from a sampler with its own generator: pass "
                "measurement_points=MeasurementPoints(..., generator=...) on resuming, as in the saved run"
            )
        # the jitter (raised at set-up if an example set needed it) and the kind of factor the saved sets carry
        # enter the step graph
        if saved["factor_kind"] != self._factor_kind or float(saved["jitter"]) != self.potential.jitter:
            self._factor_kind = saved["factor_kind"]
            self.potential.jitter = float(saved["jitter"])
            self._reset_graphs()
        super()._restore(sd, warmup_steps)
        device = self._sampler.inputs.device if self._sampler is not None else self.potential.device

        def pair(p: Optional[list]) -> Optional[tuple[Tensor, Tensor]]:
            return None if p is None else (p[0].to(device), p[1].to(device))

        self._points_cache = pair(current)
        self._set_uses_left = int(saved["uses_left"])
        self._set_queue = deque(pair(p) for p in saved["queue"])
        if saved["generator"] is not None and generator is not None:  # (a saved state without one raised above)
            generator.set_state(saved["generator"])

    def _potential_fn(
        self,
        flat: Tensor | tuple[Tensor, ...],  # the flat vector, or its flat_parts (the step differentiates those)
        idx: Optional[Tensor],
        *extra: Tensor,
        exclude_gaussian_prior: bool = False,
    ) -> Tensor:
        points, factor = extra  # from _potential_and_grad_inputs
        assert self.potential is not None  # built by setup before any step
        if self._factor_kind == "precision":
            return self.potential(flat, idx, points, precision=factor, exclude_gaussian_prior=exclude_gaussian_prior)
        return self.potential(flat, idx, points, factor, exclude_gaussian_prior=exclude_gaussian_prior)


class FSGLD(FunctionalKernelMixin, SGLD):
    """Functional stochastic-gradient Langevin dynamics [1]: SGLD on the functional-prior potential.

    .. math::

        \\tilde U(w) = \\frac{N}{b} \\sum_{i \\in B} -\\log p(y_i | f(x_i; w))
            + \\tfrac12 (f_M - m_M)^\\top (K + \\delta I)^{-1} (f_M - m_M),
        \\qquad w \\leftarrow w - \\frac{\\eta_t}{2} \\nabla \\tilde U(w) + \\sqrt{\\eta_t T}\\, \\xi

    with :math:`f_M = f(X_M; w)` at measurement points :math:`X_M` and a GP prior :math:`\\mathcal{GP}(m, k)`. The
    model's weight-space prior is dropped, as in [1]. The outputs :math:`f` are a deterministic site (default
    ``"f"``) or, for a model written as for NUTS, the parameter of its likelihood (see the module);
    :doc:`/methods/sgmcmc` explains the measurement points and loaders and runs an example. All settings of
    :class:`~pyro_sdebnn.infer.mcmc.SGLD` apply, with [1]'s noise :math:`\\xi` by default (``integrator="euler"``): the
    gradient's noise from measurement points redrawn every step grows with the step, which the Leimkuhler--Matthews
    noise (``"lm"``, SGLD's default, with a step three times larger) does not correct.

    :param callable model: the Pyro model.
    :param gp_prior: a ``pyro.contrib.gp`` kernel (``RBF``, :class:`~pyro_sdebnn.kernels.NNGP`, ...; fit it with
        :func:`pyro_sdebnn.distributions.fit_gp_kernel`), or a :class:`~pyro_sdebnn.distributions.GPFunctionalPrior`
        on fixed measurement points (its cached Cholesky factor is reused).
    :param measurement_points: a :class:`~pyro_sdebnn.infer.mcmc.functional.MeasurementPoints` sampler; by default
        ``num_measurement_data`` training inputs plus ``num_measurement_box`` box points, redrawn every step. Required
        over a loader (unless ``gp_prior`` is a ``GPFunctionalPrior``).
    :param gp_mean: GP mean: ``None`` (zero), a tensor or a callable of :math:`X_M`.
    :param float jitter: relative jitter :math:`\\delta/\\sigma_f^2` (raised at set-up if needed).
    :param str output_site: deterministic site with the network outputs, or a likelihood site whose distribution
        gives them; without a site named ``"f"``, the model's one likelihood site in the data plate.
    :param prior_sites: latent sites whose priors are kept (e.g. ``("sigma",)``).
    :param float weight_prior_scale: optional weak isotropic weight prior scale (a deviation from [1], off by default).
    :param callable measurement_args: ``X_M -> (args, kwargs)`` of the model.
    :param callable output_fn: ``output_fn(values, X_M) -> f(X_M)`` instead of running the model on :math:`X_M`.
    :param concatenate_inputs: ``None``: one pass on :math:`[x_B; X_M]` when it reproduces the two-trace potential
        at set-up; ``True``: require it; ``False``: always trace twice.

    **References.** [1] Mengjing Wu, Junyu Xuan, Jie Lu (2024). "Functional Stochastic Gradient MCMC for Bayesian
    Neural Networks". arXiv:2409.16632.
    """

    _name = "fSGLD"
    _faster_mixing = "fSGHMC"

    def __init__(self, model: Callable, *, step_size: Union[float, StepSizeSchedule] = 1e-5, integrator: str = "euler",
                 **kwargs: Any) -> None:
        super().__init__(model, step_size=step_size, integrator=integrator, **kwargs)


class FSGHMC(FunctionalKernelMixin, SGHMC):
    """Functional stochastic-gradient HMC [1]: SGHMC on the functional-prior potential of
    :class:`~pyro_sdebnn.infer.mcmc.FSGLD`.

    .. math::

        v \\leftarrow (1 - \\eta c) v - \\eta \\nabla \\tilde U(w) + \\sqrt{2 \\eta (c - \\hat B) T}\\, \\xi,
        \\qquad w \\leftarrow w + \\eta v

    Momentum resampling every ``resample_momentum_every`` returned samples follows the paper's Alg. 2 (which
    resamples at each outer iteration). Arguments: those of :class:`~pyro_sdebnn.infer.mcmc.FSGLD` (functional
    prior, measurement points, output site) and of :class:`~pyro_sdebnn.infer.mcmc.SGHMC` (friction, noise
    estimate). Loaders (``mcmc.run(loader)``, with ``measurement_points=``) and checkpoints work as for
    :class:`~pyro_sdebnn.infer.mcmc.FSGLD`.

    *A collapsed chain is not a divergence.* With too little friction for the step size the chain can stay finite
    and still be useless (a constant function, dead hidden units whose weights drift unopposed since the weight
    prior is dropped, a kinetic temperature well above :math:`T`). Nothing in it is non-finite, so the divergence
    check does not see it: watch ``diagnostics()["kinetic temperature"]`` (remedies on
    :class:`~pyro_sdebnn.infer.mcmc.SGHMC`) and the function-space diagnostics
    (:func:`~pyro_sdebnn.infer.mcmc.arviz.function_space_diagnostics`).

    **References**

    [1] Mengjing Wu, Junyu Xuan, Jie Lu (2024). "Functional Stochastic Gradient MCMC for Bayesian Neural
    Networks". arXiv:2409.16632.

    >>> import pyro.contrib.gp as gp
    >>> from pyro.infer import MCMC
    >>> from pyro_sdebnn.infer.mcmc import BayesianMLP
    >>> x = torch.linspace(-1, 1, 20).unsqueeze(-1); y = torch.sin(3 * x[:, 0])
    >>> model = BayesianMLP([1, 10, 1], noise_scale=0.1)
    >>> kernel = FSGHMC(model, gp_prior=gp.kernels.RBF(1), step_size=1e-4, friction=10.0, num_steps=2,
    ...                 subsample_size=10, num_measurement_data=5, num_measurement_box=5)
    >>> mcmc = MCMC(kernel, num_samples=5, warmup_steps=5, disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> mcmc.get_samples()["layers.1.bias"].shape
    torch.Size([5, 1])
    """

    _name = "fSGHMC"

    def __init__(self, model: Callable, *, step_size: Union[float, StepSizeSchedule] = 1e-4, **kwargs: Any) -> None:
        super().__init__(model, step_size=step_size, **kwargs)
