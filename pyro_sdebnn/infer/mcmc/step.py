# SPDX-License-Identifier: Apache-2.0
"""STEP_DOC"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import pyro
import torch
from pyro import poutine
from torch import Tensor

from pyro_sdebnn.infer.mcmc.graph import _compile_graph, _lean_graph


class StepBackends:
    """The inner step of :class:`~pyro_sdebnn.infer.mcmc.base.SGMCMCKernel` and its backends (a mixin)."""

    def _take_step(self, step_fn: Callable, state: tuple, eta: Tensor) -> tuple:
        """One inner step on the next minibatch (indices with tensors, the next batch with a loader)."""
        idx = self._next_indices()
        data = self._next_data()
        extra = self._potential_and_grad_inputs()
        if data is None:
            return step_fn(state, idx, eta, *extra)
        if self.backend_used != "eager" and [t.shape for t in data] == getattr(self, "_graph_shapes", None):
            self._batch_data = data
            try:
                return step_fn(state, idx, eta, *extra)
            finally:
                self._batch_data = None
        # a batch of another shape than the traced one (the last, smaller batch of an epoch): the per-step trace
        with self._bind(data):
            return self._eager_step(state, idx, eta, *extra)

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
        self._graph_shapes = [t.shape for t in data]
        self._auto = {"fx_steps": 0, "decided": self.backend != "auto"}
        self.backend_used = backend
        return self._wrap_graph(_compile_graph(graph) if backend == "compile" else graph.forward)

    def _wrap_graph(self, run: Callable) -> Callable:
        num_state, has_idx = self._graph_layout
        data = self._graph_data  # the model's data tensors, read afresh by every call

        def step_fn(state: tuple, idx: Optional[Tensor], step_size: Tensor, *extra: Tensor) -> tuple:
            inputs = data if self._batch_data is None else self._batch_data  # a loader's batch replaces the data
            out = run(*state, idx, step_size, *extra, *inputs) if has_idx else run(*state, step_size, *extra, *inputs)
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

    def _auto_switch(self) -> None:
        """``backend="auto"``: compile the step graph once the chain has taken ``compile_after`` inner steps with the
        eager graph.

        The kernel does not know how many samples ``MCMC`` will ask for: a short run never pays the compilation (a
        few seconds), a long one runs compiled (2-3x faster per step on CPU). The switch point is a number of steps,
        not a measured time: the compiled step rounds differently from the eager graph, so a switch at a time-dependent
        step would give different chains for the same seed (two runs of fSGLD on two moons differed in their ECE).
        """
        auto = self._auto
        if auto["decided"]:
            return
        auto["fx_steps"] += self.num_steps
        if auto["fx_steps"] >= self.compile_after:
            auto["decided"] = True
            self._step_fn = self._wrap_graph(_compile_graph(self._graph_module, self._compile_failed))
            self.backend_used = "compile"


    def build_step_fn(self) -> Callable:
        """The inner step ``(state, idx, step_size, *extra) -> (state, potential)`` (traced/compiled once)."""
        if self._step_fn is None:
            self._step_fn = self._make_step_fn()
        return self._step_fn
