# SPDX-License-Identifier: Apache-2.0
"""The base class of the SG-MCMC kernels: a Pyro ``MCMCKernel`` around one step function.

Every inner step is :meth:`SGMCMCKernel._step`: the gradient and value of the minibatch potential
:math:`\\tilde U` (:mod:`~pyro_sdebnn.infer.mcmc.potential`), then a pure update rule of
:mod:`pyro_sdebnn.ops.sgmcmc`, e.g. for SGLD

.. math::

    w \\leftarrow w - \\frac{\\eta}{2} \\nabla \\tilde U(w) + \\sqrt{\\eta T}\\, \\xi,
    \\qquad \\xi \\sim \\mathcal N(0, I).

The backends run that one function eagerly (``"eager"``, any model), traced into a graph of ATen calls (``"fx"``,
vectorised over the chains) or compiled (``"compile"``); ``"auto"`` (default) switches between them after fixed
numbers of inner steps. Around the step the kernel does set-up (potential, minibatches, initial values), the loop
of ``num_steps`` inner steps per returned sample, warm-up, divergence checks
(:mod:`~pyro_sdebnn.infer.mcmc.diagnostics`) and checkpoints (:mod:`~pyro_sdebnn.infer.mcmc.checkpoint`).

Heuristics that a user did not ask for, each with its switch (:doc:`/methods/sgmcmc` explains them): the start
``init_strategy=init_to_robust``, the MAP warm start ``map_steps=None`` (``0``: off), the warm-up's halving of a
constant step size at each divergence ``adapt_step_size=None`` (``False``), the windowed mass-matrix adaptation
``adapt_mass_matrix=None`` (``False``), the exploring step between the windows ``warmup_step_factor=2``
(``1``), SGLD's Leimkuhler--Matthews noise ``integrator="lm"`` (``"euler"``), closed-form ``Normal`` priors
``closed_form_prior=True`` (``False``), a reshuffling loader's short last batch passed over ``drop_last=None``
(``False``), and ``backend="auto"`` (``"fx"`` or ``"eager"``).

**References**

[1] Bob Carpenter, Andrew Gelman, Matthew D. Hoffman, Daniel Lee, Ben Goodrich, Michael Betancourt, Marcus
Brubaker, Jiqiang Guo, Peter Li, Allen Riddell (2017). "Stan: A Probabilistic Programming Language". Journal of
Statistical Software 76(1) (the windowed adaptation of the mass matrix).

[2] Yi-An Ma, Tianqi Chen, Emily B. Fox (2015). "A Complete Recipe for Stochastic Gradient MCMC". NeurIPS 2015
(a constant preconditioner keeps the target stationary).
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections import deque
from typing import Any, Callable, ContextManager, NamedTuple, Optional, Union, cast

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.distributions import constraints
from pyro.infer.autoguide.initialization import InitMessenger, init_to_median, init_to_sample
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from torch import Tensor
from torch.distributions.transforms import Transform

from pyro_sdebnn.data.loaders import (
    arguments,
    check_same_structure,
    module_device_dtype,
    move_batch,
    read_batch,
    rng_state,
    set_rng_state,
)
from pyro_sdebnn.infer.mcmc.diagnostics import (
    _HISTORY,
    _MAX_HALVINGS,
    _RECENT,
    RunChecks,
    SamplerDivergenceError,
    SamplerWarning,
    _chain_finite,
    _check_subsample_size,
    _finite_state,
    check_mcmc_transforms,
    energy_threshold,
    find_mcmc,
    find_runner,
)
from pyro_sdebnn.infer.mcmc.potential import BatchStream, MinibatchPotential, in_dataset_order, is_data_loader
from pyro_sdebnn.infer.mcmc.schedules import StepSizeSchedule, as_schedule

__all__ = ["SGMCMCKernel", "init_to_robust"]


# ----- the default start ---------------------------------------------------------------------------------------------
def _is_real(support) -> bool:
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real


def init_to_robust(site: dict | None = None, num_samples: int = 15):
    """Pyro init strategy: ``init_to_sample`` for real-valued sites, ``init_to_median`` for constrained ones.

    :param dict site: the sample site (Pyro calls the strategy with it); ``None`` returns the strategy itself.
    :param int num_samples: prior draws whose median starts a constrained site.
    """
    if site is None:
        return init_to_robust
    if _is_real(site["fn"].support):
        return init_to_sample(site)
    return init_to_median(site, num_samples=num_samples)


# ----- warm-up adaptation of a diagonal mass matrix -----------------------------------------------------------------
MIN_ADAPT_STEPS = 1000  # warm-ups of fewer inner steps keep the unit preconditioner (too short to estimate)
_INIT_FRACTION, _TERM_FRACTION = 0.15, 0.10
_WINDOW_RATIOS = (1, 2, 4, 8)
_SHRINK_DRAWS, _SHRINK_TARGET = 5.0, 1e-3


def adaptation_windows(total: int) -> list[tuple[int, int]]:
    """The slow windows ``[start, end)`` (inner-step indices) of a warm-up of ``total`` inner steps.

    >>> adaptation_windows(1000)
    [(150, 200), (200, 300), (300, 500), (500, 900)]
    >>> adaptation_windows(500)
    []
    """
    if total < MIN_ADAPT_STEPS:
        return []
    start = int(round(_INIT_FRACTION * total))
    end = total - int(round(_TERM_FRACTION * total))
    slow = end - start
    unit = slow / sum(_WINDOW_RATIOS)
    windows, cursor, acc = [], start, 0
    for r in _WINDOW_RATIOS:
        acc += r
        stop = end if acc == sum(_WINDOW_RATIOS) else start + int(round(unit * acc))
        windows.append((cursor, stop))
        cursor = stop
    return windows


class MassMatrixAdapter:
    """Collects the positions of the warm-up's slow windows and returns the preconditioner at the end of each, with
    the positions at which the step is then checked: the window's last one, and in the last window (which sets the
    sampling step) ``last_positions`` spread evenly through it, the last one at its end.

    :param int total: the warm-up's inner steps (``warmup_steps * num_steps``).
    :param tuple shape: the shape of the chain's position, ``(D,)`` or ``(K, D)``.
    :param int last_positions: the positions kept in the last window.
    """

    def __init__(self, total: int, shape: tuple, dtype: torch.dtype, device: Any, last_positions: int = 1) -> None:
        self.windows = adaptation_windows(total)
        self.window = 0  # index of the current (or next) slow window
        self.last_positions = last_positions
        self._zeros = lambda: torch.zeros(shape, dtype=dtype, device=device)
        self.restart_window()

    @property
    def done(self) -> bool:
        return self.window >= len(self.windows)

    def restart_window(self) -> None:
        """Forget the draws of the current window (a chain was restarted from an earlier state)."""
        self.count = 0
        self.mean = self._zeros()
        self.m2 = self._zeros()
        self.positions: list[Tensor] = []

    def _kept(self, t: int) -> bool:
        """Whether the position after inner step ``t`` of the current window is kept for the step's check."""
        start, end = self.windows[self.window]
        n = self.last_positions if self.window == len(self.windows) - 1 else 1
        return any(t + 1 == start + round(k * (end - start) / n) for k in range(1, n + 1))

    def observe(self, t: int, position: Tensor) -> Optional[tuple[Tensor, list[Tensor]]]:
        """Record the position after inner step ``t`` (0-based); at the end of a slow window the new inverse mass
        matrix ``(D,)`` and the window's kept positions, else ``None``."""
        if self.done:
            return None
        start, end = self.windows[self.window]
        if t < start:
            return None
        self.count += 1  # Welford's update, on the device (no synchronisation)
        delta = position - self.mean
        self.mean = self.mean + delta / self.count
        self.m2 = self.m2 + delta * (position - self.mean)
        if self._kept(t):
            self.positions.append(position.detach().clone())
        if t + 1 < end:
            return None
        n = self.count
        variance = self.m2 / max(n - 1, 1)
        if variance.dim() > 1:  # vectorised chains: the mean of the within-chain variances
            variance = variance.mean(0)
        estimate = (n / (n + _SHRINK_DRAWS)) * variance + _SHRINK_TARGET * (_SHRINK_DRAWS / (n + _SHRINK_DRAWS))
        positions = self.positions
        self.window += 1
        self.restart_window()
        return estimate, positions

    # ----- checkpoints --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"window": int(self.window), "count": int(self.count), "mean": self.mean.clone(),
                "m2": self.m2.clone(), "positions": [p.clone() for p in self.positions]}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.window, self.count = int(sd["window"]), int(sd["count"])
        self.mean = sd["mean"].to(self.mean)
        self.m2 = sd["m2"].to(self.m2)
        self.positions = [p.to(self.mean) for p in sd.get("positions", [])]


