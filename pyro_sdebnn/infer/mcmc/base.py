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
``backend="auto"`` runs this graph eagerly and compiles it after ``compile_after`` inner steps
(see :meth:`SGMCMCKernel._auto_switch`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections import deque
from typing import Any, Callable, NamedTuple, Optional, Union

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from torch import Tensor

from pyro_sdebnn.data.loaders import move_batch
from pyro_sdebnn.infer.mcmc._chains import chain_transforms
from pyro_sdebnn.infer.mcmc.batches import BatchStream, is_data_loader
from pyro_sdebnn.infer.mcmc.initialization import init_to_robust
from pyro_sdebnn.infer.mcmc.graph import _arg_key, _compile_graph, _graph_is_stale, _lean_graph
from pyro_sdebnn.infer.mcmc.potential import MinibatchPotential, _check_subsample_size
from pyro_sdebnn.infer.mcmc.schedules import StepSizeSchedule, as_schedule

__all__ = ["MinibatchPotential", "SGMCMCKernel", "SamplerDivergenceError"]

_BACKENDS = ("auto", "eager", "fx", "compile")
_ON_DIVERGENCE = ("raise", "continue")
# thresholds of the energy check (documented in SGMCMCKernel's docstring)
_MAD_MULTIPLE = 20.0  # robust standard deviations above the reference level
_HISTORY = 128  # energies kept over the whole run (decimated by two whenever full)
_RECENT = 32  # the most recent energies
_MIN_HISTORY = 8  # samples before the spread is estimated
_EARLY_MULTIPLE = 100.0  # before that: the energy may not exceed its lowest value by 100 (|level| + T (D + 10) + 1)
_AUTO_MAP_STEPS = 500  # the automatic MAP warm start (map_steps=None): at most that many Adam steps
_MAP_WINDOW = 50  # ... stopped once the mean potential of a window of that many steps levels off
_MAX_HALVINGS = 30  # the warm-up step-size search gives up below 2**-30 of the initial step size


class _ModelOverLoader:
    """The model as ``kernel.model`` shows it: the user's model, which also accepts the loader of ``mcmc.run(loader)``.

    Tools that call ``kernel.model(*mcmc._args)`` (ArviZ's ``az.from_pyro`` does, for the observed data and the
    pointwise log-likelihood) then run the model once on the whole data set: the loader's ``(x, y)`` batches are
    concatenated, moved to the model's device, and torch's random state is left as it was (a shuffling loader draws
    from it). This holds the whole data set in memory once; :func:`pyro_sdebnn.infer.mcmc.from_pyro` streams it instead.
    Any other call is passed to the model unchanged.
    """

    def __init__(self, model: Callable) -> None:
        self.model = model
        self.device: Any = None
        self.dtype: Optional[torch.dtype] = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and is_data_loader(args[0]):
            from pyro_sdebnn.data.loaders import iter_batches

            with torch.random.fork_rng(devices=[]):  # a shuffling loader draws from torch's generator
                xs, ys = zip(*iter_batches(args[0], self.device, self.dtype))
            args = (torch.cat(xs), torch.cat(ys)) + args[1:]
        return self.model(*args, **kwargs)


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


def _chain_finite(state: tuple) -> Tensor:
    """Per chain, whether its state is finite with a representable square (:func:`_finite_state`): a bool tensor of
    shape ``(chains,)`` for a ``(chains, D)`` state, ``(1,)`` for a ``(D,)`` one."""
    chains = state[0].shape[0] if state[0].dim() > 1 else 1
    return torch.stack(
        [(t.abs() <= _representable_bound(t.dtype)).reshape(chains, -1).all(-1) for t in state]
    ).all(0)


def _model_device_dtype(model: Callable) -> tuple[Any, Optional[torch.dtype]]:
    """The device and floating-point dtype of a model's parameters (a ``PyroModule``), else torch's default device
    and no dtype (the batches keep theirs)."""
    if isinstance(model, torch.nn.Module):
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point():
                return t.device, t.dtype
    return torch.get_default_device(), None


class SGMCMCKernel(MCMCKernel):
    """Base class of the SG-MCMC kernels: minibatch potential, backends, schedules, divergences, warm start.

    Subclasses define ``_state_type`` (a ``NamedTuple`` whose first field is ``position``),
    :meth:`_init_state` and :meth:`_update` (a pure rule from :mod:`pyro_sdebnn.ops.sgmcmc`).

    Returned ``params`` are unconstrained, as for Pyro's ``HMC``: ``MCMC`` maps them back through
    ``kernel.transforms``. With ``vectorized_chains=K > 1`` every site carries a leading chain dimension
    ``(K, *shape)``, and ``MCMC`` stores the ``K`` chains as chains: ``mcmc.get_samples(group_by_chain=True)`` is
    ``(num_chains * K, num_samples, *shape)``, so ``Predictive``, ``mcmc.summary()`` and
    :func:`pyro_sdebnn.infer.mcmc.from_pyro` see them as chains.

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
        init_strategy: Callable = init_to_robust,
        map_steps: Optional[int] = None,
        map_lr: float = 0.1,
        vectorized_chains: int = 1,
        on_divergence: str = "raise",
        adapt_step_size: bool = False,
        backend: str = "auto",
        sample_writer: Any = None,
        transforms: Optional[dict] = None,
        compile_after: int = 10_000,
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable, got {type(model).__name__}")
        if isinstance(compile_after, bool) or not isinstance(compile_after, int) or compile_after < 0:
            raise ValueError(f"compile_after must be a non-negative int (inner steps), got {compile_after!r}")
        self.compile_after = compile_after
        self._model = model
        self._model_view = _ModelOverLoader(model)
        self.user_transforms = transforms
        self.step_size = as_schedule(step_size)
        for name, value in (("num_steps", num_steps), ("vectorized_chains", vectorized_chains)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if map_steps is not None and (isinstance(map_steps, bool) or not isinstance(map_steps, int) or map_steps < 0):
            raise ValueError(f"map_steps must be None (automatic) or a non-negative int, got {map_steps!r}")
        _check_subsample_size(subsample_size)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise ValueError(f"temperature must be a non-negative float, got {temperature!r}")
        if not map_lr > 0:
            raise ValueError(f"map_lr must be positive, got {map_lr!r}")
        if on_divergence not in _ON_DIVERGENCE:
            raise ValueError(f"on_divergence must be one of {_ON_DIVERGENCE}, got {on_divergence!r}")
        if not isinstance(adapt_step_size, bool):
            raise TypeError(f"adapt_step_size must be a bool, got {adapt_step_size!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
        if not callable(init_strategy):
            raise TypeError("init_strategy must be a Pyro init function such as init_to_median")
        self.num_steps = num_steps
        self.subsample_size = subsample_size
        self.data_plate = data_plate
        self.temperature = float(temperature)
        self.init_strategy = init_strategy
        self.map_steps = map_steps
        self.map_lr = float(map_lr)
        self.vectorized_chains = vectorized_chains
        self.on_divergence = on_divergence
        self.adapt_step_size = adapt_step_size
        self.backend = backend
        self.sample_writer = sample_writer
        self.potential: Optional[MinibatchPotential] = None
        self.transforms: Optional[dict] = None
        self._initial_params: Optional[dict[str, Tensor]] = None
        self._graph_key: Any = None
        self._step_fn: Optional[Callable] = None
        self.backend_used: Optional[str] = None
        self._auto: Optional[dict] = None
        self._stream: Optional[BatchStream] = None
        self._pending_batch: Optional[tuple] = None
        self._batch_data: Optional[tuple] = None
        self._kwarg_tensors: tuple = ()
        self._resume: Optional[dict] = None
        self._reset()

    # ----- subclass interface ------------------------------------------------------------------------------------
    def _init_state(self, position: Tensor) -> tuple:
        raise NotImplementedError

    def _update(self, noise: Tensor, state: tuple, grad: Tensor, step_size: Tensor) -> tuple:
        raise NotImplementedError

    def _build_potential(self, args: tuple, kwargs: dict) -> MinibatchPotential:
        return MinibatchPotential(
            self._model, args, kwargs, subsample_size=self.subsample_size, data_plate=self.data_plate,
            transforms=self.user_transforms, data_size=None if self._stream is None else self._stream.size,
        )

    # every kernel here takes a loader and has checkpoints; a subclass that cannot sets these to False
    _takes_loader = True
    _checkpointable = True

    def _start_stream(self, args: tuple, kwargs: dict) -> tuple:
        """``mcmc.run(loader)``: the model's arguments become the loader's first ``(x, y)`` batch, moved to the
        model's device and dtype (the batch is also the first step's)."""
        self._stream = None
        self._pending_batch = None
        if not any(is_data_loader(a) for a in args) and not any(is_data_loader(v) for v in kwargs.values()):
            return args
        if not self._takes_loader:
            raise TypeError(f"{self._name} does not take a loader: pass the data as tensors (mcmc.run(x, y))")
        if len(args) != 1 or not is_data_loader(args[0]):
            raise TypeError(
                "a loader must be the only positional argument of mcmc.run (mcmc.run(loader), the model being "
                "called as model(x, y) on each batch); keyword arguments are passed to the model unchanged"
            )
        if self.subsample_size is not None:
            raise ValueError(
                "subsample_size must be None with a loader: the minibatch size is the loader's batch_size"
            )
        device, dtype = _model_device_dtype(self._model)
        self._stream = BatchStream(args[0], device, dtype)
        self._pending_batch = self._stream.next()
        return self._pending_batch

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
        # divergence detection (see _check_chains): the last healthy state, the energy history, the records
        self._healthy: Optional[tuple] = None  # the last state certified by a passing check
        self._uncertified: Optional[tuple] = None  # the state the last sample returned, certified by the next one
        self._healthy_energy: Optional[np.ndarray] = None
        self._energy_all: list[np.ndarray] = []  # every `_energy_stride`-th healthy energy, decimated when full
        self._energy_stride = 1
        self._energy_seen = 0
        self._energy_recent: deque = deque(maxlen=_RECENT)
        self.divergence_log: list[dict[str, Any]] = []
        self._step_scale = 1.0  # the warm-up step-size search multiplies the schedule by this
        self.map_steps_taken = 0  # Adam steps of the MAP warm start in the last setup

    @property
    def model(self) -> Callable:
        """The model, as tools outside the kernel call it: with ``mcmc.run(loader)``, ``kernel.model(loader)`` runs
        the model on the loader's whole data set (so that ArviZ's ``az.from_pyro(mcmc)`` reads the observed data and
        the pointwise log-likelihood of all N points); any other call goes to the model unchanged."""
        return self._model_view

    @property
    def initial_params(self) -> Optional[dict[str, Tensor]]:
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: Optional[dict[str, Tensor]]) -> None:
        self._initial_params = params

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        self._reset()
        self._warmup_steps = warmup_steps
        args = self._start_stream(args, kwargs)
        key = (tuple(_arg_key(a) for a in args), tuple((k, _arg_key(v)) for k, v in sorted(kwargs.items())))
        if self._stream is not None:  # the first batch stands for the loader: the key is the loader and its shapes
            key = ("loader", id(self._stream.loader), tuple(_arg_key(a)[2:4] for a in args), key[1])
        # the key holds the version counters of the tensors: data changed in place also rebuild the potential
        # (validating the data again) and trace the step again
        if self.potential is None or key != self._graph_key:
            self.potential = self._build_potential(args, kwargs)
            self._step_fn = None
            self._graph_key = key
            self._args = (args, kwargs)  # keep the arguments alive: ids are only meaningful while they are
        elif self._step_fn is not None and _graph_is_stale(getattr(self._step_fn, "graph_module", None)):
            self._step_fn = None  # a tensor the graph folded constants from (not an argument) changed in place
        # vectorised chains: MCMC stores them as chains, (num_chains * K, num_samples, *shape) (see _chains.py)
        self.transforms = chain_transforms(self.potential, self.vectorized_chains)
        U = self.potential
        self._model_view.device, self._model_view.dtype = U.device, U.dtype
        if self._stream is not None:  # later batches follow the model's device and dtype
            self._stream.device, self._stream.dtype = U.device, U.dtype
            self._pending_batch = tuple(move_batch(t, U.device, U.dtype) for t in self._pending_batch)
            self._kwarg_tensors = U.data_tensors()[len(self._pending_batch):]
        if self._resume is not None:
            self._restore(self._resume, warmup_steps)
            if self.sample_writer is not None:
                self.sample_writer.start_chain()
            return
        drawn = self._initial_params is None  # the automatic warm start leaves a user's initial_params alone
        if drawn:
            self._initial_params = self._draw_initial_params()
        position = U.pack(self._initial_params).to(U.dtype)
        if self.vectorized_chains > 1 and position.dim() == 1:
            position = position.expand(self.vectorized_chains, -1).clone()
        if (self.map_steps is None and drawn) or (self.map_steps is not None and self.map_steps > 0):
            position = self._map_fit(position)
            self._initial_params = U.split(position)
        self._state = self._init_state(position)
        self._healthy = self._uncertified = self._state
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
                trace = poutine.trace(InitMessenger(self.init_strategy)(self._model)).get_trace(
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

    def _next_data(self) -> Optional[tuple]:
        """With a loader, the data tensors of the next step (its ``(x, y)`` batch and the tensors among the keyword
        arguments, in the order of :meth:`MinibatchPotential.data_tensors`); ``None`` with tensors."""
        if self._stream is None:
            return None
        batch, self._pending_batch = self._pending_batch, None
        if batch is None:
            batch = self._stream.next()
        return tuple(batch) + self._kwarg_tensors

    def _bind(self, data: Optional[tuple]) -> Any:
        """Within the block the model runs on the batch ``data`` (a no-op with tensors)."""
        return contextlib.nullcontext() if data is None else self.potential.bound_data(data)

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

    # ----- warm start from a MAP fit ---------------------------------------------------------------------------
    def _map_fit(self, position: Tensor) -> Tensor:
        """Adam on the (minibatch) potential from ``position``: ``map_steps`` steps, or with ``map_steps=None`` up to
        ``_AUTO_MAP_STEPS`` steps, stopped early once the mean potential of the last ``_MAP_WINDOW`` steps is no more
        than ``0.01 (D + 1)`` below that of the window before (the fit has levelled off)."""
        position = position.detach().clone().requires_grad_()
        optim = torch.optim.Adam([position], lr=self.map_lr)
        auto = self.map_steps is None
        tolerance = 0.01 * (self.potential.dim + 1)
        window: list[Tensor] = []
        previous: Optional[float] = None
        with pyro.validation_enabled(False):  # a diverging fit is reported below, not as a validation error
            for step in range(_AUTO_MAP_STEPS if auto else self.map_steps):
                idx = self._next_indices()
                data = self._next_data()
                optim.zero_grad()
                # the step's other inputs (e.g. a measurement set's precision) are constants of the fit: a graph
                # they carry (a GP kernel's hyper-parameters) must not be back-propagated through, step after step
                extra = tuple(t.detach() if isinstance(t, Tensor) else t for t in self._potential_and_grad_inputs())
                with self._bind(data):
                    if self.vectorized_chains == 1:
                        value = self._potential_fn(position, idx, *extra)
                    else:
                        value = sum(
                            self._potential_fn(position[k], None if idx is None else idx[k], *extra)
                            for k in range(self.vectorized_chains)
                        )
                value.backward()
                optim.step()
                if auto:
                    window.append(value.detach())
                    if len(window) == _MAP_WINDOW:
                        mean = float(torch.stack(window).mean())  # one synchronisation per window
                        window = []
                        if not math.isfinite(mean) or (previous is not None and previous - mean < tolerance):
                            break
                        previous = mean
        self.map_steps_taken = step + 1 if (auto or self.map_steps) else 0
        if not bool(_finite_state((position.detach(),))):
            raise SamplerDivergenceError(f"{self._name}: the MAP warm start diverged; use a smaller map_lr")
        return position.detach()

    # ----- MCMCKernel API --------------------------------------------------------------------------------------
    def build_step_fn(self) -> Callable:
        """The inner step ``(state, idx, step_size, *extra) -> (state, potential)`` (traced/compiled once)."""
        if self._step_fn is None:
            self._step_fn = self._make_step_fn()
        return self._step_fn

    def _eta(self, t: int) -> float:
        """The step size of inner step ``t``: the schedule times the factor of the warm-up step-size search."""
        return self.step_size(t) * self._step_scale

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        U = self.potential
        self.build_step_fn()
        if params is not self._last_params:  # the runner (or a user) handed us other parameters
            position = U.pack(params).to(U.dtype)
            self._state = (position,) + tuple(self._state[1:])
        start_t = self._t
        state = self._state
        # the potential of every inner step, written into one buffer: a list of per-step scalars would scatter small
        # long-lived allocations between the steps' large temporaries, and glibc's allocator then keeps a heap that
        # grows with num_steps (measured: +220 MiB over one 469-step epoch of a 784-400-400-10 MLP at batch 128)
        potentials: Optional[Tensor] = None
        constant = self.step_size.is_constant
        eta = self._eta_tensor if constant else None
        if eta is None:
            eta = self._eta_tensor = torch.tensor(self._eta(self._t), dtype=U.dtype, device=U.device)
        step_fn = self._step_fn
        error: Optional[Exception] = None
        with torch.no_grad():  # the traced graph holds its own backward pass; no autograd across steps
            for _ in range(self.num_steps):
                if not constant:
                    eta = torch.tensor(self._eta(self._t), dtype=U.dtype, device=U.device)
                try:
                    state, value = self._take_step(step_fn, state, eta)
                except (RuntimeError, ValueError) as e:
                    # an op that refuses non-finite input (a distribution's argument validation in the eager
                    # step, torch.bernoulli or a Cholesky factorisation in the model ...): a divergence if the
                    # state it was handed had diverged (checked below), the model's own error otherwise
                    error = e
                    break
                if potentials is None:  # NaN for steps not taken: the energy check then skips the sample
                    potentials = value.new_full((self.num_steps,) + value.shape, float("nan"))
                potentials[self._t - start_t] = value
                self._t += 1
        failed_at = self._t
        finite = _chain_finite(state)  # (chains,)
        if potentials is None:  # the first step raised
            potentials = torch.full((self.num_steps,) + state[0][..., 0].shape, float("nan"), dtype=state[0].dtype,
                                    device=state[0].device)
        if error is not None:
            taken = self._t - start_t  # the steps completed before the one that raised
            if taken:
                finite = finite & torch.isfinite(potentials[:taken]).reshape(taken, -1).all(0)
            if bool(finite.all()):
                raise error
            self._t = start_t + self.num_steps  # the schedule moves on as after a completed sample
        # potentials: (num_steps,) or (num_steps, chains)
        if error is None:
            finite = finite & torch.isfinite(potentials).reshape(self.num_steps, -1).all(0)
        energy = self._energy(state, potentials[-1]).reshape(-1)
        # the one host synchronisation per sample: per chain, finite or not, its energy and its potential
        host = torch.stack([finite.to(energy.dtype), energy, potentials[-1].reshape(-1).to(energy.dtype)])
        host = host.detach().cpu().double().numpy()
        if self.backend == "auto" and self.backend_used != "eager" and error is None:
            self._auto_switch()
        sample_index = self._sample_count - self._warmup_steps
        self._sample_count += 1
        flagged = self._check_chains(host, potentials, start_t, failed_at, error)
        if flagged:
            state = self._handle_divergences(flagged, state, sample_index, error)
        if error is None:
            self._record_energy(host[1], flagged)
        self._state = tuple(state)
        self._certify(flagged)
        self._last_potential = potentials[-1]
        params = U.split(self._state[0])
        self._last_params = params
        if self.sample_writer is not None and sample_index >= 0:
            self.sample_writer.write({s.name: s.transform(params[s.name]) for s in U.sites})
        return params

    # ----- divergence detection --------------------------------------------------------------------------------
    def _energy(self, state: tuple, potential: Tensor) -> Tensor:
        """The energy watched by the divergence check: the potential of the last inner step (SGHMC adds the
        kinetic energy)."""
        return potential

    def _energy_threshold(self) -> Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per chain ``(threshold, level, spread)`` of the energy check, or ``None`` before ``_MIN_HISTORY`` samples.

        The level is the smaller of the medians of the recent and of all healthy energies, the spread the smaller of
        their median absolute deviations times 1.4826 (a standard deviation for Gaussian fluctuations): the smaller
        ones, so that neither a slow rise (which drags the recent median up with it) nor the initial descent
        (which inflates the all-time statistics) hides a divergence.
        """
        if not self._energy_recent:
            return None
        base = self.temperature * (self.potential.dim + 10)
        if len(self._energy_recent) < _MIN_HISTORY:  # too few for a spread: a rise by orders of magnitude only
            level = np.min(np.stack(self._energy_recent), 0)
            return level + _EARLY_MULTIPLE * (np.abs(level) + base + 1), level, np.full_like(level, np.nan)
        stats = []
        for rows in (np.stack(self._energy_all), np.stack(self._energy_recent)):
            median = np.median(rows, 0)
            stats.append((median, 1.4826 * np.median(np.abs(rows - median), 0)))
        level = np.minimum(stats[0][0], stats[1][0])
        spread = np.minimum(stats[0][1], stats[1][1])
        allowance = base + 1e-3 * (np.abs(level) + 1)
        return level + _MAD_MULTIPLE * spread + allowance, level, spread

    def _record_energy(self, energy: np.ndarray, flagged: dict) -> None:
        row = energy.copy()
        for k in flagged:  # a restarted chain is back at its last healthy energy
            row[k] = np.nan if self._healthy_energy is None else self._healthy_energy[k]
        if not np.isfinite(row).all():
            return
        self._healthy_energy = row
        self._energy_recent.append(row)
        if self._energy_seen % self._energy_stride == 0:
            self._energy_all.append(row)
            if len(self._energy_all) > _HISTORY:
                self._energy_all = self._energy_all[::2]
                self._energy_stride *= 2
        self._energy_seen += 1

    _energy_name = "the potential"

    def _describe_energy(self, energy: float, potential: float, threshold: float, level: float, spread: float) -> str:
        if np.isnan(spread):
            rule = f"its lowest value {level:.4g} + 100 (|lowest| + T (D + 10) + 1)"
        else:
            rule = f"its running level {level:.4g} + 20 x its spread {spread:.3g} + T (D + 10) + 1e-3 (|level| + 1)"
        return f"{self._energy_name} {energy:.4g} rose above {threshold:.4g} ({rule}): the chain left the typical set"

    def _check_chains(
        self, host: np.ndarray, potentials: Tensor, start_t: int, failed_at: int, error: Optional[Exception]
    ) -> dict[int, tuple[int, str]]:
        """``{chain: (inner step, cause)}`` of the chains that diverged in this sample (see the class docstring)."""
        flagged: dict[int, tuple[int, str]] = {}
        bad = np.flatnonzero(host[0] == 0)
        if len(bad):
            nonfinite = (~torch.isfinite(potentials.reshape(self.num_steps, -1))).cpu().numpy()  # only on divergence
            for k in bad:
                steps = np.flatnonzero(nonfinite[:, k if nonfinite.shape[1] > 1 else 0])
                step = start_t + (int(steps[0]) if len(steps) else self.num_steps - 1)
                if error is not None:  # the step that produced the state the failing op refused
                    step = max(failed_at - 1, start_t)
                cause = (
                    f"the step raised {type(error).__name__} on a non-finite state at inner step {failed_at}"
                    if error is not None
                    else "the potential or its gradient is not finite, or the state overflowed"
                )
                flagged[int(k)] = (step, cause)
        if error is None:
            limits = self._energy_threshold()
            if limits is not None:
                threshold, level, spread = limits
                for k in np.flatnonzero((host[0] > 0) & (host[1] > threshold)):
                    cause = self._describe_energy(host[1, k], host[2, k], threshold[k], level[k], spread[k])
                    flagged[int(k)] = (start_t + self.num_steps - 1, cause)
        return flagged

    def _certify(self, flagged: dict) -> None:
        """The energy of a sample is the potential at the start of its last inner step, which comes after the state
        the previous sample returned: a passing check certifies that state (one sample late), not the new one."""
        if not flagged:
            self._healthy = self._uncertified
        elif self.vectorized_chains > 1:
            keep = torch.zeros(self.vectorized_chains, dtype=torch.bool, device=self._state[0].device)
            keep[list(flagged)] = True
            keep = keep.unsqueeze(-1)
            self._healthy = tuple(torch.where(keep, h, p) for h, p in zip(self._healthy, self._uncertified))
        self._uncertified = self._state

    def _handle_divergences(
        self, flagged: dict[int, tuple[int, str]], state: tuple, sample_index: int, error: Optional[Exception]
    ) -> tuple:
        """Raise, or restart the flagged chains (only those) from their last healthy state with zero auxiliary
        state (momentum, RMSprop average), recording each restart; in warm-up with ``adapt_step_size`` also halve
        the step size."""
        K = self.vectorized_chains
        adapting = self.adapt_step_size and sample_index < 0
        if self.on_divergence == "raise" and not adapting:
            lines = [
                (f"chain {k}: " if K > 1 else "")
                + f"diverged at inner step {step} (step size {self._eta(step):.3g}): {cause}"
                for k, (step, cause) in sorted(flagged.items())
            ]
            raise SamplerDivergenceError(
                f"{self._name} " + "; ".join(lines) + ". Use a smaller step_size (or a decaying schedule, or "
                "adapt_step_size=True to search a stable one in warm-up), or pass on_divergence='continue' to "
                "record a divergence and restart the chain from its last healthy state."
                + (" A chain that diverges in its first steps often starts at a bad point (e.g. a scale drawn close "
                   "to 0): keep the default start (init_strategy=init_to_robust with the automatic MAP warm start, "
                   "map_steps=None) and let adapt_step_size=True find a stable step."
                   if min(step for step, _ in flagged.values()) < 10 else "")
            ) from error
        for k, (step, cause) in sorted(flagged.items()):
            self.divergence_log.append(
                {"sample": sample_index, "warmup": sample_index < 0, "chain": k, "step": step,
                 "step_size": self._eta(step), "cause": cause}
            )
        if adapting:
            if len([r for r in self.divergence_log if r.get("halved")]) >= _MAX_HALVINGS:
                raise SamplerDivergenceError(
                    f"{self._name}: the warm-up step-size search halved the step size {_MAX_HALVINGS} times (to "
                    f"{self._eta(self._t):.3g}) and the chain still diverges: " + "; ".join(
                        c for _, c in flagged.values()
                    ) + ". Check the model or start from a MAP fit (map_steps)."
                ) from error
            self._step_scale *= 0.5
            self._eta_tensor = None
            self.divergence_log[-1]["halved"] = True
        elif sample_index >= 0:
            self._divergences.append(sample_index)
        healthy = self._healthy
        if K == 1:
            return (healthy[0],) + tuple(torch.zeros_like(t) for t in healthy[1:])
        mask = torch.zeros(K, dtype=torch.bool, device=state[0].device)
        mask[list(flagged)] = True
        mask = mask.unsqueeze(-1)
        restarted = [torch.where(mask, healthy[0], state[0])]
        restarted += [torch.where(mask, torch.zeros_like(t), t) for t in state[1:]]
        return tuple(restarted)

    # ----- checkpoints ------------------------------------------------------------------------------------------
    def _signature(self) -> dict[str, Any]:
        """What a checkpoint must match: the kernel, its latent sites and the data sizes."""
        return {"kernel": type(self).__name__, **self._signature_of_model()}

    def state_dict(self) -> dict[str, Any]:
        """The state of the chain after the last :meth:`sample`, enough to continue it exactly.

        The position and auxiliary state (momentum, RMSprop average; unconstrained, flat), the inner step count
        (the position in the step-size schedule), the sample count, the warm-up step-size factor and divergence
        records, the energy history of the divergence check, the minibatch position (the index pass, or the loader's
        epoch and batch) and torch's random state. It holds only tensors, numbers, strings, lists and dicts, so
        ``torch.save`` / ``torch.load(path, weights_only=True)`` round-trip it. See
        :func:`pyro_sdebnn.infer.mcmc.save_run`.

        :raises ValueError: before the kernel was set up (``mcmc.run``).
        :raises TypeError: for a kernel class without checkpoints (``_checkpointable = False``).
        """
        if not self._checkpointable:
            raise TypeError(f"{self._name} does not support checkpoints (state_dict)")
        if self.potential is None or self._state is None:
            raise ValueError("state_dict: the kernel has no chain yet; run it first (mcmc.run)")

        def tensors(state: Optional[tuple]) -> Optional[list[Tensor]]:
            return None if state is None else [t.detach().clone() for t in state]

        def array(a: Optional[np.ndarray]) -> Optional[Tensor]:
            return None if a is None else torch.as_tensor(np.asarray(a, dtype=np.float64).copy())

        batch_pos = self._batch_pos
        stream = None
        if self._stream is not None:
            stream = self._stream.state_dict()
            if self._pending_batch is not None:  # the first batch was drawn but not used yet
                stream["position"] -= 1
        rng = {"cpu": torch.get_rng_state()}
        if self.potential.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.potential.device)
        return {
            "signature": self._signature(),
            "state": tensors(self._state),
            "healthy": tensors(self._healthy),
            "uncertified": tensors(self._uncertified),
            "last_potential": None if self._last_potential is None else self._last_potential.detach().clone(),
            "t": int(self._t),
            "sample_count": int(self._sample_count),
            "warmup_steps": int(self._warmup_steps),
            "step_scale": float(self._step_scale),
            "divergences": [int(i) for i in self._divergences],
            "divergence_log": [dict(r) for r in self.divergence_log],
            "map_steps_taken": int(self.map_steps_taken),
            "energy": {
                "all": [array(r) for r in self._energy_all],
                "recent": [array(r) for r in self._energy_recent],
                "stride": int(self._energy_stride),
                "seen": int(self._energy_seen),
                "healthy": array(self._healthy_energy),
            },
            "batches": None if self._batches is None else self._batches.clone(),
            "batch_pos": int(batch_pos),
            "loader": stream,
            "rng": rng,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` on the next ``setup`` (the next ``mcmc.run``), which must get the same
        model and data (the same loader for a run over a loader): it restores the chain instead of drawing initial
        values, and torch's random state, so the continued chain is the one an uninterrupted run would have given
        (bitwise on CPU with a fixed ``backend``). The ``warmup_steps`` of that run must be the warm-up left in the
        checkpoint (0 once sampling began); :func:`pyro_sdebnn.infer.mcmc.resume_run` does all this.

        :raises TypeError: if ``state_dict`` is not a dict of the expected layout.
        """
        required = ("signature", "state", "t", "sample_count", "warmup_steps", "rng", "energy")
        if not self._checkpointable:
            raise TypeError(f"{self._name} does not support checkpoints (load_state_dict)")
        if not isinstance(state_dict, dict) or any(k not in state_dict for k in required):
            raise TypeError(
                "state_dict must be a dict returned by SGMCMCKernel.state_dict() (keys "
                f"{list(required)}), got {type(state_dict).__name__}"
            )
        if state_dict["signature"].get("kernel") != type(self).__name__:
            raise ValueError(
                f"the checkpoint is of a {state_dict['signature'].get('kernel')} kernel, not of {type(self).__name__}"
            )
        self._resume = state_dict

    def _restore(self, sd: dict[str, Any], warmup_steps: int) -> None:
        """Restore the chain saved by :meth:`state_dict` (called by ``setup``)."""
        self._resume = None
        U = self.potential
        saved, here = sd["signature"], self._signature_of_model()
        for key in ("sites", "data_sizes", "vectorized_chains"):
            if saved.get(key) != here[key]:
                raise ValueError(
                    f"the checkpoint does not belong to this model and data: its {key} {saved.get(key)!r} differ "
                    f"from {here[key]!r}"
                )
        if (sd.get("loader") is None) != (self._stream is None):
            raise ValueError(
                "the checkpoint was taken on a run over " + ("a loader" if sd.get("loader") is not None else "tensors")
                + ": resume it on the same kind of data"
            )
        left = max(0, int(sd["warmup_steps"]) - int(sd["sample_count"]))
        if warmup_steps != left:
            raise ValueError(
                f"warmup_steps={warmup_steps} on resuming, but the checkpoint has {left} warm-up step(s) left: "
                f"run MCMC(..., warmup_steps={left}) (resume_run does)"
            )

        def tensors(ts: Optional[list]) -> Optional[tuple]:
            return None if ts is None else tuple(t.to(device=U.device, dtype=U.dtype) for t in ts)

        state = tensors(sd["state"])
        if len(state) != len(self._state_type._fields):
            raise ValueError("the checkpoint's chain state does not match this kernel's (e.g. preconditioned or not)")
        self._state = state
        self._healthy = tensors(sd["healthy"])
        self._uncertified = tensors(sd["uncertified"])
        last = sd.get("last_potential")
        self._last_potential = None if last is None else last.to(U.device)
        self._t = int(sd["t"])
        self._sample_count = int(sd["sample_count"])
        self._warmup_steps = int(sd["warmup_steps"])
        self._step_scale = float(sd["step_scale"])
        self._eta_tensor = None
        self._divergences = [int(i) for i in sd["divergences"]]
        self.divergence_log = [dict(r) for r in sd["divergence_log"]]
        self.map_steps_taken = int(sd["map_steps_taken"])
        energy = sd["energy"]

        def array(t: Optional[Tensor]) -> Optional[np.ndarray]:
            return None if t is None else t.numpy().copy()

        self._energy_all = [array(r) for r in energy["all"]]
        self._energy_recent = deque((array(r) for r in energy["recent"]), maxlen=_RECENT)
        self._energy_stride, self._energy_seen = int(energy["stride"]), int(energy["seen"])
        self._healthy_energy = array(energy["healthy"])
        # trace the step graph now: tracing runs the step once (drawing noise, peeking at the minibatches), which the
        # uninterrupted run did at its first sample, before the random state and the minibatch position are restored
        self.build_step_fn()
        batches = sd.get("batches")
        self._batches = None if batches is None else batches.to(U.device)
        self._batch_pos = int(sd["batch_pos"])
        if self._stream is not None:
            self._pending_batch = None
            self._stream.restore(sd["loader"])
        torch.set_rng_state(sd["rng"]["cpu"])
        if "cuda" in sd["rng"] and U.device.type == "cuda":
            torch.cuda.set_rng_state(sd["rng"]["cuda"], U.device)
        self._initial_params = U.split(self._state[0])
        self._last_params = self._initial_params

    def _signature_of_model(self) -> dict[str, Any]:
        U = self.potential
        return {
            "sites": [[site.name, list(site.shape)] for site in U.sites],
            "data_sizes": {p: int(n) for p, n in U.data_sizes.items()},
            "vectorized_chains": int(self.vectorized_chains),
        }

    def cleanup(self) -> None:
        if self.sample_writer is not None:
            self.sample_writer.flush()
        self._initial_params = None  # the next chain draws its own initial values

    def logging(self) -> dict[str, str]:
        out = {"step size": f"{self._eta(max(self._t - 1, 0)):.2e}"}
        if self._last_potential is not None:
            out["potential"] = f"{float(self._last_potential.mean()):.4g}"
        return out

    def diagnostics(self) -> dict[str, Any]:
        out = {
            "divergences": list(self._divergences),
            "acceptance rate": 1.0,  # SG-MCMC has no accept/reject step
            "backend": self.backend_used,
            "divergence log": [dict(r) for r in self.divergence_log],
        }
        if self.adapt_step_size:
            out["step size"] = self._eta(self._t)
        return out
