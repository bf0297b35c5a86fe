# SPDX-License-Identifier: Apache-2.0
"""The functional-prior potential of fSGLD / fSGHMC [1] and the kernel mixin that uses it.

The prior is a Gaussian process :math:`GP(m, k)` on the function the network computes, evaluated at a finite set
of measurement points :math:`X_M` (as in functional variational BNNs [2]); the weights get no prior of their own.
Per step, with minibatch :math:`B` (size :math:`b`) and measurement points :math:`X_M`:

.. math::

    \\tilde U(w) = \\frac{N}{b} \\sum_{i \\in B} -\\log p(y_i | f(x_i; w))
        + \\tfrac12 (f_M - m_M)^\\top (K + \\delta I)^{-1} (f_M - m_M),
    \\qquad f_M = f(X_M; w),\\ K = k(X_M, X_M).

The gradient comes from one backward pass of the surrogate
:math:`\\frac{N}{b}\\text{NLL} + \\langle \\mathrm{sg}(\\alpha), f_M \\rangle`,
:math:`\\alpha = (K+\\delta I)^{-1}(f_M - m_M)`
solved in float64 with the Cholesky factor, so that :math:`\\nabla \\tilde U = \\nabla\\text{NLL} + J_M^\\top \\alpha`
without any Jacobian. The network outputs at :math:`X_M` are read from a ``pyro.deterministic`` site of the model
(default ``"f"``).

Two ways to evaluate :math:`f_B` and :math:`f_M`, chosen at set-up:

- *concatenated* (default when the model allows it): the model is traced **once** on the
  concatenated inputs :math:`[x_B; X_M]` (every data argument gathered at the minibatch and extended by the
  measurement arguments, with the targets at :math:`X_M` padded by a copy of a minibatch target); the
  likelihood keeps the first :math:`b` entries of the data plate and :math:`f_M` is the tail of the output site.
  One forward and one backward pass of the network on :math:`b + M` inputs.
- *two traces* (fallback): the model is traced on the minibatch and again on :math:`X_M`
  (``model(X_M)``, or ``measurement_args(X_M)``).

The concatenated path is used only after it reproduced the two-trace potential and gradient at a random point
(models whose data plate size or data arguments do not follow the inputs, or with several data plates, fall back
automatically). Observed sites and ``pyro.factor`` terms outside the data plate are full-data terms (not rescaled).

**References**

[1] `Functional Stochastic Gradient MCMC for Bayesian Neural Networks`,
    Mengjing Wu, Junyu Xuan, Jie Lu. arXiv:2409.16632, 2024.

[2] `Functional Variational Bayesian Neural Networks`,
    Shengyang Sun, Guodong Zhang, Jiaxin Shi, Roger Grosse. ICLR 2019.
"""

from __future__ import annotations

import os
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Optional, Union

import pyro
import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from pyro.contrib.gp.kernels import Kernel
from torch import Tensor

from pyro_sdebnn.infer.mcmc.potential import MinibatchPotential, _no_validation
from pyro_sdebnn.infer.mcmc.measurement_points import MeasurementPoints
from pyro_sdebnn.ops.gp import cholesky_with_jitter, gp_precision_matvec, gp_precision_residual

__all__ = ["FunctionalPotential"]


class _NoSampling(Messenger):
    """Replace draws at unobserved, unconditioned sites (the likelihood at ``X_M``) by the distribution's mean.

    Running the model on the measurement points only serves to read the network outputs; a random draw there
    would be wasted work and cannot be vectorised over chains (``vmap`` refuses in-place randomness).
    """

    def _pyro_sample(self, msg: Any) -> None:
        if msg["value"] is None and not msg["is_observed"] and not site_is_subsample(msg):
            msg["value"] = msg["fn"].mean


def _default_measurement_args(points: Tensor) -> tuple[tuple, dict]:
    return (points,), {}


