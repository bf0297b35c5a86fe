# SPDX-License-Identifier: Apache-2.0
"""The inner step of the SG-MCMC kernels and its backends.

One inner step on a minibatch is the gradient of the minibatch potential and one pure update rule of
:mod:`pyro_sdebnn.ops.sgmcmc` (``StepBackends._single_step``), e.g. for SGLD

.. math::

    \\hat g, \\tilde U = \\nabla \\tilde U(w), \\tilde U(w), \\qquad
    w \\leftarrow w - \\frac{\\eta}{2} \\hat g + \\sqrt{\\eta T}\\, \\xi, \\quad \\xi \\sim \\mathcal N(0, I).

The backends run that same step:

- ``"eager"``: as written, Pyro's effect handlers running at every step (any model; the slowest);
- ``"fx"``: traced once by ``make_fx`` into a graph of ATen calls (Pyro is then out of the loop), run op by op
  (the graph is run as traced: hand-written passes that folded constants and dropped aliases and identity
  operations took 5 of its 124 nodes on a 2-50-50-1 network and bought no measurable time, so they were removed);
- ``"compile"``: that graph compiled by ``torch.compile``;
- ``"auto"`` (default): ``"fx"``, compiled once the chain has taken ``compile_after`` inner steps (a step count, not a
  measured time, so that the same seed gives the same chain on any machine).

The data are inputs of the graph, never constants (nothing computed from them is frozen in); tensors the model reads
from outside (module parameters, a GP kernel's hyper-parameters) stay references, so a change in place is seen. Each
shape of the data inputs gets its own graph: the last, shorter batch of a loader's epoch is traced once, like the others.

Tracing runs the step once, drawing its noise. The first graph of a fresh chain draws it from torch's random stream,
as the first step always has (so a given seed keeps giving the chain it gave); every later trace (another batch
shape, or the first one after resuming from a checkpoint) puts the random state back, so that the chain does not
depend on when a graph was traced.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Optional

import pyro
import torch
from pyro import poutine
from torch import Tensor

from pyro_sdebnn.infer.mcmc.graph import _compile_graph

if TYPE_CHECKING:
    # the kernel's attributes and methods the mixin uses (the kernel itself would be a cycle: it subclasses the mixin)
    from pyro_sdebnn.infer.mcmc.base import _KernelAttributes as _KernelBase
else:
    _KernelBase = object


def _batch_size(key: tuple) -> int:
    """The leading size of the first data tensor of a graph's key (its shapes), 0 for none."""
    return int(key[0][0]) if key and len(key[0]) else 0


