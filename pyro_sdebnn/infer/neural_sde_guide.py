# SPDX-License-Identifier: Apache-2.0
"""Neural-SDE posterior over Ornstein–Uhlenbeck weight paths: :class:`NeuralSDEPath` and :class:`NeuralSDEGuide`.

The *model* samples a weight path from the prior, ``pyro.sample("w_path", OUPath(w0, sigma, times,
method="euler"))``. The *guide* samples the same site from :class:`NeuralSDEPath`, the Euler–Maruyama law of the
posterior SDE [1]

.. math::

    dw_t = \\big(-\\theta w_t + \\mathrm{NN}(w_t, t; \\phi)\\big)\\,dt + \\sigma\\,dB_t ,
    \\qquad w_{t_0} = \\text{the prior's } w_{t_0},

on the prior's grid. Its ``rsample`` runs the fused Euler loop of :func:`~pyro_sdebnn.ops.sde_solve.euler_maruyama_kl`,
which accumulates the path-KL estimate in the same pass and caches it for
:class:`~pyro_sdebnn.infer.TracePathKL_ELBO`.

The guide must start its path where the prior starts: :class:`NeuralSDEGuide` runs the model up to its last
``OUPath`` site (blocked from outer handlers) and samples each path from the prior's current ``init``, ``sigma``,
``theta`` and ``times``, so that the initial weights may be learnable parameters of the model, the guide's own
sample of an earlier path (``init=a[-1]``), or another guide's value of a sample site such as ``w0`` (that guide
placed before it in an :class:`~pyro.infer.autoguide.AutoGuideList`). A start that cannot be matched (the value is
missing, or depends on randomness hidden by :func:`pyro.poutine.block`) is a ``ValueError`` naming the site: a path
started from a fresh prior draw would make the ELBO silently wrong. Sites that are not ``OUPath`` are not guided.
:doc:`/methods/sdebnn` explains the design in full.

**References**

1. W. Xu, R. T. Q. Chen, X. Li, D. Duvenaud (2022). Infinitely Deep Bayesian Neural Networks with
   Stochastic Differential Equations. AISTATS 2022, PMLR 151. arXiv:2102.06559 (Sec. 3).
2. X. Li, T.-K. L. Wong, R. T. Q. Chen, D. Duvenaud (2020). Scalable Gradients for Stochastic
   Differential Equations. AISTATS 2020. arXiv:2001.01328.
"""

from __future__ import annotations

import copy
from typing import Callable

import pyro
import torch
from pyro import poutine
from pyro.distributions import TorchDistribution, constraints
from pyro.infer.autoguide import AutoGuide
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.trace_messenger import TraceMessenger
from pyro.poutine.util import site_is_subsample
from torch import Tensor, nn
from torch.types import _size

from pyro_sdebnn.distributions import OUPath
from pyro_sdebnn.distributions.ou_path import as_tensor_like
from pyro_sdebnn.nn._param_store import ParamStoreModule, check_name, sync_outside_context
from pyro_sdebnn.nn.sde_drift import DriftMLP, _activation
from pyro_sdebnn.ops.path_kl import check_estimator
from pyro_sdebnn.ops.sde_solve import brownian_increments, euler_maruyama_kl

__all__ = ["NeuralSDEGuide", "NeuralSDEPath"]