class FunctionalPotential(MinibatchPotential):
    """Minibatch likelihood plus a GP functional prior on the model's outputs at measurement points.

    :param callable model: Pyro model recording its network outputs in a deterministic site ``output_site``.
    :param tuple model_args: the full data.
    :param dict model_kwargs: model keyword arguments.
    :param Kernel gp_kernel: covariance :math:`k` (``pyro.contrib.gp`` kernel, e.g. ``RBF`` or ``NNGP``).
    :param gp_mean: ``None`` (zero), a tensor broadcastable to ``(M,)``/``(M, C)`` or a callable of :math:`X_M`.
    :param float jitter: relative jitter :math:`\\delta / \\overline{\\operatorname{diag} K}` (raised at set-up if
        the Cholesky factorisation of an example set fails).
    :param str output_site: name of the deterministic site with the network outputs ``(n,)`` or ``(n, C)``.
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
        :class:`~pyro_sdebnn.infer.mcmc.potential.MinibatchPotential`): the positional arguments are the batch
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
        subsample_size: Optional[int] = None,
        data_plate: Optional[str] = None,
        transforms: Optional[dict] = None,
        data_size: Optional[int] = None,
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
        if self.output_site not in trace.nodes:
            raise ValueError(
                f"the model has no site '{self.output_site}': record the network outputs with "
                f"`pyro.deterministic('{self.output_site}', f)` inside the data plate, or pass output_site="
            )
        return trace.nodes[self.output_site]["value"]

    # ----- one trace on the concatenated inputs [x_B; X_M] ------------------------------------------------------
    def _concatenated_args(self, idx: Optional[Tensor], points: Tensor) -> tuple[tuple, dict, int]:
        """Model arguments with every data argument (leading size N) gathered at ``idx`` and extended by its
        measurement-point counterpart (``measurement_args(X_M)``; a missing/``None`` counterpart, e.g. the
        targets, is padded with copies of the first minibatch row, masked out of the likelihood). On a loader's
        batch (``minibatch_mode="batch"``) the data arguments are the positional ones, the batch :math:`(x_B, y_B)`
        of size :math:`b` = ``len(x_B)``."""
        m_args, m_kwargs = self.measurement_args(points)
        num_points = points.shape[0]
        on_batch = self.minibatch_mode == "batch"
        if on_batch:
            batch_size = self.model_args[0].shape[0]
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
        kwargs = {k: extend(v, m_kwargs.get(k), k in m_kwargs) for k, v in self.model_kwargs.items()}
        return args, kwargs, batch_size

    def _concatenated_terms(
        self, values: dict[str, Tensor], idx: Optional[Tensor], points: Tensor, exclude: frozenset = frozenset()
    ) -> tuple[Tensor, Tensor]:
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
                full_data = full_data + term
            else:
                total = total + term
        total = total * (self.data_size / b) + full_data + self.log_density(trace, likelihood=False, exclude=exclude)
        outputs = trace.nodes[self.output_site]["value"]
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
        delta = self.jitter * cov.diagonal(dim1=-2, dim2=-1).mean(-1)
        eye = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
        scale_tril, info = torch.linalg.cholesky_ex(cov + delta[..., None, None] * eye)
        return scale_tril + torch.where(info > 0, float("nan"), 0.0)[..., None, None]

    def precision(self, points: Tensor, *, batched: bool = False) -> Tensor:
        """:math:`(K + \\delta I)^{-1}` in float64 from :meth:`cholesky` (``cholesky_inverse``; NaNs if the
        factorisation fails). Passed as ``precision=`` it replaces the per-step triangular solves by one product."""
        return torch.cholesky_inverse(self.cholesky(points, batched=batched))

    def kernel_matrix(self, points: Tensor) -> Tensor:
        """:math:`k(X_M, X_M)`, evaluated in a private Pyro param-store scope: ``pyro.contrib.gp`` kernels read their
        hyper-parameters from the global store by name, so without the scope a second kernel (e.g. one refitted per
        data split) would silently take the first one's values (as :class:`~pyro_sdebnn.distributions.GPFunctionalPrior` also guards against)."""
        with pyro.get_param_store().scope():
            return self.gp_kernel(points)

    def _batched_kernel(self, points: Tensor) -> Tensor:
        if getattr(self, "_kernel_vmaps", True):
            try:
                return torch.func.vmap(self.kernel_matrix)(points)
            except Exception:  # noqa: BLE001 - a kernel that does not vectorise: evaluate set by set
                self._kernel_vmaps = False
        return torch.stack([self.kernel_matrix(p) for p in points])

    def __call__(  # type: ignore[override]
        self, flat: Tensor | tuple[Tensor, ...], idx: Optional[Tensor] = None, points: Optional[Tensor] = None,
        scale_tril: Optional[Tensor] = None, *, precision: Optional[Tensor] = None,
        exclude_gaussian_prior: bool = False,
    ) -> Tensor:
        values, logdet = self.unpack(flat)
        exclude = self.gaussian_prior_sites if exclude_gaussian_prior else frozenset()
        if self.concatenated:  # one forward pass on [x_B; X_M]
            log_p, f = self._concatenated_terms(values, idx, points, exclude)
        else:  # two traces: minibatch, then measurement points
            log_p = self.log_density(self._trace(values, idx), exclude=exclude)
            f = self.measurement_outputs(values, points)
        potential = -(log_p + logdet)
        residual = f - self.mean_at(points, f)
        if precision is not None:
            alpha = gp_precision_matvec(precision, residual.detach(), self.event_dim).to(f.dtype)  # sg(alpha)
        else:
            if scale_tril is None:
                scale_tril = self.cholesky(points)
            alpha = gp_precision_residual(scale_tril, residual.detach(), self.event_dim).to(f.dtype)
        # value: 1/2 r^T alpha; gradient: J_M^T alpha (the surrogate loss of the module docstring)
        potential = potential + (alpha * residual).sum() - 0.5 * (alpha * residual.detach()).sum()
        if self.weight_prior_scale is not None:
            parts = flat if isinstance(flat, tuple) else self.flat_parts(flat)
            weak = sum(part.pow(2).sum() for s, part in zip(self.sites, parts) if s.name not in self.prior_sites)
            potential = potential + 0.5 * weak / self.weight_prior_scale**2
        return potential