class StepBackends(_KernelBase):
    """The inner step of :class:`~pyro_sdebnn.infer.mcmc.base.SGMCMCKernel` and its backends (a mixin: it reads the
    kernel's potential, update rule, chains and ``backend``)."""

    def _reset_graphs(self) -> None:
        """Forget the traced graphs (new data or model): the next step traces again."""
        self._graphs: dict[Any, Callable] = {}  # shapes of the data inputs -> the graph's runner
        self._graph_modules: dict[Any, Any] = {}  # shapes of the data inputs -> the traced graph
        self.backend_used = "fx" if self.backend == "auto" else self.backend
        self._fx_steps = 0  # inner steps taken with the eager graph (backend="auto")
        self._resumed = False  # a chain restored from a checkpoint: its first trace must not draw (see the module)

    @property
    def _graph_module(self) -> Any:
        """The first traced graph (``None`` before the first traced step)."""
        return next(iter(self._graph_modules.values()), None)

    # ----- the step ----------------------------------------------------------------------------------------------
    def _single_step(
        self, state: tuple, idx: Optional[Tensor], step_size: Tensor, precond: Tensor, *extra: Tensor
    ) -> tuple:
        """One inner step for one chain: returns ``(new_state_tuple, potential)``. ``precond`` is the constant
        diagonal preconditioner of the update rule (the kernel's ``_precond``: ones until warm-up adapts it)."""
        # differentiate w.r.t. the per-site pieces, not the flat vector: the gradient of a slice of the flat vector
        # is a zero-padded copy of length D per site; one concatenation of the pieces' gradients is one pass
        U = self.potential
        assert U is not None  # built by setup
        parts = U.flat_parts(state[0])
        split = U.has_gaussian_prior  # Gaussian weight priors in closed form, outside the autograd graph
        grads, value = torch.func.grad_and_value(self._potential_fn)(parts, idx, *extra, exclude_gaussian_prior=split)
        grad = torch.cat(grads)
        if split:
            prior_value, prior_grad = U.gaussian_prior(state[0])
            grad, value = grad + prior_grad, value + prior_value
        noise = torch.randn_like(state[0])
        new_state = self._update(noise, self._state_type(*state), grad, step_size, precond)
        return tuple(new_state), value

    def _chains_step(
        self, state: tuple, idx: Optional[Tensor], step_size: Tensor, precond: Tensor, *extra: Tensor
    ) -> tuple:
        """:meth:`_single_step` for every chain (``vmap`` over the leading chain dimension; one preconditioner,
        shared by the chains)."""
        if self.vectorized_chains == 1:
            return self._single_step(state, idx, step_size, precond, *extra)
        in_dims = (0, None if idx is None else 0, None, None) + (None,) * len(extra)
        return torch.func.vmap(self._single_step, in_dims=in_dims, randomness="different")(
            state, idx, step_size, precond, *extra
        )

    def _eager_step(self, state: tuple, idx: Optional[Tensor], step_size: Tensor, *extra: Tensor) -> tuple:
        """The step with Pyro's handlers running (``backend="eager"``), chain by chain, with the kernel's current
        preconditioner ``_precond``."""
        precond = self._precond

        def one(chain_state: tuple, chain_idx: Optional[Tensor]) -> tuple:
            # no argument validation in the hot loop, as in the traced step (the model was validated at set-up):
            # a non-finite state gives a non-finite potential, reported as a divergence, not a validation error
            with torch.enable_grad(), pyro.validation_enabled(False):
                position = chain_state[0].detach().requires_grad_()
                value = self._potential_fn(position, chain_idx, *extra)
                (grad,) = torch.autograd.grad(value, position)
            with torch.no_grad():
                new_state = self._update(
                    torch.randn_like(position), self._state_type(*chain_state), grad, step_size, precond
                )
            return tuple(new_state), value.detach()

        if self.vectorized_chains == 1:
            return one(state, idx)
        outs = [one(tuple(t[k] for t in state), None if idx is None else idx[k]) for k in range(self.vectorized_chains)]
        new_state = tuple(torch.stack([o[0][j] for o in outs]) for j in range(len(state)))
        return new_state, torch.stack([o[1] for o in outs])

    def _take_step(self, state: tuple, eta: Tensor) -> tuple:
        """One inner step on the next minibatch (indices with tensors, the next batch with a loader)."""
        idx = self._next_indices()
        data = self._next_data()
        extra = tuple(self._potential_and_grad_inputs())
        if self.backend_used != "eager":
            out = self._graph_step(state, idx, eta, extra, data)
            if out is not None:
                return out
        with self._bind(data):
            return self._eager_step(state, idx, eta, *extra)

    def build_step_fn(self) -> Callable:
        """The inner step ``(state, idx, step_size, *extra) -> (state, potential)`` on the model's current data
        (with the traced backends, the graph is traced on the first call). The step uses the kernel's current
        preconditioner."""

        if self.backend_used == "eager":
            return self._eager_step

        def step(state: tuple, idx: Optional[Tensor], step_size: Tensor, *extra: Tensor) -> tuple:
            out = self._graph_step(state, idx, step_size, extra, None)
            return self._eager_step(state, idx, step_size, *extra) if out is None else out

        return step

    # ----- the traced graph ----------------------------------------------------------------------------------------
    def _graph_step(
        self, state: tuple, idx: Optional[Tensor], step_size: Tensor, extra: tuple, data: Optional[tuple]
    ) -> Optional[tuple]:
        """The step through the graph traced for the shapes of ``data`` (the model's own data tensors if ``None``);
        ``None`` if the model cannot be traced (``backend="auto"`` then continues eagerly)."""
        assert self.potential is not None  # built by setup
        if data is None:
            data = self.potential.data_tensors()
        key = tuple(t.shape for t in data)
        run = self._graphs.get(key)
        if run is None and self._graphs and self._t < self._epoch_steps() and _batch_size(key) < max(
                _batch_size(k) for k in self._graphs):
            # a smaller batch than one traced (a loader's short last batch, once per epoch) is traced from the second
            # epoch on: a one-epoch run would pay a whole trace for one step (the caller takes the step eagerly). The
            # rule depends on the step count only, so that a resumed chain steps as the uninterrupted one
            return None
        if run is None:
            run = self._trace_graph(state, idx, step_size, extra, data, key)
            if run is None:
                return None
        # the preconditioner is an input of the graph (a constant tensor multiply per step; it changes only at the
        # ends of the warm-up's adaptation windows)
        if idx is None:
            out = run(*state, step_size, self._precond, *extra, *data)
        else:
            out = run(*state, idx, step_size, self._precond, *extra, *data)
        return tuple(out[: len(state)]), out[len(state)]

    def _trace_graph(
        self, state: tuple, idx: Optional[Tensor], step_size: Tensor, extra: tuple, data: tuple, key: Any
    ) -> Optional[Callable]:
        from torch.fx.experimental.proxy_tensor import make_fx

        num_state, has_idx, num_data = len(state), idx is not None, len(data)
        U = self.potential
        assert U is not None  # built by setup

        def flat_step(*flat: Tensor) -> tuple[Tensor, ...]:  # (*state, [idx], step_size, precond, *extra, *data)
            inputs, batch = flat[: len(flat) - num_data], flat[len(flat) - num_data :]
            rest = inputs[num_state:]
            chain_idx, rest = (rest[0], rest[1:]) if has_idx else (None, rest)
            with U.bound_data(batch):
                new_state, value = self._chains_step(inputs[:num_state], chain_idx, *rest)
            return (*new_state, value)

        device = U.device
        random_state: ContextManager[Any]
        if self._graph_modules or self._resumed:
            random_state = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
        else:
            random_state = contextlib.nullcontext()
        try:
            with random_state, pyro.validation_enabled(False), poutine.block(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph = make_fx(flat_step)(
                    *state, *([idx] if has_idx else []), step_size, self._precond, *extra, *data
                )
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
                stacklevel=3,
            )
            self.backend_used = "eager"
            return None
        self._graph_modules[key] = graph
        self._graphs[key] = self._runner(graph)
        return self._graphs[key]

    def _runner(self, graph: Any) -> Callable:
        if self.backend_used == "compile":
            return _compile_graph(graph, functools.partial(self._compile_failed, graph))
        return graph.forward

    def _compile_failed(self, graph: Any, error: Exception) -> Callable:
        first_line = str(error).splitlines()[0] if str(error) else ""
        warnings.warn(
            f"{self._name}: compiling the step failed ({type(error).__name__}: {first_line}); continuing with the "
            "eager graph (backend='fx')",
            RuntimeWarning,
            stacklevel=2,
        )
        self.backend_used = "fx"
        self._fx_steps = -1  # backend="auto" does not try again
        return graph.forward

    def _auto_switch(self) -> None:
        """``backend="auto"``: compile the step graphs once the chain has taken ``compile_after`` inner steps with the
        eager graph.

        The kernel does not know how many samples ``MCMC`` will ask for: a short run never pays the compilation (a
        few seconds), a long one runs compiled (2-3x faster per step on CPU). The switch point is a number of steps,
        not a measured time: the compiled step rounds differently from the eager graph, so a switch at a time-dependent
        step would give different chains for the same seed.
        """
        if self.backend != "auto" or self.backend_used != "fx" or self._fx_steps < 0:
            return
        self._fx_steps += self.num_steps
        if self._fx_steps >= self.compile_after:
            self.backend_used = "compile"
            self._graphs = {key: self._runner(graph) for key, graph in self._graph_modules.items()}