class NeuralSDEPath(TorchDistribution):
    """Euler–Maruyama law of a neural-SDE posterior path on a fixed grid, with its path-KL to the OU prior.

    .. math::

        w_{k+1} = w_k + \\big(-\\theta w_k + c(w_k, t_k)\\big)\\Delta t_k + \\sigma \\Delta B_k,
        \\qquad \\Delta B_k \\sim \\mathcal N(0, \\Delta t_k I),

    with :math:`c = \\mathrm{NN}(\\cdot;\\phi)` the drift correction. ``rsample`` also computes the
    path-KL estimate :math:`\\widehat{\\mathrm{KL}}(q\\|p)` against the OU prior
    ``OUPath(init, sigma, times, theta, method="euler")`` in the same loop and caches it: with
    :math:`u_k = c(w_k, t_k)/\\sigma`, the sum :math:`\\sum_k \\tfrac12 |u_k|^2 \\Delta t_k` (``"analytic"``)
    plus, for ``"full_mc"`` and ``"stl"``, the zero-mean term :math:`\\sum_k v_k \\cdot \\Delta B_k` described in
    :class:`~pyro_sdebnn.infer.TracePathKL_ELBO` (Xu et al. [1], Sec. 3.1 and App. A; Li et al. [2]); see
    :meth:`path_kl`. ``log_prob`` is the Euler Gaussian transition density; for the cached sample it
    is evaluated from the stored noise (whose total derivative along the reparameterised path is zero,
    as it must be).

    Shapes: ``event_shape = (K, D)``, ``batch_shape = broadcast(init.shape[:-1], sigma.shape,
    theta.shape)`` (as ``OUPath``: ``sigma`` and ``theta`` are shared by the D state dimensions).

    :param Tensor init: :math:`w_{t_0}`, shape ``batch + (D,)``.
    :param sigma: diffusion scale (> 0), same as the prior's.
    :param Tensor times: ``(K + 1,)`` strictly increasing grid.
    :param theta: prior mean reversion (> 0).
    :param callable correction: :math:`c(t, w)` ``-> (..., D)``, usually an ``nn.Module``; ``None``
        gives the prior itself.
    :param str estimator: path-KL estimator computed by ``rsample`` (``"stl"`` needs an ``nn.Module``
        correction so that its parameters can be detached).

    >>> times = torch.linspace(0, 1, 11)
    >>> q = NeuralSDEPath(torch.zeros(3), 0.5, times, correction=DriftMLP(3, hidden=8))
    >>> w = q.rsample((2,))
    >>> w.shape, q.path_kl(w).shape
    (torch.Size([2, 10, 3]), torch.Size([2]))
    """

    arg_constraints = {"init": constraints.independent(constraints.real, 1), "sigma": constraints.positive,
                       "theta": constraints.positive}
    support = constraints.independent(constraints.real, 2)
    has_rsample = True

    def __init__(self, init: Tensor, sigma: Tensor | float, times: Tensor, theta: Tensor | float = 1.0, *,
                 correction: Callable[[Tensor, Tensor], Tensor] | None = None, estimator: str = "stl",
                 validate_args: bool | None = None) -> None:
        if not isinstance(init, Tensor) or init.dim() < 1:
            raise ValueError("NeuralSDEPath: `init` must be a tensor of shape batch + (D,)")
        check_estimator(estimator)
        if estimator == "stl" and correction is not None and not isinstance(correction, nn.Module):
            raise TypeError("NeuralSDEPath: estimator='stl' needs `correction` to be an nn.Module")
        sigma = as_tensor_like(sigma, init)
        theta = as_tensor_like(theta, init)
        batch_shape = torch.broadcast_shapes(init.shape[:-1], sigma.shape, theta.shape)
        self.init = init.expand(batch_shape + init.shape[-1:])
        self.sigma, self.theta = sigma.expand(batch_shape), theta.expand(batch_shape)
        self.times = torch.as_tensor(times).to(dtype=init.dtype, device=init.device)
        self.correction = correction
        self.estimator = estimator
        self._cache: tuple[Tensor, Tensor, Tensor, str] | None = None
        event_shape = torch.Size((self.times.shape[0] - 1, init.shape[-1]))
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        """The same path law with its initial state broadcast to ``batch_shape`` (the networks are shared);
        ``_instance`` as in ``torch.distributions.Distribution.expand``."""
        new = self._get_checked_instance(NeuralSDEPath, _instance)
        batch_shape = torch.Size(batch_shape)
        new.init = self.init.expand(batch_shape + self.init.shape[-1:])
        new.sigma, new.theta = self.sigma.expand(batch_shape), self.theta.expand(batch_shape)
        new.times = self.times
        new.correction, new.estimator, new._cache = self.correction, self.estimator, None
        super(NeuralSDEPath, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def with_estimator(self, estimator: str) -> "NeuralSDEPath":
        """A shallow copy that computes ``estimator`` when sampled."""
        check_estimator(estimator)
        if estimator == self.estimator:
            return self
        new = copy.copy(self)
        new.estimator, new._cache = estimator, None
        return new

    def _solve(self, dB: Tensor, estimator: str):
        # for "stl" euler_maruyama_kl builds the detached copy of the correction (an nn.Module, checked in __init__)
        return euler_maruyama_kl(self.init, self.times, dB, self.sigma.unsqueeze(-1), self.theta.unsqueeze(-1),
                                 self.correction, estimator=estimator)

    def rsample(self, sample_shape: _size = torch.Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        dB = brownian_increments(self.times, shape[:-2] + shape[-1:])
        return self.rsample_from_noise(dB)

    def rsample_from_noise(self, dB: Tensor) -> Tensor:
        """The path driven by given Brownian increments ``dB`` of shape ``(..., K, D)``; caches the KL."""
        sol = self._solve(dB, self.estimator)
        self._cache = (sol.path, sol.kl, dB, self.estimator)
        return sol.path

    def _noise_of(self, value: Tensor, detach: bool = True) -> Tensor:
        """Recover the increments that generated ``value`` (detached by default: the noise does not depend on φ)."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and not detach):
            init = self.init.expand(value.shape[:-2] + value.shape[-1:]).unsqueeze(-2)
            prev = torch.cat([init, value[..., :-1, :]], -2)
            dts = (self.times[1:] - self.times[:-1]).unsqueeze(-1)
            drift = -self.theta[..., None, None] * prev
            if self.correction is not None:
                drift = drift + torch.stack([self.correction(self.times[k], prev[..., k, :])
                                             for k in range(prev.shape[-2])], -2)
            return (value - prev - drift * dts) / self.sigma[..., None, None]

    def path_kl(self, value: Tensor, estimator: str | None = None) -> Tensor:
        """Path-KL estimate :math:`\\widehat{\\mathrm{KL}}(q\\|p)` along ``value``, shape ``sample + batch``.

        If ``value`` is the tensor last returned by :meth:`rsample` the estimate computed during
        sampling is returned (no extra network evaluations); otherwise the driving noise is recovered
        from ``value`` and the path is re-solved.

        :param Tensor value: a path ``(..., K, D)``.
        :param str estimator: default: this distribution's ``estimator``.
        """
        estimator = check_estimator(estimator or self.estimator)
        if self._cache is not None and self._cache[0] is value and self._cache[3] == estimator:
            return self._cache[1]
        return self._solve(self._noise_of(value), estimator).kl

    def log_prob(self, value: Tensor) -> Tensor:
        r"""Euler log density of the path ``value`` given ``init`` (for the cached sample, from its stored noise):
        :math:`\sum_{k,d} \log\mathcal N\big(w_{k+1,d};\ w_{k,d} + (-\theta w_{k,d} + c_d(w_k, t_k))\Delta t_k,
        \ \sigma^2\Delta t_k\big)`."""
        if self._validate_args:
            self._validate_sample(value)
        if self._cache is not None and self._cache[0] is value:
            dB = self._cache[2]
        else:
            dB = self._noise_of(value, detach=False)
        dts = (self.times[1:] - self.times[:-1]).unsqueeze(-1)
        # Euler transition N(w_k + f dt, sigma^2 dt) evaluated at w_{k+1} = w_k + f dt + sigma dB
        var = self.sigma[..., None, None].pow(2) * dts
        lp = -0.5 * dB.pow(2) / dts - 0.5 * torch.log(2 * torch.pi * var)
        return lp.sum((-2, -1))


def _enclosing_sample_value(name: str) -> Tensor | None:
    """The value of sample site ``name`` in the innermost enclosing
    :class:`~pyro.poutine.trace_messenger.TraceMessenger`."""
    for frame in reversed(_PYRO_STACK):
        if isinstance(frame, TraceMessenger) and name in frame.trace.nodes:
            node = frame.trace.nodes[name]
            if node["type"] == "sample":
                return node["value"]
    return None


class _PathSites(Messenger):
    """Runs a model up to its last ``OUPath`` site for :class:`NeuralSDEGuide`, then stops it.

    At each ``OUPath`` site the prior is recorded; with ``posterior`` given, the site's distribution is
    replaced by ``posterior(name, prior)`` and the site is let through to the outer handlers (it is the
    guide's site; its value goes back to the model); otherwise a placeholder path (``init`` repeated, plus
    ``offset``) is filled in. Other latent sample sites before the last path site take ``upstream(name, msg)``.
    """

    class Stop(Exception):
        pass

    def __init__(self, names, upstream, posterior=None, offset: float = 0.0) -> None:
        super().__init__()
        self.names, self.upstream, self.posterior, self.offset = set(names), upstream, posterior, offset
        self.found: dict[str, OUPath] = {}
        self.values: dict[str, Tensor] = {}

    def _process_message(self, msg) -> None:
        if msg["type"] != "sample" or msg["is_observed"] or site_is_subsample(msg):
            return
        name, fn = msg["name"], msg["fn"]
        if name not in self.names:
            if msg["value"] is None:  # a value set inside the model (e.g. by poutine.replay) is kept
                msg["value"], msg["done"] = self.upstream(name, msg), True
            return
        self.found[name] = fn
        if self.posterior is not None:
            msg["fn"] = self.posterior(name, fn)
        else:
            msg["value"] = fn.init.unsqueeze(-2).expand(fn.batch_shape + fn.event_shape) + self.offset
            msg["done"] = True

    def _postprocess_message(self, msg) -> None:
        if msg["type"] == "sample" and msg["name"] in self.found and msg["name"] not in self.values:
            self.values[msg["name"]] = msg["value"]
            if len(self.values) == len(self.names):
                raise _PathSites.Stop()


def _guided_value(name: str, msg) -> Tensor:
    value = _enclosing_sample_value(name)
    if value is None:
        raise ValueError(f"NeuralSDEGuide: the model samples site {name!r} before its OUPath sites, and the guide "
                         f"trace holds no value for it: the path would start from a fresh prior draw of {name!r}. "
                         f"Guide {name!r} with a guide that runs before NeuralSDEGuide (e.g. first in an "
                         "AutoGuideList), or make the initial state a parameter")
    return value


class _FunctionDrift(nn.Module):
    """A plain ``(t, w) -> R^D`` function as a drift module (it has no parameters of its own)."""

    def __init__(self, fn: Callable[[Tensor, Tensor], Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, t: Tensor, w: Tensor) -> Tensor:
        return self.fn(t, w)


class NeuralSDEGuide(ParamStoreModule, AutoGuide):
    """Guide with a neural-SDE posterior for every ``OUPath`` site of a Pyro model.

    For each site the posterior drift is :math:`-\\theta w + \\mathrm{NN}(w, t; \\phi)` with the
    prior's :math:`\\theta, \\sigma` and initial state, so that training starts at q = p
    (:class:`~pyro_sdebnn.nn.sde_drift.DriftMLP` has a zero last layer). See the module docstring for how it
    reads the prior.

    :param callable model: a Pyro model, or a module with a ``model`` method (e.g.
        :class:`~pyro_sdebnn.nn.SDEBNN`).
    :param int drift_hidden: width of the default drift MLP.
    :param int drift_layers: hidden layers of the default drift MLP.
    :param int bottleneck: optional bottleneck width (parameters linear in D with a small constant).
    :param drift: user drift corrections instead of the MLP: an ``nn.Module`` or a plain function
        ``(t, w) -> R^D`` (one site), a dict ``{site: module or function}``, or a factory
        ``(site_name, D) -> nn.Module``. A callable that returns a tensor of ``w``'s shape when called
        as ``(t0, init)`` is a drift, otherwise a factory. A plain function has no parameters of its
        own (tensors it captures are not treated as drift parameters by ``"stl"``).
    :param str activation: activation of the default MLP.
    :param str name: prefix of the guide's parameter names in Pyro's param store (the drift networks',
        ``"<name>.drifts$$$<site>.layers.0.weight"``, ...). Default: ``"NeuralSDEGuide"``, as Pyro's autoguides are
        named by their class, or ``"<net name>.NeuralSDEGuide"`` for a network given a ``name=`` (e.g.
        ``SDEBNN(..., name="a")``), so that the guides of differently named networks have different names too.
        As for the networks, a guide that would take the drift parameters another live guide holds raises a
        ``ValueError`` instead of sharing them (see :class:`~pyro_sdebnn.nn.SDEBNN`, "Parameter names").

    >>> from pyro_sdebnn.nn import SDEBNN
    >>> NeuralSDEGuide(SDEBNN(1, 1, name="a"))._pyro_name, NeuralSDEGuide(SDEBNN(1, 1))._pyro_name
    ('a.NeuralSDEGuide', 'NeuralSDEGuide')

    >>> from pyro_sdebnn.distributions import OUPath
    >>> def model():
    ...     w = pyro.sample("w", OUPath(torch.zeros(2), 0.5, torch.linspace(0, 1, 5), method="euler"))
    ...     pyro.sample("y", pyro.distributions.Normal(w[-1].sum(), 1.0), obs=torch.tensor(1.0))
    >>> guide = NeuralSDEGuide(model, drift_hidden=8)
    >>> guide()["w"].shape
    torch.Size([4, 2])
    """

    def __init__(self, model, *, drift_hidden: int = 64, drift_layers: int = 2, bottleneck: int | None = None,
                 drift: nn.Module | dict | Callable | None = None, activation: str = "swish",
                 name: str | None = None) -> None:
        if isinstance(model, nn.Module) and callable(getattr(model, "model", None)):
            model = model.model
        if not callable(model):
            raise TypeError(f"NeuralSDEGuide: model must be a Pyro model (a callable) or a module with a model method, "
                            f"got {type(model).__name__}")
        for arg, value in (("drift_hidden", drift_hidden), ("drift_layers", drift_layers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"NeuralSDEGuide: {arg} must be a positive int, got {value!r}")
        if bottleneck is not None and (isinstance(bottleneck, bool) or not isinstance(bottleneck, int)
                                       or bottleneck < 1):
            raise ValueError(f"NeuralSDEGuide: bottleneck must be a positive int or None, got {bottleneck!r}")
        _activation(activation)  # ValueError naming the known activations
        if name is None:  # the class name (as Pyro's autoguides), under the name of a named network
            net = getattr(model, "__self__", None)
            prefix = net._pyro_name if isinstance(net, PyroModule) else ""
            name = f"{prefix}.{type(self).__name__}" if prefix else type(self).__name__
        name = check_name(name, "NeuralSDEGuide")
        super().__init__(model)
        self._pyro_name = name  # AutoGuide names itself by its class
        self.drift_hidden, self.drift_layers, self.bottleneck = drift_hidden, drift_layers, bottleneck
        self.activation = activation
        self._user_drift = (drift,)  # in a tuple: registered once, under ``drifts``, not also as ``_user_drift``
        self.drifts = nn.ModuleDict()
        self.path_sites: list[str] = []
        self._chained = False

    @staticmethod
    def _as_module(drift) -> nn.Module:
        return drift if isinstance(drift, nn.Module) else _FunctionDrift(drift)

    def _make_drift(self, name: str, prior: OUPath) -> nn.Module:
        user, dim = self._user_drift[0], prior.event_shape[-1]
        if user is None:
            return DriftMLP(dim, self.drift_hidden, self.drift_layers, self.bottleneck, self.activation)
        if isinstance(user, dict):
            if name not in user:
                raise ValueError(f"NeuralSDEGuide: `drift` dict has no entry for OUPath site {name!r}")
            return self._as_module(user[name])
        if not (isinstance(user, nn.Module) or callable(user)):
            raise TypeError(f"NeuralSDEGuide: `drift` must be an nn.Module, function, dict or factory, "
                            f"got {type(user)}")
        if isinstance(user, nn.Module) or self._is_drift_function(user, prior):
            if len(self.path_sites) > 1:
                raise ValueError("NeuralSDEGuide: one `drift` given but the model has several OUPath "
                                 f"sites {self.path_sites}; pass a dict or a factory")
            return self._as_module(user)
        try:
            module = user(name, dim)
        except Exception as error:
            raise TypeError("NeuralSDEGuide: `drift` is neither a drift (t, w) -> tensor of w's shape nor a factory "
                            f"(site_name, D) -> nn.Module (called as a factory it raised {error!r})") from error
        if not isinstance(module, nn.Module):
            raise TypeError(f"NeuralSDEGuide: the `drift` factory must return an nn.Module, got {type(module)}")
        return module

    @staticmethod
    def _is_drift_function(fn, prior: OUPath) -> bool:
        w = prior.init.detach()
        try:
            out = fn(prior.times[0], w)
        except Exception:
            return False
        return isinstance(out, Tensor) and out.shape == w.shape

    def _setup_prototype(self, *args, **kwargs) -> None:
        super()._setup_prototype(*args, **kwargs)
        others = []
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            if isinstance(site["fn"], OUPath):
                self.path_sites.append(name)
            else:
                others.append(name)
        if not self.path_sites:
            raise ValueError("NeuralSDEGuide: the model has no OUPath sample site")
        # other latent sites are left to the model (e.g. "obs" when traced with y=None for prediction);
        # TracePathKL_ELBO raises if a latent model site has no guide site
        self.unguided_sites = others
        for name in self.path_sites:
            fn = self.prototype_trace.nodes[name]["fn"]
            module = self._make_drift(name, fn)
            self.drifts[name] = module.to(dtype=fn.init.dtype, device=fn.init.device)
        self._check_starts(*args, **kwargs)

    def _check_starts(self, *args, **kwargs) -> None:
        """Run the model prefix three times: twice alike (a difference is randomness hidden from the guide),
        once with other placeholder paths (a difference: a path starts from an earlier path)."""
        def fixed(name, msg):  # visible upstream sites: their prototype values, the same in every run
            return self.prototype_trace.nodes[name]["value"]

        runs = [self._run_prefix(args, kwargs, fixed, offset=offset)[0] for offset in (0.0, 0.0, 1.0)]
        inits = [{name: prior.init.detach() for name, prior in run.items()} for run in runs]
        for name in self.path_sites:
            if not bool(torch.isfinite(inits[0][name]).all()):  # NaN != NaN: not the message below
                raise ValueError(f"NeuralSDEGuide: the initial state of OUPath site {name!r} holds NaN or Inf (the "
                                 "model's parameters, e.g. w0, diverged in an earlier fit?): re-initialise them")
            if not torch.equal(inits[0][name], inits[1][name]):
                raise ValueError(f"NeuralSDEGuide: the initial state of OUPath site {name!r} changes from one run of "
                                 "the model to the next: it depends on a sample site hidden from the guide (e.g. by "
                                 "poutine.block). Give NeuralSDEGuide the model with that site visible, and guide "
                                 "the site with a guide that runs before it")
        self._chained = any(not torch.equal(inits[0][n], inits[2][n]) for n in self.path_sites)

    def _run_prefix(self, args, kwargs, upstream, posterior=None, offset: float = 0.0):
        runner = _PathSites(self.path_sites, upstream, posterior, offset)
        hide = None if posterior is None else (lambda msg: not isinstance(msg["fn"], NeuralSDEPath))
        try:
            with poutine.block(hide_fn=hide), runner:
                self.model(*args, **kwargs)
        except _PathSites.Stop:
            pass
        missing = set(self.path_sites) - set(runner.found)
        if missing:
            raise ValueError(f"NeuralSDEGuide: the model did not reach OUPath sites {sorted(missing)}")
        return runner.found, runner.values

    def _posterior(self, name: str, prior: OUPath, drifts: nn.ModuleDict | None = None) -> NeuralSDEPath:
        # ``drifts`` read outside the model run: reading ``self.drifts`` registers its parameters with Pyro,
        # which must not happen inside the blocked model run (SVI would not see them)
        drifts = self.drifts if drifts is None else drifts
        if not isinstance(prior, OUPath):
            raise ValueError(f"NeuralSDEGuide: site {name!r} is no longer an OUPath (got {type(prior).__name__})")
        if prior.method != "euler":
            raise ValueError(f"NeuralSDEGuide: OUPath site {name!r} must use method='euler' (the path KL is "
                             f"that of the simulated Euler chain), got {prior.method!r}")
        return NeuralSDEPath(prior.init, prior.sigma, prior.times, prior.theta, correction=drifts[name])

    def priors(self, *args, **kwargs) -> dict[str, OUPath]:
        """The model's ``OUPath`` prior at each path site, read by running the model up to its last one.

        Values of sample sites before them are taken from the enclosing guide trace (``ValueError`` if
        absent); a prior whose ``init`` depends on an earlier path is read with a placeholder for that
        path, see :meth:`get_posterior`.
        """
        return self._run_prefix(args, kwargs, _guided_value)[0]

    def get_posterior(self, *args, **kwargs) -> dict[str, NeuralSDEPath]:
        """``{site: NeuralSDEPath}`` for the given model arguments (no sampling, no Pyro site).

        These are the marginal posteriors of the paths, so a model where an ``OUPath`` starts from an
        earlier path has none: ``ValueError`` (sample with the guide itself instead).
        """
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        sync_outside_context(self)  # the drift networks of a loaded param store, as the guide's own runs read them
        if self._chained:
            raise ValueError("NeuralSDEGuide.get_posterior: an OUPath site starts from an earlier path, so its "
                             "posterior is conditional on that path's sample; call the guide to sample the paths")
        return {name: self._posterior(name, prior) for name, prior in self.priors(*args, **kwargs).items()}

    def forward(self, *args, **kwargs) -> dict[str, Tensor]:
        """Sample every ``OUPath`` site from its posterior, in the model's order (see the module docstring)."""
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        drifts = self.drifts

        def posterior(name, prior):
            return self._posterior(name, prior, drifts)

        return self._run_prefix(args, kwargs, _guided_value, posterior=posterior)[1]