def _usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


class FunctionalKernelMixin:
    """Turns an SG-MCMC kernel into its functional variant (fSGLD from SGLD, fSGHMC from SGHMC)."""

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
        from pyro_sdebnn.distributions import GPFunctionalPrior

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
        self._batch_fns: dict[Any, Any] = {}
        self._pending: Optional[tuple] = None  # the next batch of sets: (seed, None | Future)
        self._worker: Optional[tuple[int, ThreadPoolExecutor]] = None  # (pid, executor)
        super().__init__(model, **kwargs)  # type: ignore[call-arg]

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
        )
        self._points_cache = None
        self._set_queue.clear()
        self._set_uses_left = 0
        self._batch_fns = {}
        self._pending = None
        # what the step receives with X_M: the precision matrix (one product per step) where it is computed once
        # (fixed points) or off the critical path (background thread), else the Cholesky factor (two solves)
        fixed = self._fixed_prior is not None or not self._sampler.redraw
        self._factor_kind = "precision" if fixed or self._background_wanted(potential) else "cholesky"
        if self._fixed_prior is not None:
            self._points_cache = (example, torch.cholesky_inverse(self._fixed_prior.scale_tril64))
        elif fixed:
            points = self._sampler()
            self._points_cache = (points, potential.precision(points))
        return potential

    def _potential_and_grad_inputs(self) -> tuple:
        """``(X_M, factor)`` for the next step, the factor being the Cholesky factor or the precision matrix of
        :math:`K + \\delta I` (``_factor_kind``): a fixed set, or the next of ``prefetch`` fresh sets drawn and
        factorised together (each kept for ``redraw_every`` steps)."""
        if self._fixed_prior is not None or not self._sampler.redraw:
            return self._points_cache
        if self._set_uses_left == 0:
            if not self._set_queue:
                sets, factors = self._next_batch()
                self._set_queue.extend(zip(sets.unbind(0), factors.unbind(0)))
            self._points_cache = self._set_queue.popleft()
            self._set_uses_left = self._sampler.redraw_every
        self._set_uses_left -= 1
        return self._points_cache

    # ----- batches of measurement sets, optionally drawn and factorised in a background thread --------------------
    def _next_batch(self) -> tuple[Tensor, Tensor]:
        """The next ``prefetch`` sets and their factors.

        Each batch comes from its own generator, seeded from the sampler's random stream when the *previous* batch is
        taken; with the background thread the batch is then drawn and factorised while the chain runs. The sets are
        therefore the same with or without the thread, and independent of its timing."""
        if self._pending is None:
            self._pending = self._start_batch()
        seed, future = self._pending
        self._pending = self._start_batch()
        if future is not None:
            return future.result()
        with torch.no_grad():
            return self._batch_fn(background=False)(*self._uniforms(seed))

    def _start_batch(self) -> tuple[int, Optional[Future]]:
        mp = self._sampler
        # the seed comes from the sampler's generator, or else from the CPU's: no device synchronisation per batch
        device = mp.generator.device if mp.generator is not None else "cpu"
        seed = int(torch.randint(0, 2**62, (1,), generator=mp.generator, device=device))
        if not self._in_background():
            return seed, None
        return seed, self._executor().submit(self._draw_and_factorise, self._batch_fn(background=True), seed)

    def _uniforms(self, seed: int) -> tuple[Tensor, Tensor]:
        generator = torch.Generator(device=self._sampler.inputs.device)
        generator.manual_seed(seed)
        return self._sampler.draw_uniforms(self._sampler.prefetch, generator)

    def _draw_and_factorise(self, fn: Callable, seed: int) -> tuple[Tensor, Tensor]:
        """Runs in the worker thread: two random draws, then one call of the traced (or compiled) batch graph."""
        with torch.no_grad():
            return fn(*self._uniforms(seed))

    def _sets_and_factors(self, keys: Tensor, box: Tensor) -> tuple[Tensor, Tensor]:
        sets = self._sampler.sets_from_uniforms(keys, box)
        if self._factor_kind == "precision":
            return sets, self.potential.precision(sets, batched=True)
        return sets, self.potential.cholesky(sets, batched=True)

    def _batch_fn(self, background: bool) -> Callable:
        """``(keys, box) -> (sets, factors)`` run like the step: with the ``fx`` or ``compile`` backend it is traced
        once into a graph (Pyro's kernel code runs only at tracing time; the compiler fuses the kernel arithmetic).
        The worker thread runs the graph op by op (ATen calls release the GIL, so the chain's thread keeps running)
        or, with ``backend="compile"``, compiled with Inductor's C++ wrapper, which releases the GIL for the whole
        call (its Python wrapper would hold it during every fused kernel)."""
        mode = getattr(self, "backend_used", "eager")
        if mode not in ("fx", "compile"):
            return self._sets_and_factors
        compiled = (mode == "compile" and not background) or (background and self.backend == "compile")
        key = ("compile" if compiled else "fx", background and compiled)
        fn = self._batch_fns.get(key)
        if fn is None:
            graph = self._batch_fns.get("graph")
            if graph is None:  # traced here, in the main thread
                from torch.fx.experimental.proxy_tensor import make_fx

                from pyro_sdebnn.infer.mcmc.graph import _lean_graph

                with torch.no_grad(), pyro.validation_enabled(False), poutine.block():
                    graph = make_fx(lambda k, b: self._sets_and_factors(k, b))(*self._uniforms(0))
                _lean_graph(graph)
                self._batch_fns["graph"] = graph
            fn = graph.forward
            if compiled:
                from pyro_sdebnn.infer.mcmc.graph import _compile_graph

                def compile_failed(error: Exception, graph: Any = graph) -> Callable:
                    first_line = str(error).splitlines()[0] if str(error) else ""
                    warnings.warn(
                        f"{self._name}: compiling the measurement-set factorisation failed ({type(error).__name__}: "
                        f"{first_line}); using the traced graph",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    return graph.forward

                fn = _compile_graph(graph, on_failure=compile_failed,
                                    options={"cpp_wrapper": True} if background else None)
                if background:  # compile now, in the main thread
                    with torch.no_grad():
                        fn(*self._uniforms(0))
            self._batch_fns[key] = fn
        return fn

    def _background_wanted(self, potential: MinibatchPotential) -> bool:
        flag = self._sampler.background
        if flag is None:  # default: on the CPU when a second core is there to take the work
            flag = potential.device.type == "cpu" and _usable_cores() > 1
        return bool(flag) and self._sampler.redraw and self.backend != "eager"

    def _in_background(self) -> bool:
        return self._factor_kind == "precision" and getattr(self, "backend_used", "eager") in ("fx", "compile")

    def _executor(self) -> ThreadPoolExecutor:
        if self._worker is None or self._worker[0] != os.getpid():  # none yet, or inherited through a fork
            self._worker = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="pyro-sdebnn-measurement-sets"))
        return self._worker[1]

    def cleanup(self) -> None:
        """Finish the pending background batch and stop the thread (the next run starts a fresh one). The seed of
        the pending batch is kept (its sets are drawn in the calling thread if needed), so a checkpoint written after
        the run continues the measurement-set stream."""
        if self._pending is not None:
            self._pending = (self._pending[0], None)
        if self._worker is not None:
            pid, executor = self._worker
            self._worker = None
            if pid == os.getpid():
                executor.shutdown(wait=True)
        super().cleanup()  # type: ignore[misc]

    # ----- checkpoints ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state of :meth:`SGMCMCKernel.state_dict <pyro_sdebnn.infer.mcmc.base.SGMCMCKernel.state_dict>` plus,
        under ``"functional"``, the measurement-set stream: the current set and its factor and how many more steps
        use it, the sets (and factors) of the current prefetched batch not used yet, the seed of the next batch and
        the state of the sampler's own generator (if it has one), and the jitter :math:`\\delta` chosen at set-up.
        The unused sets are stored rather than drawn again, so a resumed run uses bitwise the same sets whichever
        code path factorised them (at most one batch of ``prefetch`` factors, about 8 MiB with the sampler's
        default ``prefetch``).
        """
        sd = super().state_dict()  # type: ignore[misc]
        generator = None if self._sampler is None else self._sampler.generator
        cache = self._points_cache
        sd["functional"] = {
            "jitter": float(self.potential.jitter),
            "factor_kind": str(self._factor_kind),
            "current": None if cache is None else [cache[0].clone(), cache[1].clone()],
            "uses_left": int(self._set_uses_left),
            "queue": [[points.clone(), factor.clone()] for points, factor in self._set_queue],
            "next_seed": None if self._pending is None else int(self._pending[0]),
            "generator": None if generator is None else generator.get_state(),
        }
        return sd

    def _restore(self, sd: dict[str, Any], warmup_steps: int) -> None:
        """Restore the chain (:meth:`SGMCMCKernel._restore`), then the measurement-set stream of
        :meth:`state_dict`, after the step graph was traced (tracing draws a set, as the uninterrupted run did)."""
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
        if saved["generator"] is not None and (self._sampler is None or self._sampler.generator is None):
            raise ValueError(
                "the checkpoint's measurement points came from a sampler with its own generator: pass "
                "measurement_points=MeasurementPoints(..., generator=...) on resuming, as in the saved run"
            )
        # the jitter (raised at set-up if an example set needed it) and the kind of factor the saved sets carry
        # enter the step graph: restore them before it is traced
        if saved["factor_kind"] != self._factor_kind or float(saved["jitter"]) != self.potential.jitter:
            self._factor_kind = saved["factor_kind"]
            self.potential.jitter = float(saved["jitter"])
            self._reset_graphs()
        super()._restore(sd, warmup_steps)  # type: ignore[misc]
        U = self.potential
        device = self._sampler.inputs.device if self._sampler is not None else U.device

        def pair(p: Optional[list]) -> Optional[tuple[Tensor, Tensor]]:
            return None if p is None else (p[0].to(device), p[1].to(device))

        self._points_cache = pair(current)
        self._set_uses_left = int(saved["uses_left"])
        self._set_queue = deque(pair(p) for p in saved["queue"])
        if saved["generator"] is not None:
            self._sampler.generator.set_state(saved["generator"])
        seed = saved["next_seed"]
        if seed is None:
            self._pending = None
        elif self._in_background():
            self._pending = (seed, self._executor().submit(self._draw_and_factorise, self._batch_fn(True), seed))
        else:
            self._pending = (seed, None)

    def _potential_fn(
        self, flat: Tensor, idx: Optional[Tensor], points: Tensor, factor: Tensor, exclude_gaussian_prior: bool = False
    ) -> Tensor:
        if self._factor_kind == "precision":
            return self.potential(flat, idx, points, precision=factor, exclude_gaussian_prior=exclude_gaussian_prior)
        return self.potential(flat, idx, points, factor, exclude_gaussian_prior=exclude_gaussian_prior)
