# SPDX-License-Identifier: Apache-2.0
"""The kernel side of fSGLD / fSGHMC [1]: the functional-prior potential and its stream of measurement sets.

:class:`FunctionalKernelMixin` turns a weight-space kernel (SGLD, SGHMC) into its functional variant: the potential
is a :class:`~pyro_sdebnn.infer.mcmc.FunctionalPotential`, and every step gets a measurement set :math:`X_M` and a
factor of :math:`K + \\delta I` as extra inputs. Fresh sets (the default: a new set every step) are drawn
``prefetch`` at a time and factorised in one batched call, in the sampler's random stream; the chain is therefore
the same whatever the number of torch threads.

**References**

[1] `Functional Stochastic Gradient MCMC for Bayesian Neural Networks`,
    Mengjing Wu, Junyu Xuan, Jie Lu. arXiv:2409.16632, 2024.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

import torch
from pyro.contrib.gp.kernels import Kernel
from torch import Tensor

from pyro_sdebnn.distributions import GPFunctionalPrior
from pyro_sdebnn.infer.mcmc.functional import FunctionalPotential
from pyro_sdebnn.infer.mcmc.measurement_points import MeasurementPoints
from pyro_sdebnn.infer.mcmc.potential import MinibatchPotential

if TYPE_CHECKING:
    from pyro_sdebnn.infer.mcmc.base import SGMCMCKernel

    # the mixin is only ever mixed into an SG-MCMC kernel (SGLD, SGHMC), whose attributes and methods it uses
    _KernelBase = SGMCMCKernel
else:
    _KernelBase = object

__all__ = ["FunctionalKernelMixin"]


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
        with torch.no_grad():
            if self._factor_kind == "precision":
                return sets, self.potential.precision(sets, batched=True)
            return sets, self.potential.cholesky(sets, batched=True)

    # ----- checkpoints ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state of :meth:`ResumableState.state_dict <pyro_sdebnn.infer.mcmc.checkpoint.ResumableState.state_dict>` plus,
        under ``"functional"``, the measurement-set stream: the current set and its factor and how many more steps
        use it, the sets (and factors) of the current batch not used yet, the state of the sampler's own generator
        (if it has one; otherwise the sets come from torch's, saved with the chain), and the jitter :math:`\\delta`
        chosen at set-up. The unused sets are stored rather than drawn again (at most one batch of ``prefetch``
        factors, about 8 MiB with the sampler's default ``prefetch``).
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