# ----- vectorised chains stored by MCMC as chains -------------------------------------------------------------------
class VectorizedChainsTransform(Transform):
    """``transform`` (constrained -> unconstrained) whose inverse also lays ``(C, S, K, *shape)`` out as
    ``(C * K, S, *shape)``.

    :param transform: the site's constrained -> unconstrained transform.
    :param torch.Size shape: the unconstrained shape of the site in one chain.

    >>> t = VectorizedChainsTransform(torch.distributions.transforms.ExpTransform().inv, torch.Size([3]))
    >>> t.inv(torch.zeros(2, 5, 4, 3)).shape  # 2 MCMC chains x 4 vectorised chains, 5 draws
    torch.Size([8, 5, 3])
    >>> t.inv(torch.zeros(4, 3)).shape  # one sample of the 4 chains: unchanged
    torch.Size([4, 3])
    """

    bijective = True

    def __init__(self, transform: Transform, shape: torch.Size) -> None:
        super().__init__()
        self.transform = transform
        self.shape = torch.Size(shape)
        self.domain = transform.domain
        self.codomain = transform.codomain

    def _call(self, x: Tensor) -> Tensor:
        return self.transform(x)

    def _inverse(self, y: Tensor) -> Tensor:
        if y.dim() == 3 + len(self.shape):  # (C, S, K, *shape) as MCMC stacks it
            y = y.transpose(1, 2).flatten(0, 1)
        return self.transform.inv(y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return self.transform.log_abs_det_jacobian(x, y)

    def __eq__(self, other: object) -> bool:  # a later run's transforms equal the earlier run's (MCMC keeps those)
        return isinstance(other, VectorizedChainsTransform) and self.transform == other.transform \
            and self.shape == other.shape


def chain_transforms(potential: Any, vectorized_chains: int) -> dict[str, Transform]:
    """``kernel.transforms`` for ``MCMC``: the potential's transforms, wrapped when ``vectorized_chains > 1``."""
    if vectorized_chains == 1:
        return dict(potential.transforms)
    return {s.name: VectorizedChainsTransform(potential.transforms[s.name], s.shape) for s in potential.sites}


# ----- the traced step's graphs, torch.compile ------------------------------------------------------------------
def _batch_size(key: tuple) -> int:
    """The leading size of the first data tensor of a graph's key (its shapes), 0 for none."""
    return int(key[0][0]) if key and len(key[0]) else 0


def _compile_graph(graph: Any, on_failure: Optional[Callable[[Exception], Callable]] = None) -> Callable:
    """``torch.compile`` the step graph (compiled on the first call). If that first call fails and ``on_failure`` is
    given, the step continues with ``on_failure(error)`` instead of raising.

    The compiled step draws its noise from ATen's generator (Inductor's ``fallback_random``, for this compilation
    only), as the eager graph does: the same seed then gives the same noise, and on CPU Inductor's own
    random-number generation is slow."""
    compiled = torch.compile(graph, dynamic=False, options={"fallback_random": True})
    state: dict[str, Any] = {"fn": None}

    def run(*args: Tensor) -> tuple:
        if state["fn"] is not None:
            return state["fn"](*args)
        try:  # the first call compiles; the compiler's own deprecation notices are not ours
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = compiled(*args)
            state["fn"] = compiled
            return out
        except Exception as e:  # noqa: BLE001 - re-raised unless the caller has a fallback
            if on_failure is None:
                raise
            fallback = on_failure(e)
            state["fn"] = fallback
            return fallback(*args)

    return run


_BACKENDS = ("auto", "eager", "fx", "compile")
_ON_DIVERGENCE = ("raise", "continue")
_AUTO_MAP_STEPS = 500  # the automatic MAP warm start (map_steps=None): at most that many Adam steps ...
_AUTO_MAP_RUN_FRACTION = 0.1  # ... at most one epoch and at most that fraction of the run's inner steps
_MAP_WINDOW = 50  # ... stopped once the mean potential of a window of that many steps levels off
# backend="auto" steps eagerly for that many inner steps before tracing: tracing costs about as much as the eager
# step's extra dispatch over that many steps (plus, the first time in a process, torch's compiler imports), so a short
# run never pays it and a long one pays at most about twice the cheaper choice
_AUTO_EAGER_STEPS = 100


class _Adam:
    """Adam (Kingma & Ba, 2015, "Adam: A Method for Stochastic Optimization", ICLR) on one tensor, as
    ``torch.optim.Adam`` computes it (default ``betas`` and ``eps``), without importing ``torch._dynamo``, which
    ``torch.optim`` does and which takes longer than a short run's warm start:

    .. math::

        m \\leftarrow \\beta_1 m + (1 - \\beta_1) g, \\quad v \\leftarrow \\beta_2 v + (1 - \\beta_2) g^2, \\quad
        w \\leftarrow w - \\frac{\\text{lr}}{1 - \\beta_1^t} \\frac{m}{\\sqrt{v / (1 - \\beta_2^t)} + \\epsilon}.
    """

    betas, eps = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults

    def __init__(self, param: Tensor, lr: float) -> None:
        self.param, self.lr = param, lr
        self.t = 0
        self.m = torch.zeros_like(param)
        self.v = torch.zeros_like(param)

    @torch.no_grad()
    def step(self, grad: Tensor) -> None:
        beta1, beta2 = self.betas
        self.t += 1
        self.m.lerp_(grad, 1 - beta1)
        self.v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (self.v.sqrt() / (1 - beta2**self.t) ** 0.5).add_(self.eps)
        self.param.addcdiv_(self.m, denom, value=-self.lr / (1 - beta1**self.t))


class _ModelOverLoader:
    """``kernel.model``: the user's model, which also accepts the loader of ``mcmc.run(loader)``.

    Tools that call ``kernel.model(*mcmc._args)`` (ArviZ's ``az.from_pyro``, ``Predictive``) then run the model once
    on the whole data set: the loader's batches in data-set order, concatenated and moved to the model's device,
    called as one batch; torch's random state is left as it was. This holds the data set in memory once;
    :func:`~pyro_sdebnn.infer.mcmc.to_inference_data` streams it instead. Any other call goes to the model unchanged.
    """

    def __init__(self, model: Callable) -> None:
        self.model = model
        self.device: Any = None
        self.dtype: Optional[torch.dtype] = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and is_data_loader(args[0]):
            with torch.random.fork_rng(devices=[]):  # a shuffling loader draws from torch's generator
                batches = [read_batch(b, i)[:2] for i, b in enumerate(in_dataset_order(args[0]))]
            if not batches:
                raise ValueError(f"kernel.model(loader): the loader ({type(args[0]).__name__}) is empty: it yielded no "
                                 "batch (its dataset has no data point), so there is nothing to run the model on")
            spec = batches[0][1]
            for i, (_, s) in enumerate(batches):
                check_same_structure(s, spec, i)
            whole, batch_kwargs = arguments([torch.cat([move_batch(t, self.device, self.dtype) for t in ts])
                                             for ts in zip(*(leaves for leaves, _ in batches))], spec)
            args, kwargs = whole + args[1:], {**batch_kwargs, **kwargs}
        return self.model(*args, **kwargs)


def _grads(value: Tensor, parts: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """The gradient of ``value`` with respect to each of ``parts`` (zeros where every term is in closed form)."""
    if not value.requires_grad:
        return tuple(torch.zeros_like(part) for part in parts)
    return torch.autograd.grad(value, parts, allow_unused=True, materialize_grads=True)


def _check_initial_params(potential: MinibatchPotential, params: Any, chains: int) -> None:
    """``initial_params`` (unconstrained, as for Pyro's ``HMC``) must name every latent site, with the site's shape or,
    for ``vectorized_chains=K``, ``(K, *shape)``."""
    if not isinstance(params, dict):
        raise TypeError(f"initial_params must be a dict {{site name: tensor}}, got {type(params).__name__}")
    names = [s.name for s in potential.sites]
    missing, unknown = sorted(set(names) - set(params)), sorted(set(params) - set(names))
    if missing or unknown:
        raise ValueError(
            f"initial_params must give every latent site of the model ({names}), in unconstrained space: "
            + "; ".join(part for part in (f"missing {missing}" if missing else "",
                                          f"not latent sites of the model {unknown}" if unknown else "") if part)
        )
    for s in potential.sites:
        value = params[s.name]
        if not isinstance(value, Tensor):
            raise TypeError(f"initial_params[{s.name!r}] must be a tensor, got {type(value).__name__}")
        shapes = [tuple(s.shape)] + ([(chains,) + tuple(s.shape)] if chains > 1 else [])
        if tuple(value.shape) not in shapes:
            raise ValueError(
                f"initial_params[{s.name!r}] has shape {tuple(value.shape)}; the site's shape is {tuple(s.shape)}"
                + (f" (or {(chains,) + tuple(s.shape)}, one value per vectorised chain)" if chains > 1 else "")
            )


class SGMCMCKernel(MCMCKernel):
    """Base class of the SG-MCMC kernels: set-up, the loop of inner steps, warm-up, divergences, diagnostics.

    A subclass names its chain state (``_state_type``, a ``NamedTuple`` whose first field is the position),
    :meth:`_init_state` and :meth:`_update` (a pure rule of :mod:`pyro_sdebnn.ops.sgmcmc`). Returned ``params`` are
    unconstrained, as for Pyro's ``HMC``; ``MCMC`` maps them back through ``kernel.transforms``. With
    ``vectorized_chains=K`` every site carries a leading chain dimension and ``MCMC`` stores ``num_chains * K``
    chains. The warm-up, the heuristics and their switches are explained in :doc:`/methods/sgmcmc`.

    :param data_plate: the plate(s) over the data (default: found from the observed sites).
    :param float temperature: :math:`T`: samples :math:`\\propto \\exp(-U/T)`.
    :param callable init_strategy: Pyro init strategy (default :func:`init_to_robust`).
    :param int map_steps: ``None``: an automatic Adam warm start on the minibatch potential (bounded, stopped when it
        levels off; only from initial values the kernel drew); an int: that many Adam steps; ``0``: none.
    :param float map_lr: learning rate of the warm start.
    :param int vectorized_chains: ``K`` chains at once in this process.
    :param str on_divergence: ``"raise"`` (:class:`~pyro_sdebnn.infer.mcmc.diagnostics.SamplerDivergenceError`) or
        ``"continue"`` (record it in ``diagnostics()["divergence log"]``, restart the chain from its last healthy
        state); the rule is in :mod:`~pyro_sdebnn.infer.mcmc.diagnostics`.
    :param bool adapt_step_size: in warm-up, halve the step size whenever a chain diverges (at most 30 times) and
        restart it from its last healthy state; ``None`` (default): when the step size is a constant.
    :param bool adapt_mass_matrix: ``None``: adapt a diagonal mass matrix in warm-up when the step size is a constant
        and the warm-up has at least 1000 inner steps; ``False``: unit mass throughout.
    :param float adapted_step_size: the step in standardised units once :math:`M` is adapted (default 0.1 for SGLD),
        capped by the curvature of the preconditioned potential.
    :param float warmup_step_factor: :math:`f \\in [1, 4)`: between the first and the last adaptation window the
        chain explores with :math:`f` times the capped step (see :doc:`/methods/sgmcmc`); ``1``: the sampling step.
    :param str backend: ``"auto"``, ``"eager"``, ``"fx"`` or ``"compile"`` (see the module).
    :param int compile_after: with ``backend="auto"``, the inner steps after which the step is compiled.
    :param bool closed_form_prior: add constant ``Normal`` priors in closed form outside the traced graph.
    :param drop_last: with a loader, pass over the short batch that ends each epoch: ``None`` (default) when the
        loader reshuffles every epoch, ``True`` for any loader, ``False`` never.
    :param sample_writer: a :class:`~pyro_sdebnn.infer.mcmc.arviz.SampleWriter` streaming the samples to disk.
    :param dict transforms: ``{site: transform}`` from constrained to unconstrained space, as for ``HMC``. Give them
        here: ``MCMC(transforms=...)`` only maps the samples back, and other transforms there are a ``ValueError``.

    >>> from pyro_sdebnn.infer.mcmc import SGLD, SGHMC
    >>> issubclass(SGLD, SGMCMCKernel) and issubclass(SGHMC, SGMCMCKernel)
    True
    """

    _state_type: type = NamedTuple
    _name = "SGMCMC"
    _faster_mixing: Optional[str] = None  # a kernel the end-of-run R-hat warning suggests instead (SGLD: SGHMC)
    # the step size in the standardised coordinates M^{1/2} w once warm-up has adapted M (adapted_step_size=None)
    _adapted_step_default = 0.1
    # the update rule's preconditioner is M^{-1} to this power: 1 for SGLD (M^{-1}), 0.5 for SGHMC (M^{-1/2})
    _precond_power = 1.0

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
        adapt_step_size: Optional[bool] = None,
        adapt_mass_matrix: Optional[bool] = None,
        adapted_step_size: Optional[float] = None,
        warmup_step_factor: float = 2.0,
        backend: str = "auto",
        sample_writer: Any = None,
        transforms: Optional[dict] = None,
        compile_after: int = 10_000,
        closed_form_prior: bool = True,
        drop_last: Optional[bool] = None,
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable, got {type(model).__name__}")
        if isinstance(compile_after, bool) or not isinstance(compile_after, int) or compile_after < 0:
            raise ValueError(f"compile_after must be a non-negative int (inner steps), got {compile_after!r}")
        if not isinstance(closed_form_prior, bool):
            raise TypeError(f"closed_form_prior must be a bool, got {closed_form_prior!r}")
        for name, auto in (("drop_last", drop_last), ("adapt_step_size", adapt_step_size),
                           ("adapt_mass_matrix", adapt_mass_matrix)):
            if auto is not None and not isinstance(auto, bool):
                raise TypeError(f"{name} must be None (automatic) or a bool, got {auto!r}")
        self.drop_last = drop_last
        self.compile_after = compile_after
        self.closed_form_prior = closed_form_prior
        self._tracing = False  # True while the step is traced (see _gradient)
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
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not 0 <= temperature < math.inf:
            raise ValueError(f"temperature must be a non-negative finite float, got {temperature!r}")
        if isinstance(map_lr, bool) or not isinstance(map_lr, (int, float)):
            raise TypeError(f"map_lr must be a float, got {type(map_lr).__name__}")
        if not 0 < map_lr < math.inf:
            raise ValueError(f"map_lr must be positive and finite, got {map_lr!r}")
        if transforms is not None:
            if not isinstance(transforms, dict):
                raise TypeError(f"transforms must be a dict {{site name: Transform}} or None, got "
                                f"{type(transforms).__name__}")
            for site, transform in transforms.items():
                if not isinstance(transform, Transform):
                    raise TypeError(f"transforms[{site!r}] must be a torch Transform (constrained -> unconstrained, "
                                    f"as for Pyro's HMC), got {type(transform).__name__}")
        if sample_writer is not None and not all(
            callable(getattr(sample_writer, name, None)) for name in ("start_chain", "write", "flush")
        ):
            raise TypeError("sample_writer must be None or a SampleWriter (pyro_sdebnn.infer.mcmc.arviz.SampleWriter),"
                            f" got {type(sample_writer).__name__}")
        if on_divergence not in _ON_DIVERGENCE:
            raise ValueError(f"on_divergence must be one of {_ON_DIVERGENCE}, got {on_divergence!r}")
        if adapted_step_size is None:
            adapted_step_size = self._adapted_step_default
        if isinstance(adapted_step_size, bool) or not isinstance(adapted_step_size, (int, float)) \
                or not adapted_step_size > 0:
            raise ValueError(f"adapted_step_size must be a positive float, got {adapted_step_size!r}")
        if isinstance(warmup_step_factor, bool) or not isinstance(warmup_step_factor, (int, float)):
            raise TypeError(f"warmup_step_factor must be a float, got {warmup_step_factor!r}")
        if not 1.0 <= warmup_step_factor < 4.0:
            raise ValueError(
                f"warmup_step_factor must be in [1, 4) (4 times a step capped at a quarter of the stability limit "
                f"reaches the limit), got {warmup_step_factor!r}"
            )
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
        # automatic: adapt whenever the step size is a constant (a schedule keeps its own step sizes)
        self.adapt_step_size = self.step_size.is_constant if adapt_step_size is None else adapt_step_size
        self.adapt_mass_matrix = self.step_size.is_constant if adapt_mass_matrix is None else adapt_mass_matrix
        # the base class's check only: a subclass checks its own settings once they are set (and setup checks again)
        SGMCMCKernel._check_step_size(self)
        self.adapted_step_size = float(adapted_step_size)
        self.warmup_step_factor = float(warmup_step_factor)
        self._run_checks: Optional[RunChecks] = None
        self._runner_id: Optional[int] = None
        self.backend = backend
        self.sample_writer = sample_writer
        self.potential: Optional[MinibatchPotential] = None
        self.transforms: Optional[dict] = None
        self._initial_params: Optional[dict[str, Tensor]] = None
        self._own_start = False  # _initial_params are the kernel's own (drawn, or restored), not a user's
        self._reset_graphs()
        self._stream: Optional[BatchStream] = None
        self._pending_batch: Optional[tuple] = None  # the tensors of the loader's first batch, until a step takes them
        self._unbatched: Optional[MinibatchPotential] = None  # a potential vmap cannot batch (_chains_gradient)
        self._first_batch_size = 0  # the batch dimension of the loader's first batch
        self._kwarg_tensors: tuple = ()
        self._resume: Optional[dict] = None
        self._reset()

    # ----- subclass interface ------------------------------------------------------------------------------------
    def _init_state(self, position: Tensor) -> tuple:
        raise NotImplementedError

    def _update(
        self, noise: Tensor, state: tuple, grad: Tensor, step_size: Tensor, precond: Optional[Tensor] = None
    ) -> tuple:
        """The update rule; ``precond`` is the constant diagonal preconditioner (``_precond``: :math:`M^{-1}` to the
        power ``_precond_power``), ``None`` for none."""
        raise NotImplementedError

    def _build_potential(self, args: tuple, kwargs: dict) -> MinibatchPotential:
        return MinibatchPotential(
            self._model, args, kwargs, subsample_size=self.subsample_size, data_plate=self.data_plate,
            transforms=self.user_transforms, data_size=None if self._stream is None else self._stream.size,
            batch_keys=self._batch_keys(),
        )

    def _batch_keys(self) -> tuple[str, ...]:
        """With a loader, the model's keyword arguments that come from its batches (a dict batch's keys)."""
        return () if self._stream is None else self._stream.keys

    def _start_stream(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """``mcmc.run(loader)``: the model's arguments become those of the loader's first batch (a tuple or list batch
        ``model(*batch)``, a dict batch ``model(**batch)``, a tensor ``model(batch)``; ``kwargs`` added), moved to the
        model's device and dtype (the batch is also the first step's)."""
        self._stream = None
        self._pending_batch = None
        if not any(is_data_loader(a) for a in args) and not any(is_data_loader(v) for v in kwargs.values()):
            return args, kwargs
        if len(args) != 1 or not is_data_loader(args[0]):
            raise TypeError(
                "a loader must be the only positional argument of mcmc.run (mcmc.run(loader), the model being "
                "called as model(*batch) on each tuple batch, model(**batch) on a dict batch, model(batch) on a "
                "tensor); keyword arguments are passed to the model unchanged"
            )
        if self.subsample_size is not None:
            raise ValueError(
                "subsample_size must be None with a loader: the minibatch size is the loader's batch_size"
            )
        # the model's device and dtype (a PyroModule's parameters), else torch's default device and the batches' dtype
        model = self._model
        device, dtype = module_device_dtype(model, buffers=True) if isinstance(model, torch.nn.Module) else (None, None)
        self._stream = BatchStream(args[0], torch.get_default_device() if device is None else device, dtype,
                                   model=self._model, drop_last=self.drop_last, kwargs=kwargs)
        self._pending_batch = self._stream.next()
        self._first_batch_size = int(self._pending_batch[0].shape[0])
        batch_args, batch_kwargs = arguments(self._pending_batch, self._stream.spec)
        return batch_args, {**batch_kwargs, **kwargs}

    @property
    def _U(self) -> MinibatchPotential:
        """The potential :math:`\\tilde U` (built by ``setup``)."""
        assert self.potential is not None, "the kernel has not been set up (mcmc.run)"
        return self.potential

    def _potential_and_grad_inputs(self) -> tuple:
        """Extra tensor inputs of the potential for the next step (none for weight-space kernels)."""
        return ()

    def _potential_fn(
        self,
        flat: Tensor | tuple[Tensor, ...],  # the flat vector, or its flat_parts (the step differentiates those)
        idx: Optional[Tensor],
        *extra: Tensor,
        exclude_gaussian_prior: bool = False,
    ) -> Tensor:
        return self._U(flat, idx, exclude_gaussian_prior=exclude_gaussian_prior)

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
        self.map_steps_limit = 0  # ... and the bound it ran under
        # the diagonal preconditioner: ones (none) until a window of the warm-up adapts it, then frozen
        self._precond: Optional[Tensor] = None
        self._unit_mass: Optional[bool] = getattr(self, "_unit_mass", None)  # that of the traced step (set by sample)
        self.inverse_mass_matrix: Optional[Tensor] = None  # the adapted diagonal M^{-1} (None: unit mass)
        self._adapter: Optional[MassMatrixAdapter] = None
        self._adapted_eta = self.adapted_step_size  # the step in standardised units, once M is adapted
        self._recheck_step = False  # check the adapted step again at the end of warm-up
        self.max_curvature: Optional[float] = None  # the last estimate of the standardised Hessian's top eigenvalue
        self._mcmc_runner: Any = None
        self._progress_bar: Any = None
        self._chain_closed = True

    @property
    def step_size(self) -> StepSizeSchedule:
        """The step-size schedule over inner steps; set it to a float or a
        :class:`~pyro_sdebnn.infer.mcmc.schedules.StepSizeSchedule` between runs, as ``kernel.step_size = 1e-2``."""
        return self._step_size

    @step_size.setter
    def step_size(self, value: Union[float, StepSizeSchedule]) -> None:
        self._step_size = as_schedule(value)  # a float is wrapped and checked, as in __init__
        self._eta_tensor = None

    def _check_step_size(self) -> None:
        """In ``__init__`` and again at set-up: the step size (which may be set between runs) agrees with the other
        settings."""
        if self.adapt_mass_matrix and not self.step_size.is_constant:
            raise ValueError(
                "the mass-matrix adaptation (adapt_mass_matrix) needs a constant step_size (a float), not a schedule: "
                "set kernel.adapt_mass_matrix = False to run a schedule"
            )

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
        self._own_start = False

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        self._check_step_size()
        self._reset()
        self._warmup_steps = warmup_steps
        # Pyro's runner (for the number of samples and chains of the run, and its progress bar), if MCMC drives us
        self._mcmc_runner, self._progress_bar = find_runner(self)
        args, kwargs = self._start_stream(args, kwargs)
        # every run (and every chain of a run) builds its potential and traces its step afresh: the data may have
        # changed in place, and the same seed then gives the same chain however the kernel was used before
        self.potential = self._build_potential(args, kwargs)
        self._reset_graphs()
        # vectorised chains: MCMC stores them as chains, (num_chains * K, num_samples, *shape)
        self.transforms = chain_transforms(self.potential, self.vectorized_chains)
        check_mcmc_transforms(self, find_mcmc(self))
        U = self._U
        self._model_view.device, self._model_view.dtype = U.device, U.dtype
        if self._stream is not None:  # later batches follow the model's device and dtype
            self._stream.device, self._stream.dtype = U.device, U.dtype
            self._stream.follow_model(U)  # a plate that fixes its subsample_size passes over shorter batches
            assert self._pending_batch is not None  # the loader's first batch, drawn by _start_stream
            self._pending_batch = tuple(move_batch(t, U.device, U.dtype) for t in self._pending_batch)
            # the data tensors of a step: the batch's, then those among the keyword arguments of mcmc.run
            self._kwarg_tensors = U.data_tensors()[len(self._pending_batch):]
        self._precond = torch.ones(U.dim, dtype=U.dtype, device=U.device)
        self._start_run_checks()
        self._resumed = self._resume is not None
        if self._resume is not None:
            self._restore(self._resume, warmup_steps)
            if self.sample_writer is not None:
                self.sample_writer.start_chain()
            return
        if self._own_start:  # the start of a chain that did not end (an error, Ctrl-C in hook_fn): not a user's
            self._initial_params = None
        drawn = self._initial_params is None  # the automatic warm start leaves a user's initial_params alone
        self._own_start = drawn
        if drawn:
            self._initial_params = self._draw_initial_params()
        assert self._initial_params is not None  # the user's or just drawn
        if not drawn:
            _check_initial_params(U, self._initial_params, self.vectorized_chains)
        position = U.pack(self._initial_params).to(U.dtype)
        if self.vectorized_chains > 1 and position.dim() == 1:
            position = position.expand(self.vectorized_chains, -1).clone()
            # MCMC reads the sites' shapes (with the chain dimension) from initial_params after setup
            self._initial_params = U.split(position)
        if (self.map_steps is None and drawn) or (self.map_steps is not None and self.map_steps > 0):
            position = self._map_fit(position)
            self._initial_params = U.split(position)
        self._state = self._init_state(position)
        if self.adapt_mass_matrix:
            adapter = MassMatrixAdapter(warmup_steps * self.num_steps, tuple(position.shape), U.dtype, U.device,
                                        self._CURVATURE_POSITIONS)
            self._adapter = None if adapter.done else adapter
        self._healthy = self._uncertified = self._state
        self._last_params = self._initial_params
        # the step graph is built by the first sample(): MCMC's parent process calls setup() only for the transforms
        if self.sample_writer is not None:
            self.sample_writer.start_chain()

    def _start_run_checks(self) -> None:
        """The end-of-run checks: one :class:`RunChecks` per ``MCMC.run``, shared by the chains it runs one after
        another on this kernel."""
        runner = self._mcmc_runner
        checks = self._run_checks
        same_run = (
            runner is not None and checks is not None and self._runner_id == id(runner)
            and 0 < checks.chains_done < checks.num_chains
        )
        if not same_run:
            num_samples = getattr(runner, "num_samples", None)
            num_chains = getattr(runner, "num_chains", 1) if runner is not None else 1
            self._run_checks = RunChecks(self.potential, num_samples, int(num_chains))
        self._runner_id = None if runner is None else id(runner)
        self._chain_closed = False

    def _progress(self, text: str) -> None:
        """Show ``text`` as the description of Pyro's progress bar (when MCMC runs us with one)."""
        bar = getattr(self, "_progress_bar", None)
        if bar is not None:
            bar.set_description(text, refresh=True)

    def _epoch_steps(self) -> int:
        """Inner steps per pass over the data (1 with full-batch gradients)."""
        if self._stream is not None:
            try:  # less the short last batch, where it is passed over
                return max(1, len(self._stream.loader) - int(self._stream.drops_short_batch))
            except TypeError:
                return max(1, math.ceil(self._stream.size / max(1, self._first_batch_size)))
        U = self._U
        if not U.subsample_sizes:
            return 1
        return max(1, max(math.ceil(U.data_sizes[p] / b) for p, b in U.subsample_sizes.items()))

    def _draw_initial_params(self) -> dict[str, Tensor]:
        U = self._U
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
        U = self._U
        if not U.subsample_sizes:
            return None
        if self._batches is None or self._batch_pos >= len(self._batches):
            # one pass over the data: (batches, [chains,] indices of every subsampled plate, concatenated)
            self._batches = U.index_batches(self.vectorized_chains)
            assert self._batches is not None  # U has subsampled plates
            self._batch_pos = 0
        idx = self._batches[self._batch_pos]
        self._batch_pos += 1
        return idx

    def _next_data(self) -> Optional[tuple]:
        """With a loader, the data tensors of the next step (the tensors of its batch and those among the keyword
        arguments, in the order of :meth:`MinibatchPotential.data_tensors`); ``None`` with tensors.

        :raises ValueError: if the batch has another structure than the first one (tuple length, dict keys) or holds a
            NaN or an infinity (:meth:`BatchStream.next`)."""
        if self._stream is None:
            return None
        tensors, self._pending_batch = self._pending_batch, None
        return (self._stream.next() if tensors is None else tensors) + self._kwarg_tensors

    def _bind(self, data: Optional[tuple]) -> ContextManager[Any]:
        """Within the block the model runs on the batch ``data`` (a no-op with tensors)."""
        if data is None:
            return contextlib.nullcontext()
        return self._U.bound_data(data)

    # ----- warm start from a MAP fit ---------------------------------------------------------------------------
    def _map_fit(self, position: Tensor) -> Tensor:
        """Adam on the minibatch potential from ``position``: ``map_steps`` steps or, with ``map_steps=None``, at
        most one epoch (unless an epoch is shorter than ``_MAP_WINDOW`` steps), 10 % of the run's inner steps and
        ``_AUTO_MAP_STEPS``, stopped once the mean potential over a window of ``_MAP_WINDOW`` steps falls by less than
        ``0.01 (D + 1)``."""
        position = position.detach().clone()
        adam = _Adam(position, lr=self.map_lr)
        auto = self.map_steps is None
        if self.map_steps is not None:
            limit = self.map_steps
        else:
            # one epoch; a pass of fewer than _MAP_WINDOW steps (full-batch gradients, a few batches) is not a
            # useful bound (one Adam step): there only the run's length bounds the warm start
            epoch = self._epoch_steps()
            limit = _AUTO_MAP_STEPS if epoch < _MAP_WINDOW else min(_AUTO_MAP_STEPS, epoch)
            num_samples = getattr(self._mcmc_runner, "num_samples", None)
            if isinstance(num_samples, int):  # MCMC drives the kernel: the inner steps of the whole run
                run_steps = (self._warmup_steps + num_samples) * self.num_steps
                limit = min(limit, max(1, math.ceil(_AUTO_MAP_RUN_FRACTION * run_steps)))
        self.map_steps_limit = limit
        shown = max(1, limit // 20)
        tolerance = 0.01 * (self._U.dim + 1)
        window: list[Tensor] = []
        previous: Optional[float] = None
        with pyro.validation_enabled(False):  # a diverging fit is reported below, not as a validation error
            for step in range(limit):
                if step % shown == 0:
                    self._progress(f"Warm start {step}/{limit}")
                idx = self._next_indices()
                data = self._next_data()
                # the step's other inputs (e.g. a measurement set's precision) are constants of the fit: a graph
                # they carry (a GP kernel's hyper-parameters) must not be back-propagated through, step after step
                extra = tuple(t.detach() if isinstance(t, Tensor) else t for t in self._potential_and_grad_inputs())
                with self._bind(data):  # the sampler's own gradient (closed-form prior terms included)
                    if self.vectorized_chains == 1:
                        grad, value = self._gradient(position, idx, *extra)
                    else:  # the chains together where the model allows it, else chain by chain
                        chains = self._chains_gradient(position, idx, *extra)
                        if chains is None:
                            grads, values = zip(*(
                                self._gradient(position[k], None if idx is None else idx[k], *extra)
                                for k in range(self.vectorized_chains)
                            ))
                            chains = torch.stack(grads), torch.stack(values)
                        grad, value = chains[0], chains[1].sum()
                adam.step(grad)
                if auto:
                    window.append(value.detach())
                    if len(window) == _MAP_WINDOW:
                        mean = float(torch.stack(window).mean())  # one synchronisation per window
                        window = []
                        if not math.isfinite(mean) or (previous is not None and previous - mean < tolerance):
                            break
                        previous = mean
        self.map_steps_taken = step + 1 if limit else 0
        self._progress("Warmup")
        if not bool(_finite_state((position.detach(),))):
            raise SamplerDivergenceError(f"{self._name}: the MAP warm start diverged; use a smaller map_lr")
        return position.detach()

    # ----- the step ------------------------------------------------------------------------------------------------
    def _step(
        self, state: tuple, idx: Optional[Tensor], step_size: Tensor, precond: Optional[Tensor], *extra: Tensor
    ) -> tuple:
        """One inner step of one chain: the gradient and value of the potential on the minibatch, then the update
        rule with fresh noise; returns ``(new state, potential)``. Every backend runs this function: ``"eager"`` as
        it is, chain by chain, the others as the graph traced from it (``vmap``-ed over the chains). ``precond`` is
        the update rule's diagonal preconditioner (ones until warm-up adapts the mass matrix)."""
        grad, value = self._gradient(state[0], idx, *extra)
        return self._move(state, grad, step_size, precond), value

    def _move(self, state: tuple, grad: Tensor, step_size: Tensor, precond: Optional[Tensor]) -> tuple:
        """The update rule of one chain from its gradient, with fresh noise: the second half of :meth:`_step`."""
        noise = torch.randn_like(state[0])
        return tuple(self._update(noise, self._state_type(*state), grad, step_size, precond))

    def _gradient(self, position: Tensor, idx: Optional[Tensor], *extra: Tensor) -> tuple[Tensor, Tensor]:
        """:math:`\\nabla \\tilde U` and :math:`\\tilde U` at ``position`` (the data-parallel kernel overrides this
        with an all-reduce): eagerly by autograd through Pyro's handlers, traced by ``torch.func`` (which composes
        with ``vmap``); both differentiate the per-site pieces of the flat vector. Constant-``Normal`` prior terms
        are added in closed form (``closed_form_prior``)."""
        U = self._U
        split = self.closed_form_prior and U.has_gaussian_prior
        if not self._tracing:
            # the per-site pieces, as traced: the gradient of a slice of one flat vector would be a zero-filled
            # vector of the whole size, summed over the sites
            parts = tuple(part.detach().requires_grad_() for part in U.flat_parts(position))
            with torch.enable_grad():
                value = self._potential_fn(parts, idx, *extra, exclude_gaussian_prior=split)
                grad = torch.cat(_grads(value, parts))
            value = value.detach()
        else:
            grads, value = torch.func.grad_and_value(self._potential_fn)(
                U.flat_parts(position), idx, *extra, exclude_gaussian_prior=split
            )
            grad = torch.cat(grads)
        if split:
            prior_value, prior_grad = U.gaussian_prior(position)
            grad, value = grad.add_(prior_grad), value + prior_value  # grad: a fresh buffer (the concatenation)
        return grad, value

    def _chains_gradient(
        self, position: Tensor, idx: Optional[Tensor], *extra: Tensor
    ) -> Optional[tuple[Tensor, Tensor]]:
        """:meth:`_gradient` at ``K`` positions at once, ``(K, D)`` and ``(K,)``: the potential of one chain
        ``vmap``-ed over the rows and differentiated by autograd (the rows are independent; ``torch.func``'s gradient
        would import ``torch._dynamo``, slow the first time in a process), so one trace of the model serves every
        chain; batched products may round differently from the chain-by-chain ones in the last bits. Used by the
        eager steps of vectorised chains, the warm start and the curvature estimate.

        ``None`` (the caller goes chain by chain) with ``backend="eager"``, for a kernel with its own
        :meth:`_gradient`, and for a model ``vmap`` cannot run (found at the first call, remembered)."""
        U = self._U
        if (
            self.backend_used == "eager" or self._unbatched is U
            or type(self)._gradient is not SGMCMCKernel._gradient
        ):
            return None
        split = self.closed_form_prior and U.has_gaussian_prior
        potential = functools.partial(self._potential_fn, exclude_gaussian_prior=split)
        in_dims = (0, None if idx is None else 0) + (None,) * len(extra)
        parts = tuple(part.detach().requires_grad_() for part in position.split([s.numel for s in U.sites], -1))
        try:
            with torch.enable_grad():
                value = torch.func.vmap(potential, in_dims=in_dims)(parts, idx, *extra)
                grads = _grads(value.sum(), parts)
        except Exception:  # noqa: BLE001 - a model vmap cannot run is differentiated chain by chain
            self._unbatched = U
            return None
        grad, value = torch.cat(grads, -1), value.detach()
        if split:  # chain by chain, as _gradient adds it
            for k in range(len(position)):
                prior_value, prior_grad = U.gaussian_prior(position[k])
                grad[k].add_(prior_grad)
                value[k] += prior_value
        return grad, value

    def _eager_step(self, state: tuple, idx: Optional[Tensor], step_size: Tensor, *extra: Tensor) -> tuple:
        """:meth:`_step` eagerly, chain by chain (the gradients together where :meth:`_chains_gradient` can), without
        Pyro's argument validation (the model was validated at set-up; a non-finite state is a divergence)."""
        with pyro.validation_enabled(False):
            if self.vectorized_chains == 1:
                return self._step(state, idx, step_size, self._precond, *extra)
            chains = self._chains_gradient(state[0], idx, *extra)
            if chains is not None:  # the gradients together; the noise and the update chain by chain, as below
                grads, values = chains
                outs = [(self._move(tuple(t[k] for t in state), grads[k], step_size, self._precond), values[k])
                        for k in range(self.vectorized_chains)]
            else:
                outs = [
                    self._step(
                        tuple(t[k] for t in state), None if idx is None else idx[k], step_size, self._precond, *extra
                    )
                    for k in range(self.vectorized_chains)
                ]
        new_state = tuple(torch.stack([o[0][j] for o in outs]) for j in range(len(state)))
        return new_state, torch.stack([o[1] for o in outs])

    def _take_step(self, state: tuple, eta: Tensor) -> tuple:
        """One inner step on the next minibatch (indices with tensors, the next batch with a loader)."""
        idx = self._next_indices()
        data = self._next_data()
        extra = tuple(self._potential_and_grad_inputs())
        eager_start = self.backend == "auto" and self._t < min(_AUTO_EAGER_STEPS, self.compile_after)
        if self.backend_used != "eager" and not eager_start:
            out = self._traced_step(state, idx, eta, extra, data)
            if out is not None:
                return out
        with self._bind(data):
            return self._eager_step(state, idx, eta, *extra)

    def build_step_fn(self) -> Callable:
        """The inner step ``(state, idx, step_size, *extra) -> (state, potential)`` on the model's current data, with
        the kernel's backend and current preconditioner (traced on the first call)."""
        if self.backend_used == "eager":
            return self._eager_step

        def step(state: tuple, idx: Optional[Tensor], step_size: Tensor, *extra: Tensor) -> tuple:
            out = self._traced_step(state, idx, step_size, extra, None)
            return self._eager_step(state, idx, step_size, *extra) if out is None else out

        return step

    # ----- the traced step -------------------------------------------------------------------------------------------
    def _reset_graphs(self) -> None:
        """Forget the traced graphs (new data or model): the next step traces again."""
        self._graphs: dict[Any, Callable] = {}  # shapes of the data inputs -> the graph's runner
        self._graph_modules: dict[Any, Any] = {}  # shapes of the data inputs -> the traced graph
        self.backend_used = "fx" if self.backend == "auto" else self.backend
        self._fx_steps = 0  # inner steps taken with the eager graph (backend="auto")
        self._resumed = False  # a chain restored from a checkpoint: its first trace must not draw (see below)

    @property
    def _graph_module(self) -> Any:
        """The first traced graph (``None`` before the first traced step)."""
        return next(iter(self._graph_modules.values()), None)

    def _traced_step(
        self, state: tuple, idx: Optional[Tensor], step_size: Tensor, extra: tuple, data: Optional[tuple]
    ) -> Optional[tuple]:
        """The step through the graph traced for the shapes of ``data`` (the model's own data tensors if ``None``),
        traced on first use; ``None`` if the model cannot be traced (``backend="auto"`` then continues eagerly)."""
        if data is None:
            data = self._U.data_tensors()
        key = tuple(t.shape for t in data)
        run = self._graphs.get(key)
        if run is None and self._graphs and self._t < self._epoch_steps() and _batch_size(key) < max(
                _batch_size(k) for k in self._graphs):
            # a smaller batch than one traced (a loader's short last batch, once per epoch) is traced from the second
            # epoch on: a one-epoch run would pay a whole trace for one step (the caller takes the step eagerly). The
            # rule depends on the step count only, so that a resumed chain steps as the uninterrupted one
            return None
        inputs = (*state, *(() if idx is None else (idx,)), step_size, self._precond, *extra, *data)
        if run is None:
            run = self._trace_graph(state, idx, step_size, extra, data, key)
            if run is None:
                return None
        # the preconditioner is an input of the graph: it changes only at the ends of the adaptation windows
        out = run(*inputs)
        return tuple(out[: len(state)]), out[len(state)]

    def _trace_graph(
        self, state: tuple, idx: Optional[Tensor], step_size: Tensor, extra: tuple, data: tuple, key: Any
    ) -> Optional[Callable]:
        """Trace :meth:`_step` (``vmap``-ed over vectorised chains) into a graph of the state, the minibatch indices,
        the step size, the preconditioner, the extra inputs and the data. Tracing runs the step once and draws its
        noise: the first graph of a fresh chain from torch's random stream, as the first step always has; any later
        trace puts the random state back, so that the chain does not depend on when a graph was traced."""
        from torch.fx.experimental.proxy_tensor import make_fx

        num_state, has_idx, num_data = len(state), idx is not None, len(data)
        U = self._U

        def chains_step(state: tuple, idx: Optional[Tensor], *rest: Tensor) -> tuple:
            if self.vectorized_chains == 1:
                return self._step(state, idx, *rest)
            in_dims = (0, None if idx is None else 0) + (None,) * len(rest)
            return torch.func.vmap(self._step, in_dims=in_dims, randomness="different")(state, idx, *rest)

        def flat_step(*flat: Tensor) -> tuple[Tensor, ...]:  # (*state, [idx], step_size, precond, *extra, *data)
            inputs, batch = flat[: len(flat) - num_data], flat[len(flat) - num_data :]
            rest = inputs[num_state:]
            chain_idx, rest = (rest[0], rest[1:]) if has_idx else (None, rest)
            with U.bound_data(batch):
                new_state, value = chains_step(inputs[:num_state], chain_idx, *rest)
            return (*new_state, value)

        device = U.device
        random_state: ContextManager[Any]
        if self._graph_modules or self._resumed:
            random_state = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
        else:
            random_state = contextlib.nullcontext()
        self._tracing = True
        try:
            with random_state, pyro.validation_enabled(False), poutine.block(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph = make_fx(flat_step)(*state, *([idx] if has_idx else []), step_size, self._precond, *extra, *data)
                # make_fx records every operation the tracing ran, also those whose results nothing uses (the copies
                # of tensor constants a model's priors hold, their expansions): dropped here, or each step would run
                # them. Random draws count as side effects and stay, so the random stream is unchanged
                graph.graph.eliminate_dead_code()
                graph.recompile()
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
        finally:
            self._tracing = False
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
        """``backend="auto"``: compile the step graphs after ``compile_after`` inner steps with the eager graph. The
        switch is a step count, not a measured time, so the same seed gives the same chain."""
        if self.backend != "auto" or self.backend_used != "fx" or self._fx_steps < 0:
            return
        self._fx_steps += self.num_steps
        if self._fx_steps >= self.compile_after:
            self.backend_used = "compile"
            self._graphs = {key: self._runner(graph) for key, graph in self._graph_modules.items()}


    # ----- MCMCKernel API --------------------------------------------------------------------------------------
    def _eta(self, t: int) -> float:
        """The step size of inner step ``t``: the schedule (``adapted_step_size`` once warm-up has adapted the mass
        matrix) times the factor of the warm-up step-size search."""
        if self.inverse_mass_matrix is not None:
            return self._adapted_eta * self._step_scale
        eta = self.step_size(t)
        if not self.step_size.is_constant:  # a user's schedule: a zero step would freeze the chain, a negative,
            try:  # infinite or NaN one pass for a divergence of the sampler
                valid = not isinstance(eta, bool) and 0 < float(eta) < math.inf
            except (TypeError, ValueError):
                valid = False
            if not valid:
                raise ValueError(f"step_size schedule {self.step_size!r} returned {eta!r} at inner step {t}: a "
                                 "step size must be a positive finite float")
        return eta * self._step_scale

    # the largest step in standardised units, given the largest eigenvalue lambda of the preconditioned Hessian:
    # SGLD's update is stable up to eta = 4 / lambda, SGHMC's up to eta = 2 / sqrt(lambda). SGLD with the
    # Leimkuhler-Matthews noise (its default) keeps a Gaussian's variance at any stable step and takes three
    # quarters of its limit; with Euler-Maruyama's noise its stationary variance along a direction of curvature h is
    # 1 / (h (1 - eta h / 4)), and a quarter (eta = 1 / lambda) holds it to 4/3 of the target's. SGHMC: a quarter
    _CURVATURE_POWER = 1.0  # eta <= _CURVATURE_FACTOR * lambda ** -_CURVATURE_POWER
    _CURVATURE_FACTOR = 1.0
    _CURVATURE_ITERATIONS = 20  # power iterations per position (SGHMC: 10)
    _CURVATURE_BATCHES = 8  # minibatches averaged in each Hessian-vector product
    _CURVATURE_POSITIONS = 1  # positions of the last window at which the sampling step is checked (SGHMC: 8)

    def _stable_step(self, positions: list[Tensor]) -> float:
        """``adapted_step_size``, or less where the preconditioned potential is stiffer: the largest eigenvalue
        :math:`\\lambda` of :math:`M^{-1/2} \\nabla^2 \\tilde U M^{-1/2}` over ``positions`` (each ``(D,)`` or
        ``(K, D)``) caps the step at :math:`a \\lambda^{-p}` (``_CURVATURE_FACTOR``, ``_CURVATURE_POWER``; see
        :doc:`/methods/sgmcmc` for the values and why).

        Each Hessian-vector product is a central finite difference of the gradient, averaged over up to
        ``_CURVATURE_BATCHES`` minibatches with equal weights (one minibatch's Hessian varies several-fold from batch
        to batch); :math:`\\lambda` comes from ``_CURVATURE_ITERATIONS`` power iterations from a random vector, each
        vectorised chain on its own, stopping at a non-finite or zero norm."""
        extra = tuple(t.detach() if isinstance(t, Tensor) else t for t in self._potential_and_grad_inputs())
        assert self.inverse_mass_matrix is not None  # called once a window has adapted M
        scale = self.inverse_mass_matrix.sqrt()
        delta = 1e-2  # in standardised units
        top = 0.0
        with pyro.validation_enabled(False), torch.enable_grad():
            for position in positions:
                # the minibatches whose mean Hessian is estimated (one with full-batch gradients), fresh at each
                # position: the Hessian of a few points near where the likelihood is stiffest can dominate it
                batches = [(self._next_indices(), self._next_data())
                           for _ in range(min(self._CURVATURE_BATCHES, self._epoch_steps()))]
                chains = position.detach().reshape(-1, position.shape[-1])  # (K, D), one row per chain
                K = len(chains)

                def hessian_times(v: Tensor) -> Tensor:  # each chain's M^-1/2 H M^-1/2 v: (K, D)
                    # the gradient at the 2K points x_k +- delta M^-1/2 v_k together, averaged over the minibatches
                    points = torch.cat([chains + delta * scale * v, chains - delta * scale * v])
                    total = torch.zeros_like(points)
                    for idx, data in batches:
                        rows = None if idx is None else idx.reshape(K, -1).repeat(2, 1)  # each point its chain's
                        with self._bind(data):  # the step's own gradient (a data-parallel kernel's all-reduced)
                            together = self._chains_gradient(points, rows, *extra)
                            total += together[0] if together is not None else torch.stack([
                                self._gradient(point, None if rows is None else rows[r], *extra)[0]
                                for r, point in enumerate(points)
                            ])
                    mean = total / len(batches)
                    return scale * (mean[:K] - mean[K:]) / (2 * delta)

                # each chain's own power iteration: its own random start (drawn chain by chain, in chain order), its
                # own normalisation, and its own stop at a non-finite or zero norm (lam: its last finite norm)
                v = torch.stack([torch.randn_like(chains[k]) for k in range(K)])
                v = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)
                lam = chains.new_zeros(K)
                running = torch.ones(K, dtype=torch.bool, device=chains.device)
                for _ in range(self._CURVATURE_ITERATIONS):
                    hv = hessian_times(v)
                    norm = torch.linalg.vector_norm(hv, dim=-1)
                    running &= torch.isfinite(norm) & (norm > 0)
                    if not bool(running.any()):
                        break
                    lam = torch.where(running, norm, lam)
                    v = torch.where(running.unsqueeze(-1), hv / norm.unsqueeze(-1), v)
                top = max(top, float(lam.max()))
        self.max_curvature = top
        if top <= 0:
            return self.adapted_step_size
        return min(self.adapted_step_size, self._CURVATURE_FACTOR * top ** -self._CURVATURE_POWER)

    def _exploring_step(self, eta: float) -> float:
        """The step between the adaptation windows, given the capped step ``eta`` (see ``warmup_step_factor``)."""
        return self.warmup_step_factor * eta

    def _follow_step(self) -> None:
        """Before each sample: a kernel whose other constants follow the step size adjusts them (SGHMC's friction)."""

    def _set_inverse_mass(self, estimate: Tensor) -> None:
        """Install a new diagonal :math:`M^{-1}` (coordinates whose estimate is not a positive finite number keep
        the previous value): the update rule's preconditioner and the step size change with it."""
        previous = self.inverse_mass_matrix if self.inverse_mass_matrix is not None else torch.ones_like(estimate)
        estimate = torch.where(torch.isfinite(estimate) & (estimate > 0), estimate, previous)
        self.inverse_mass_matrix = estimate
        self._precond = estimate if self._precond_power == 1.0 else estimate.pow(self._precond_power)
        self._eta_tensor = None

    def _retrace(self) -> None:
        """Trace the step again on its next call (a constant of the traced step changed), without drawing from the
        random generator (as after a restore)."""
        if self._graph_modules:
            self._resumed = True
        self._graphs.clear()
        self._graph_modules.clear()

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        U = self._U
        assert self._state is not None  # set by setup
        # without a mass matrix the update rule skips its products with ones
        unit = self._adapter is None and self.inverse_mass_matrix is None
        if unit != self._unit_mass:
            self._unit_mass = unit
            self._retrace()
        if self._recheck_step and self._sample_count == self._warmup_steps:
            # the end of an adapted warm-up: the step is checked once more at the settled chain's position
            self._recheck_step = False
            self._adapted_eta = min(self._adapted_eta, self._stable_step([self._state[0]]))
            self._eta_tensor = None
        self._follow_step()
        if params is not self._last_params:  # the runner (or a user) handed us other parameters
            position = U.pack(params).to(U.dtype)
            self._state = (position,) + tuple(self._state[1:])
        start_t = self._t
        state = self._state
        # the potential of every inner step, in one buffer (per-step scalars would fragment the allocator's heap)
        potentials: Optional[Tensor] = None
        constant = self.step_size.is_constant
        eta = self._eta_tensor if constant else None
        if eta is None:
            eta = self._eta_tensor = torch.tensor(self._eta(self._t), dtype=U.dtype, device=U.device)
        error: Optional[Exception] = None
        with torch.no_grad():  # the traced graph holds its own backward pass; no autograd across steps
            for _ in range(self.num_steps):
                if not constant:
                    eta = torch.tensor(self._eta(self._t), dtype=U.dtype, device=U.device)
                try:
                    state, value = self._take_step(state, eta)
                except (RuntimeError, ValueError) as e:
                    # an op that refuses non-finite input: a divergence if the state had diverged (checked below),
                    # the model's own error otherwise
                    error = e
                    break
                if potentials is None:  # NaN for steps not taken: the energy check then skips the sample
                    potentials = value.new_full((self.num_steps,) + value.shape, float("nan"))
                potentials[self._t - start_t] = value
                self._t += 1
                if self._adapter is not None:  # warm-up only: collect the position, adapt at a window's end
                    adapted = self._adapter.observe(self._t - 1, state[0])
                    if adapted is not None:
                        estimate, positions = adapted
                        self._set_inverse_mass(estimate)
                        self._adapted_eta = self._stable_step(positions)
                        if not self._adapter.done:  # explore until the last window ends (see warmup_step_factor)
                            self._adapted_eta = self._exploring_step(self._adapted_eta)
                        else:  # frozen from here on
                            self._adapter = None
                            self._recheck_step = True
                        self._step_scale = 1.0  # a step found for the previous preconditioner is moot
                        eta = self._eta_tensor = torch.tensor(self._eta(self._t), dtype=U.dtype, device=U.device)
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
        # the one host synchronisation per sample: per chain, finite or not, its energy, its last potential and its
        # first (at the state the previous sample returned)
        host = torch.stack(
            [finite.to(energy.dtype), energy, potentials[-1].reshape(-1).to(energy.dtype),
             potentials[0].reshape(-1).to(energy.dtype)]
        ).detach().cpu().double().numpy()
        if error is None:
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
        if sample_index >= 0 and self._run_checks is not None:
            self._run_checks.observe(self._state[0])
        if self.sample_writer is not None and sample_index >= 0:
            self.sample_writer.write({s.name: s.transform(params[s.name]) for s in U.sites})
        return params

    # ----- checkpoints ------------------------------------------------------------------------------------------
    def _signature(self) -> dict[str, Any]:
        """What a checkpoint must match: the kernel, its latent sites, the data sizes and the vectorised chains."""
        U = self._U
        return {
            "kernel": type(self).__name__,
            "sites": [[site.name, list(site.shape)] for site in U.sites],
            "data_sizes": {p: int(n) for p, n in U.data_sizes.items()},
            "vectorized_chains": int(self.vectorized_chains),
        }

    def state_dict(self) -> dict[str, Any]:
        """The state of the chain after the last :meth:`sample`, enough to continue it exactly (as an optimiser's
        ``state_dict``): the chain's state, step and sample counts, the warm-up's step factor, adapted mass matrix
        and window sums, divergence records, the divergence check's energy history, the minibatch position and the
        random state (torch, CUDA, NumPy, Python). It holds only tensors, numbers, strings, lists and dicts, so it
        round-trips through ``torch.load(path, weights_only=True)``;
        :func:`~pyro_sdebnn.infer.mcmc.checkpoint.save_run` writes it with the samples.

        :raises ValueError: before the kernel was set up (``mcmc.run``).
        """
        if self.potential is None or self._state is None:
            raise ValueError("state_dict: the kernel has no chain yet; run it first (mcmc.run)")

        def tensors(state: Optional[tuple]) -> Optional[list[Tensor]]:
            return None if state is None else [t.detach().clone() for t in state]

        def array(a: Optional[np.ndarray]) -> Optional[Tensor]:
            return None if a is None else torch.as_tensor(np.asarray(a, dtype=np.float64).copy())

        stream = None
        if self._stream is not None:
            stream = self._stream.state_dict()
            if self._pending_batch is not None:  # the first batch was drawn but not used yet
                stream["position"] -= 1
        inverse = self.inverse_mass_matrix
        return {
            "signature": self._signature(),
            "state": tensors(self._state),
            "state_type": self._state_type.__name__,
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
            "batch_pos": int(self._batch_pos),
            "loader": stream,
            "rng": rng_state(),
            "adaptation": {
                "inverse_mass": None if inverse is None else inverse.detach().clone(),
                "step": float(self._adapted_eta),
                "adapter": None if self._adapter is None else self._adapter.state_dict(),
                "recheck": bool(self._recheck_step),
            },
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` at the next ``setup`` (``mcmc.run`` on the same model and data, with the
        warm-up left in the checkpoint): the continued chain is the one an uninterrupted run would have given
        (bitwise on CPU with a fixed ``backend``); :func:`~pyro_sdebnn.infer.mcmc.checkpoint.resume_run` does all this.

        :raises TypeError: if ``state_dict`` is not a dict of the expected layout.
        :raises ValueError: if it is the state of another kernel class.
        """
        required = ("signature", "state", "t", "sample_count", "warmup_steps", "rng", "energy")
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
        """Restore the chain saved by :meth:`state_dict` (called by ``setup``, once the potential is built)."""
        self._resume = None
        U = self._U
        saved, here = sd["signature"], self._signature()
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
        assert state is not None  # state_dict saves the chain's state (load_state_dict checked the key)
        saved_type = sd.get("state_type")  # the layout's name (a checkpoint of an earlier version has none)
        expected = self._state_type.__name__
        if (len(state) != len(cast("type[NamedTuple]", self._state_type)._fields)
                or saved_type not in (None, expected)):
            saved = saved_type if saved_type is not None else f"{len(state)} tensor(s)"
            raise ValueError(f"the checkpoint's chain state ({saved}) does not match this kernel's ({expected}): "
                             "preconditioned or not, or another integrator (SGLD's integrator='euler' keeps one "
                             "tensor, the default 'lm' two)")
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
        self._energy_all = [r.numpy().copy() for r in energy["all"]]
        self._energy_recent = deque((r.numpy().copy() for r in energy["recent"]), maxlen=_RECENT)
        self._energy_stride, self._energy_seen = int(energy["stride"]), int(energy["seen"])
        self._healthy_energy = None if energy["healthy"] is None else energy["healthy"].numpy().copy()
        batches = sd.get("batches")
        self._batches = None if batches is None else batches.to(U.device)
        self._batch_pos = int(sd["batch_pos"])
        if self._stream is not None:
            self._pending_batch = None
            self._stream.restore(sd["loader"])
        set_rng_state(sd["rng"])  # torch's (CPU and CUDA), NumPy's, Python's; the loader's are the stream's
        self._initial_params = U.split(self._state[0])
        self._own_start = True
        self._last_params = self._initial_params
        adaptation = sd.get("adaptation") or {}
        self.inverse_mass_matrix = None
        self._precond = torch.ones(U.dim, dtype=U.dtype, device=U.device)
        if adaptation.get("inverse_mass") is not None:
            self._set_inverse_mass(adaptation["inverse_mass"].to(device=U.device, dtype=U.dtype))
            self._adapted_eta = float(adaptation["step"])
        self._adapter = None
        self._recheck_step = bool(adaptation.get("recheck", False))
        if adaptation.get("adapter") is not None:
            self._adapter = MassMatrixAdapter(int(sd["warmup_steps"]) * self.num_steps, tuple(self._state[0].shape),
                                              U.dtype, U.device, self._CURVATURE_POSITIONS)
            self._adapter.load_state_dict(adaptation["adapter"])

    # ----- divergence detection --------------------------------------------------------------------------------
    def _energy(self, state: tuple, potential: Tensor) -> Tensor:
        """The energy watched by the divergence check: the potential of the last inner step (SGHMC adds the
        kinetic energy)."""
        return potential

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
    ) -> dict[int, tuple[int, str, bool]]:
        """``{chain: (inner step, cause, previous)}`` of the chains that diverged in this sample (the rule of
        :mod:`~pyro_sdebnn.infer.mcmc.diagnostics`). ``previous``: the state the previous sample returned was
        already bad, so that draw is divergent too (the check reads the start of a sample's last inner step)."""
        flagged: dict[int, tuple[int, str, bool]] = {}
        base = self.temperature * (self._U.dim + 10)  # T (D + 10)
        limits = energy_threshold(self._energy_recent, self._energy_all, base) if error is None else None

        def previous(k: int) -> bool:
            first = host[3, k]
            return error is None and bool(not np.isfinite(first) or (limits is not None and first > limits[0][k]))

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
                flagged[int(k)] = (step, cause, previous(int(k)))
        if limits is not None:
            threshold, level, spread = limits
            for k in np.flatnonzero((host[0] > 0) & (host[1] > threshold)):
                cause = self._describe_energy(host[1, k], host[2, k], threshold[k], level[k], spread[k])
                flagged[int(k)] = (start_t + self.num_steps - 1, cause, previous(int(k)))
        return flagged

    def _certify(self, flagged: dict) -> None:
        """The energy of a sample is the potential at the start of its last inner step, which comes after the state
        the previous sample returned: a passing check certifies that state (one sample late), not the new one."""
        if not flagged:
            self._healthy = self._uncertified
        elif self.vectorized_chains > 1:
            # setup sets all three to the initial state
            assert self._state is not None and self._healthy is not None and self._uncertified is not None
            keep = torch.zeros(self.vectorized_chains, dtype=torch.bool, device=self._state[0].device)
            keep[list(flagged)] = True
            keep = keep.unsqueeze(-1)
            self._healthy = tuple(torch.where(keep, h, p) for h, p in zip(self._healthy, self._uncertified))
        self._uncertified = self._state

    def _handle_divergences(
        self, flagged: dict[int, tuple[int, str, bool]], state: tuple, sample_index: int, error: Optional[Exception]
    ) -> tuple:
        """Raise, or restart the flagged chains from their last healthy state with zero auxiliary state, recording
        each restart; in an adapting warm-up, also halve the step size. The divergent draws are this sample's and,
        where the previous sample's state was already bad, that earlier one."""
        K = self.vectorized_chains
        adapting = sample_index < 0 and (
            self.adapt_step_size or self._adapter is not None or self.inverse_mass_matrix is not None
        )
        if self._adapter is not None:  # the window's draws led to the divergence: collect them afresh
            self._adapter.restart_window()
        if self.on_divergence == "raise" and not adapting:
            lines = [
                (f"chain {k}: " if K > 1 else "")
                + f"diverged at inner step {step} (step size {self._eta(step):.3g}): {cause}"
                for k, (step, cause, _) in sorted(flagged.items())
            ]
            raise SamplerDivergenceError(
                f"{self._name} " + "; ".join(lines) + ". Use a smaller step_size (or a decaying schedule, or a "
                "warm-up, which halves a constant step size at each divergence: warmup_steps, adapt_step_size), or "
                "pass on_divergence='continue' to record a divergence and restart the chain from its last healthy "
                "state."
                + (" A chain that diverges in its first steps often starts at a bad point (e.g. a scale drawn close "
                   "to 0): keep the default start (init_strategy=init_to_robust with the automatic MAP warm start, "
                   "map_steps=None) and let a warm-up find a stable step."
                   if min(step for step, _, _ in flagged.values()) < 10 else "")
            ) from error
        bad_previous = sample_index >= 1 and any(previous for _, _, previous in flagged.values())
        for k, (step, cause, previous) in sorted(flagged.items()):
            record = {"sample": sample_index, "warmup": sample_index < 0, "chain": k, "step": step,
                      "step_size": self._eta(step), "cause": cause}
            if previous and sample_index >= 1:
                record["bad draw"] = sample_index - 1  # the draw returned before this check saw its state
            self.divergence_log.append(record)
        if adapting:
            if len([r for r in self.divergence_log if r.get("halved")]) >= _MAX_HALVINGS:
                raise SamplerDivergenceError(
                    f"{self._name}: the warm-up step-size search halved the step size {_MAX_HALVINGS} times (to "
                    f"{self._eta(self._t):.3g}) and the chain still diverges: " + "; ".join(
                        c for _, c, _ in flagged.values()
                    ) + ". Check the model or start from a MAP fit (map_steps)."
                ) from error
            self._step_scale *= 0.5
            self._eta_tensor = None
            self.divergence_log[-1]["halved"] = True
        elif sample_index >= 0:
            if bad_previous and (not self._divergences or self._divergences[-1] != sample_index - 1):
                self._divergences.append(sample_index - 1)
            self._divergences.append(sample_index)
        healthy = self._healthy
        assert healthy is not None  # setup sets it to the initial state
        if K == 1:
            return (healthy[0],) + tuple(torch.zeros_like(t) for t in healthy[1:])
        mask = torch.zeros(K, dtype=torch.bool, device=state[0].device)
        mask[list(flagged)] = True
        mask = mask.unsqueeze(-1)
        restarted = [torch.where(mask, healthy[0], state[0])]
        restarted += [torch.where(mask, torch.zeros_like(t), t) for t in state[1:]]
        return tuple(restarted)

    def __getstate__(self) -> dict[str, Any]:
        """The kernel as pickled (``MCMC(num_chains > 1)``'s worker processes) or deep-copied: without what a run
        built (the potential, the traced graphs, the loader's stream, the runner), which the copy builds again at its
        own set-up. A traced graph does not load in a fresh process and a compiled one cannot be pickled."""
        state = self.__dict__.copy()
        state.update(
            potential=None, transforms=None, _graphs={}, _graph_modules={}, _fx_steps=0,
            backend_used="fx" if self.backend == "auto" else self.backend, _resumed=False,
            _unbatched=None, _unit_mass=None, _stream=None, _pending_batch=None, _kwarg_tensors=(), _mcmc_runner=None,
            _progress_bar=None, _run_checks=None, _runner_id=None,
        )
        return state

    def cleanup(self) -> None:
        if self.sample_writer is not None:
            self.sample_writer.flush()
        self._initial_params = None  # the next chain draws its own initial values
        self._own_start = False
        self._end_of_chain()

    def _end_of_chain(self) -> None:
        """Close the chain's end-of-run checks (Pyro calls ``cleanup`` twice per chain: once is enough); after the
        run's last chain, one :class:`SamplerWarning` per problem (see :mod:`~pyro_sdebnn.infer.mcmc.diagnostics`)."""
        if self._chain_closed or self._run_checks is None:
            return
        self._chain_closed = True
        if self._sample_count <= self._warmup_steps:  # set up without sampling (e.g. to learn the transforms)
            return
        if self._run_checks.end_chain(len(self._divergences)):
            for line in self._run_checks.messages(self._name, self._faster_mixing):
                warnings.warn(line, SamplerWarning, stacklevel=2)
            self._run_checks = None

    def logging(self) -> dict[str, str]:
        """What ``MCMC``'s progress bar shows after each sample: the current step size and the mean potential
        :math:`\\tilde U` of the last draw over the chains."""
        out = {"step size": f"{self._eta(max(self._t - 1, 0)):.2e}"}
        if self._last_potential is not None:
            out["potential"] = f"{float(self._last_potential.mean()):.4g}"
        return out

    def diagnostics(self) -> dict[str, Any]:
        """What ``MCMC.diagnostics()`` reports per chain: ``"divergences"`` (the sample indices, as for Pyro's HMC,
        which ``MCMC.summary`` and ArviZ read), the ``"backend"`` used, the ``"divergence log"``, the adapted
        ``"step size"``, ``"mass matrix adapted"``, ``"warm start steps"`` and, over a loader, ``"batches passed
        over"``. No ``"acceptance rate"``: without an accept/reject step it would be 1 by construction."""
        out: dict[str, Any] = {
            "divergences": list(self._divergences),
            # backend="auto" before its first trace has stepped eagerly only
            "backend": self.backend_used if self._graph_modules or self.backend != "auto" else "eager",
            "divergence log": [dict(r) for r in self.divergence_log],
        }
        if self.adapt_step_size or self.inverse_mass_matrix is not None:
            out["step size"] = self._eta(self._t)
        out["mass matrix adapted"] = self.inverse_mass_matrix is not None
        out["warm start steps"] = int(self.map_steps_taken)
        if self._stream is not None:
            out["batches passed over"] = self._stream.passed_over
        return out
