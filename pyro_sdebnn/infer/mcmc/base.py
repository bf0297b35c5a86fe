# SPDX-License-Identifier: Apache-2.0
"""The base class of the SG-MCMC kernels.

A Pyro model is traced once (in :meth:`SGMCMCKernel.setup`) to learn its latent sites, their supports and
the plate over the data (:mod:`pyro_sdebnn.infer.mcmc.potential`). From that the kernel builds a *functional* potential of one flat unconstrained
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

import math
import time
import warnings
from typing import Any, Callable, NamedTuple, Optional, Union

import pyro
import torch
from pyro import poutine
from pyro.infer.autoguide.initialization import InitMessenger, init_to_sample
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from torch import Tensor

from pyro_sdebnn.infer.mcmc.graph import _arg_key, _compile_graph, _graph_is_stale, _lean_graph
from pyro_sdebnn.infer.mcmc.potential import MinibatchPotential, _check_subsample_size
from pyro_sdebnn.infer.mcmc.schedules import StepSizeSchedule, as_schedule

__all__ = ["MinibatchPotential", "SGMCMCKernel", "SamplerDivergenceError"]

_BACKENDS = ("auto", "eager", "fx", "compile")
_ON_DIVERGENCE = ("raise", "continue")


class SamplerDivergenceError(RuntimeError):
    """Raised when an SG-MCMC chain produces a non-finite potential, gradient or position (or one whose square
    overflows), or when an op of the step raises on such a state (chained as ``__cause__``)."""


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
        subsample_size: Union[None, int, dict[str, int]] = None,
        data_plate: Union[None, str, list[str]] = None,
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
        _check_subsample_size(subsample_size)
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
        # the key holds the version counters of the tensors: data changed in place also rebuild the potential
        # (validating the data again) and trace the step again
        if self.potential is None or key != self._graph_key:
            self.potential = self._build_potential(args, kwargs)
            self.transforms = dict(self.potential.transforms)
            self._step_fn = None
            self._graph_key = key
            self._args = (args, kwargs)  # keep the arguments alive: ids are only meaningful while they are
        elif self._step_fn is not None and _graph_is_stale(getattr(self._step_fn, "graph_module", None)):
            self._step_fn = None  # a tensor the graph folded constants from (not an argument) changed in place
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
        if not U.subsample_sizes:
            return None
        if self._batches is None or self._batch_pos >= len(self._batches):
            # one pass over the data: (batches, [chains,] indices of every subsampled plate, concatenated)
            self._batches = U.index_batches(self.vectorized_chains)
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
        # the data are inputs of the graph, not constants: nothing computed from them is folded into the graph
        data = self.potential.data_tensors()
        num_state, has_idx, num_data = len(state), idx is not None, len(data)

        def flat_step(*flat: Tensor) -> tuple[Tensor, ...]:  # flat tensors in and out: no pytree in the hot loop
            # (*state, [idx], step_size, *extra, *data)
            inputs = flat[: len(flat) - num_data]
            with self.potential.bound_data(flat[len(flat) - num_data :]):
                new_state, value = step(
                    inputs[:num_state], inputs[num_state] if has_idx else None, inputs[num_state + has_idx],
                    *inputs[num_state + has_idx + 1 :],
                )
            return (*new_state, value)

        try:
            with pyro.validation_enabled(False), poutine.block(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph = make_fx(flat_step)(*state, *([idx] if has_idx else []), eta, *extra, *data)
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
        self._graph_module, self._graph_layout, self._graph_data = graph, (num_state, has_idx), data
        self._auto = {"fx_seconds": 0.0, "fx_steps": 0, "compiled": None, "decided": self.backend != "auto"}
        self.backend_used = backend
        return self._wrap_graph(_compile_graph(graph) if backend == "compile" else graph.forward)

    def _wrap_graph(self, run: Callable) -> Callable:
        num_state, has_idx = self._graph_layout
        data = self._graph_data  # the model's data tensors, read afresh by every call

        def step_fn(state: tuple, idx: Optional[Tensor], step_size: Tensor, *extra: Tensor) -> tuple:
            out = run(*state, idx, step_size, *extra, *data) if has_idx else run(*state, step_size, *extra, *data)
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
