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
(default ``"f"``). A model without that site, written as for NUTS, gives them through its likelihood: the parameter
of the distribution at its one observed site in the data plate, the ``loc`` of a ``Normal`` and the ``logits`` of a
``Bernoulli`` or ``Categorical`` (``Categorical`` normalises them to log-probabilities, so the prior is then on
:math:`\\log \\mathrm{softmax}(f)`, the part of :math:`f` that the likelihood sees).

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

from typing import Any, Callable, Iterable, Optional, Sequence, Union

import pyro
import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from pyro.contrib.gp.kernels import Kernel
from torch import Tensor

from pyro_sdebnn.infer.mcmc.model_checks import _is_factor
from pyro_sdebnn.infer.mcmc.potential import MinibatchPotential, SubsampleSize, _no_validation
from pyro_sdebnn.ops.gp import cholesky_with_jitter, gp_precision_matvec, gp_precision_residual

__all__ = ["FunctionalPotential", "likelihood_outputs"]


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
        the likelihood site, whose distribution gives them (:func:`likelihood_outputs`). Without a site of that
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
        subsample_size: SubsampleSize = None,
        data_plate: Union[None, str, Sequence[str]] = None,
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
                full_data = full_data + term
            else:
                total = total + term
        assert self.data_size is not None  # this path is taken only for a model with one data plate
        total = total * (self.data_size / b) + full_data + self.log_density(trace, likelihood=False, exclude=exclude)
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
