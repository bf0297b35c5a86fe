# SPDX-License-Identifier: Apache-2.0
"""The functional-prior potential of fSGLD / fSGHMC (FSGMCMC.md) and the kernel mixin that uses it.

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
(default ``"f"``) by running the model on :math:`X_M` (``model(X_M)``, or ``measurement_args(X_M)``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Union

import pyro
import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger
from pyro.contrib.gp.kernels import Kernel
from torch import Tensor

from pyro_sdebnn.infer.mcmc.base import MinibatchPotential
from pyro_sdebnn.infer.mcmc.measurement_points import MeasurementPoints
from pyro_sdebnn.ops.gp import cholesky_with_jitter, gp_precision_residual

__all__ = ["FunctionalPotential"]


class _NoSampling(Messenger):
    """Replace draws at unobserved, unconditioned sites (the likelihood at ``X_M``) by the distribution's mean.

    Running the model on the measurement points only serves to read the network outputs; a random draw there
    would be wasted work and cannot be vectorised over chains (``vmap`` refuses in-place randomness).
    """

    def _pyro_sample(self, msg: Any) -> None:
        if msg["value"] is None and not msg["is_observed"] and type(msg["fn"]).__name__ != "_Subsample":
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
        subsample_size: Optional[int] = None,
        data_plate: Optional[str] = None,
        transforms: Optional[dict] = None,
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
            cov = gp_kernel(example_points.to(torch.float64)).to(torch.float64)
        _, self.jitter, _ = cholesky_with_jitter(cov, jitter)

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

    def mean_at(self, points: Tensor, like: Tensor) -> Tensor | float:
        if self.gp_mean is None:
            return 0.0
        mean = self.gp_mean(points) if callable(self.gp_mean) else self.gp_mean
        return torch.as_tensor(mean, dtype=like.dtype, device=like.device)

    def cholesky(self, points: Tensor) -> Tensor:
        """Cholesky factor of :math:`K + \\delta I` in float64 (traceable: a failed factorisation gives NaNs)."""
        cov = self.gp_kernel(points.to(torch.float64)).to(torch.float64)
        delta = self.jitter * cov.diagonal().mean()
        eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
        scale_tril, info = torch.linalg.cholesky_ex(cov + delta * eye)
        return scale_tril + torch.where(info > 0, float("nan"), 0.0)

    def __call__(  # type: ignore[override]
        self, flat: Tensor | tuple[Tensor, ...], idx: Optional[Tensor] = None, points: Optional[Tensor] = None,
        scale_tril: Optional[Tensor] = None,
    ) -> Tensor:
        values, logdet = self.unpack(flat)
        trace = self._trace(values, idx)
        potential = -(self.log_density(trace) + logdet)
        f = self.measurement_outputs(values, points)
        if scale_tril is None:
            scale_tril = self.cholesky(points)
        residual = f - self.mean_at(points, f)
        alpha = gp_precision_residual(scale_tril, residual.detach(), self.event_dim).to(f.dtype)  # sg(alpha)
        # value: 1/2 r^T alpha; gradient: J_M^T alpha (surrogate loss of FSGMCMC.md)
        potential = potential + (alpha * residual).sum() - 0.5 * (alpha * residual.detach()).sum()
        if self.weight_prior_scale is not None:
            parts = flat if isinstance(flat, tuple) else self.flat_parts(flat)
            weak = sum(part.pow(2).sum() for s, part in zip(self.sites, parts) if s.name not in self.prior_sites)
            potential = potential + 0.5 * weak / self.weight_prior_scale**2
        return potential


class FunctionalKernelMixin:
    """Turns an SG-MCMC kernel into its functional variant (fSGLD from SGLD, fSGHMC from SGHMC)."""

    def _init_functional(
        self,
        gp_prior: Any,
        measurement_points: Optional[MeasurementPoints],
        num_measurement_data: int,
        num_measurement_box: int,
        gp_mean: Any,
        jitter: float,
        output_site: str,
        prior_sites: Iterable[str],
        weight_prior_scale: Optional[float],
        measurement_args: Optional[Callable],
        output_fn: Optional[Callable] = None,
    ) -> None:
        from pyro_sdebnn.distributions import GPFunctionalPrior

        self._fixed_prior = None
        if isinstance(gp_prior, GPFunctionalPrior):
            # a prior over fixed measurement points: reuse its kernel, jitter, mean and cached Cholesky factor
            self._fixed_prior = gp_prior
            gp_kernel, jitter = gp_prior.kernel, gp_prior.jitter
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
        self._points_cache: Optional[tuple] = None

    def _build_potential(self, args: tuple, kwargs: dict) -> MinibatchPotential:
        if self._fixed_prior is not None:
            example = self._fixed_prior.inputs
        else:
            if self.measurement_points is None:
                if not args or not torch.is_tensor(args[0]):
                    raise ValueError("pass measurement_points= (the model's first argument is not the input tensor)")
                self.measurement_points = MeasurementPoints(
                    args[0], self.num_measurement_data, self.num_measurement_box
                )
            example = self.measurement_points()
        potential = FunctionalPotential(
            self.model,
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
            subsample_size=self.subsample_size,
            data_plate=self.data_plate,
            transforms=self.user_transforms,
        )
        self._points_cache = None
        if self._fixed_prior is not None:
            self._points_cache = (example, self._fixed_prior.scale_tril64)
        elif not self.measurement_points.redraw:
            points = self.measurement_points()
            self._points_cache = (points, potential.cholesky(points))
        return potential

    def _potential_and_grad_inputs(self) -> tuple:
        if self._fixed_prior is not None or not self.measurement_points.redraw:
            return self._points_cache
        points = self.measurement_points()
        if self.measurement_points.redraw_every == 1:
            return (points,)  # the step's graph factorises K itself
        # sets kept for several steps: factorise once per set, outside the graph
        if self._points_cache is None or self._points_cache[0] is not points:
            with torch.no_grad():
                self._points_cache = (points, self.potential.cholesky(points))
        return self._points_cache

    def _potential_fn(self, flat: Tensor, idx: Optional[Tensor], *extra: Tensor) -> Tensor:
        return self.potential(flat, idx, *extra)
