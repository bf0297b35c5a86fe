# SPDX-License-Identifier: Apache-2.0
"""A Bayesian twin of any ``torch.nn`` network as a Pyro model, and SVI-trained baselines on it.

:class:`PyroBNN` copies a network, turns it into a :class:`~pyro.nn.PyroModule` and replaces every
parameter by a :class:`~pyro.nn.PyroSample` with an isotropic Gaussian prior

.. math::

    w_j \\sim \\mathcal N(0, \\sigma_p^2), \\qquad
    y_n | x_n, w \\sim p(y_n | f_w(x_n)) \\quad (n \\in \\text{plate "data"}),

with the likelihood of :mod:`pyro_sdebnn.infer.methods`. Minibatches use Pyro's subsampled
``plate`` (which rescales the likelihood by :math:`N/b`); the weights are sampled outside the plate.
The network outputs are recorded in a ``pyro.deterministic("outputs", ...)`` site so
:class:`pyro.infer.Predictive` returns them for any guide or MCMC posterior.

:class:`SVIBaseline` trains an autoguide on that model with :class:`pyro.infer.SVI`; its subclasses
are :class:`~pyro_sdebnn.infer.map_estimate.MAPEstimate` (``AutoDelta``) and
:class:`~pyro_sdebnn.infer.mean_field_vi.MeanFieldVI` (``AutoNormal``).

**Fitted state, the Pyro way.** After ``fit`` (or ``load``), Pyro's global param store holds the fitted
guide parameters under the guide's own names (``"AutoNormal.locs.net.0.weight"``, ...), exactly as after
a run of :class:`pyro.infer.SVI`, so ``pyro.get_param_store().save(path)`` saves the fit and, in a new
process, a method built the same way predicts with it::

    vi = MeanFieldVI(net, "categorical")          # the same network and likelihood as for the fit
    pyro.get_param_store().load(path)
    vi.predict(x)

A method that was never fitted nor loaded takes its guide parameters from the global param store on its
first ``predict``. Each instance also keeps a reference to its own parameters, so several fits coexist in
one process: the global store shows the last one fitted or loaded, and a new ``fit`` starts from the
method's own state, never from another instance's parameters left in the store.
"""

from __future__ import annotations

import copy
import math
import numbers
from typing import Any, Callable

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import SVI
from pyro.nn import PyroModule, PyroSample
from pyro.params.param_store import StateDict
from torch import Tensor, nn

from pyro_sdebnn.nn._prior import ZeroMeanNormalPrior
from pyro_sdebnn.infer._baseline_data import (
    _follow_module,
    _check_fit_args,
    _is_loader_arg,
    _first_inputs,
    _iter_inputs,
    _TrainingData,
)
from pyro_sdebnn.infer._training import SchedulerStepper, check_clip
from pyro_sdebnn.infer.checkpoint import check_tensors, detached
from pyro_sdebnn.infer.map_training import _check_finite
from pyro_sdebnn.infer.methods import (
    BaselineMethod,
    _check_likelihood,
    _check_outputs,
)
from pyro_sdebnn.infer.svi_training import train_svi


class PyroBNN(PyroModule):
    """A Pyro model with independent :math:`\\mathcal N(0, \\sigma_p^2)` priors on every weight of ``net``.

    .. math::

        w \\sim \\mathcal N(0, \\sigma_p^2 I), \\qquad y_n | x_n, w \\sim p(y_n | f_w(x_n)),
        \\quad n \\in \\text{plate("data")}

    **References**

    1. E. Bingham et al. (2019), *Pyro: deep universal probabilistic programming*, JMLR (``PyroModule``,
       ``PyroSample``, subsampled ``plate``).

    :param nn.Module net: the network (copied; the original is left untouched). Its current
        parameter values are kept in ``init_values`` for guide initialisation.
    :param str likelihood: ``"categorical"`` or ``"normal"`` (2 outputs: mean, log-variance).
    :param float prior_scale: :math:`\\sigma_p`.

    >>> from torch import nn
    >>> model = PyroBNN(nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2)), "categorical", prior_scale=1.0)
    >>> trace = pyro.poutine.trace(model).get_trace(torch.randn(10, 2), torch.zeros(10, dtype=torch.long),
    ...                                              subsample_size=4)
    >>> trace.nodes["net.0.weight"]["value"].shape, trace.nodes["obs"]["value"].shape
    (torch.Size([8, 2]), torch.Size([4]))
    """

    def __init__(self, net: nn.Module, likelihood: str = "categorical", prior_scale: float = 1.0) -> None:
        super().__init__()
        if not isinstance(net, nn.Module):
            raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        self.likelihood = _check_likelihood(likelihood)
        net = copy.deepcopy(net)
        self.init_values = {f"net.{name}": p.detach().clone() for name, p in net.named_parameters()}
        if not self.init_values:
            raise ValueError("net has no parameters to put a prior on")
        pyro.nn.module.to_pyro_module_(net)
        self.net = net
        self._shapes = {name: (p.shape, p.dtype, p.device) for name, p in net.named_parameters()}
        self.set_prior_scale(prior_scale)

    def set_prior_scale(self, prior_scale: float) -> None:
        """Replace the priors by :math:`\\mathcal N(0, \\sigma_p^2)` with ``σ_p = prior_scale``."""
        if not isinstance(prior_scale, (int, float)) or not prior_scale > 0 or not math.isfinite(prior_scale):
            raise ValueError(f"prior_scale must be a positive finite number, got {prior_scale!r}")
        self.prior_scale = float(prior_scale)
        for name, (shape, dtype, device) in self._shapes.items():
            path, _, leaf = name.rpartition(".")
            module = self.net.get_submodule(path)
            # built at each draw on the module's device and dtype (the prior follows self.to(...))
            if "_prior_zero" not in module._buffers:
                module.register_buffer("_prior_zero", torch.zeros((), dtype=dtype, device=device), persistent=False)
            setattr(module, leaf, PyroSample(ZeroMeanNormalPrior(self.prior_scale, shape)))

    def forward(self, x: Tensor, y: Tensor | None = None, *, subsample_size: int | None = None,
                data_size: int | None = None) -> Tensor:
        """Sample the weights, run the network on a (sub)sample of ``x`` and observe ``y``.

        Two ways to train on minibatches, both scaling the likelihood by :math:`N/b` as Pyro's
        subsampled ``plate`` does:

        * ``model(x, y, subsample_size=b)`` with the full data ``x`` ``(N, ...)``: the plate draws the
          ``b`` indices of the minibatch;
        * ``model(x_batch, y_batch, data_size=N)`` with one minibatch (e.g. from a ``DataLoader``):
          ``pyro.plate("data", N, subsample=torch.arange(b))`` marks the batch as a subsample of a
          data set of size ``N``.

        :param Tensor x: inputs ``(N, ...)`` (the full data; the plate picks the minibatch), or one
            minibatch ``(b, ...)`` when ``data_size`` is given.
        :param y: labels ``(N,)`` (or ``(b,)``) or ``None`` to sample them.
        :param subsample_size: minibatch size ``b`` (``None``: all ``N``).
        :param data_size: the size :math:`N` of the data set ``x`` is a minibatch of (``None``: ``x`` is
            the whole data set).
        :returns: the network outputs of the minibatch.
        """
        if data_size is not None:
            if subsample_size is not None:
                raise ValueError("give either subsample_size (x is the full data) or data_size (x is a minibatch)")
            if isinstance(data_size, bool) or not isinstance(data_size, int) or data_size < x.shape[0]:
                raise ValueError(f"data_size must be an integer >= the batch size {x.shape[0]}, got {data_size!r}")
            plate = pyro.plate("data", data_size, subsample=torch.arange(x.shape[0], device=x.device))
            full, idx = True, None  # x is the minibatch itself
        else:
            plate = pyro.plate("data", x.shape[0], subsample_size=subsample_size, device=str(x.device))
            # The plate's indices may also be set from outside (e.g. by an SG-MCMC kernel's minibatching).
            full = plate.subsample_size == x.shape[0]
            idx = plate.indices
        x_batch = x if full else x[idx]
        outputs = self.net(x_batch)  # weights sampled here, outside the data plate
        _check_outputs(outputs, self.likelihood)  # a shape check (no device sync), before Pyro's own errors
        pyro.deterministic("outputs", outputs)
        y_batch = None if y is None else (y if full else y[idx])
        with plate:
            if self.likelihood == "categorical":
                pyro.sample("obs", dist.Categorical(logits=outputs), obs=y_batch)
            else:
                mean, log_var = outputs.unbind(-1)
                pyro.sample("obs", dist.Normal(mean, torch.exp(0.5 * log_var)), obs=y_batch)
        return outputs


class SVIBaseline(BaselineMethod):
    """An autoguide on a :class:`PyroBNN`, trained by SVI with subsampled minibatches.

    Subclasses set :meth:`_make_guide` and :meth:`_make_elbo`; the model is ``model``, the guide
    ``guide``, so both also work with plain Pyro tools (``Predictive``, ``poutine``).

    >>> from pyro_sdebnn.infer import MAPEstimate
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(1, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> method = MAPEstimate(net, "normal").fit(torch.randn(8, 1), torch.randn(8), num_epochs=1)
    >>> type(method).__mro__[1].__name__, type(method.guide).__name__, len(method.losses)
    ('SVIBaseline', 'AutoDelta', 1)
    """

    def __init__(self, net: nn.Module, likelihood: str = "categorical", *, prior_scale: float = 1.0) -> None:
        super().__init__(likelihood)
        self.model = PyroBNN(net, likelihood, prior_scale)
        self.guide = self._make_guide()
        self._store_state: StateDict | None = None
        self._input_shape: list[int] | None = None  # shape of one input, to rebuild the guide on load

    def _make_guide(self):  # pragma: no cover - interface
        raise NotImplementedError

    def _make_elbo(self, num_particles: int):  # pragma: no cover - interface
        raise NotImplementedError

    def fit(
        self,
        x,
        y: Tensor | None = None,
        *,
        num_epochs: int = 200,
        lr: float = 1e-2,
        batch_size: int | None = 32,
        weight_decay: float | None = None,
        num_particles: int = 1,
        progress: bool = False,
        optim: pyro.optim.PyroOptim | None = None,
        scheduler_step: str = "epoch",
        clip_norm: float | None = None,
        clip_inf_norm: float | None = None,
        resume: bool = False,
        callback: Callable[[int, float], None] | None = None,
    ) -> "SVIBaseline":
        """Run SVI for ``num_epochs`` passes over the data in minibatches of ``batch_size``.

        The epochs are run by :func:`~pyro_sdebnn.infer.train_svi` on ``SVI(self.model, self.guide, optim, elbo)``
        (:doc:`/methods/baselines` explains how).

        :param x: inputs ``(N, ...)`` with targets ``y`` (``ceil(N / batch_size)`` steps per epoch on minibatches
            drawn by the model's subsampled plate), or a loader of ``(x, y)`` batches (``y`` omitted, ``batch_size``
            unused): one step per batch, the likelihood of a batch of size :math:`b` scaled by :math:`N/b` with
            :math:`N` = ``len(loader.dataset)``.
        :param weight_decay: if given, the prior becomes the one weight decay :math:`\\lambda` corresponds to,
            :math:`\\sigma_p^2 = 1/(N\\lambda)`.
        :param optim: a Pyro optimiser or :class:`pyro.optim.PyroLRScheduler`; default ``pyro.optim.Adam({"lr": lr})``.
        :param str scheduler_step: ``"epoch"`` or ``"step"``: when a scheduler is stepped.
        :param clip_norm: clip the whole gradient (all guide parameters together) by its :math:`L_2` norm,
            :math:`g \\leftarrow g \\min(1, c/\\|g\\|_2)`.
        :param clip_inf_norm: clip the whole gradient by its :math:`L_\\infty` norm (after ``clip_norm``).
        :param bool resume: continue the last (or a loaded) run with its optimiser and random states, so
            ``fit(num_epochs=k)`` then ``fit(num_epochs=K - k, resume=True)`` equals ``fit(num_epochs=K)``;
            without it, a new ``fit`` continues from the current guide parameters with a fresh optimiser.
        :param callback: ``callback(epoch, loss)`` after every epoch (the epoch counted over every fit,
            :attr:`epoch`; the ELBO loss per data point).
        :returns: ``self``; the ELBO loss per epoch and data point is in ``self.losses``.
        :raises FloatingPointError: if a step's loss is NaN or infinite (the parameters keep their last finite
            values; the losses of the finished epochs are kept).
        :raises ValueError: if data-parallel and the ranks' loaders take different numbers of steps.

        Under ``torchrun``, a loader sharded by a ``DistributedSampler`` makes the fit data-parallel: the gradients
        are averaged across the ranks before every update and every rank holds the same parameters
        (:doc:`/distributed`).
        """
        loader = x if _is_loader_arg(x) else None
        data = _TrainingData(x, y, self.likelihood, batch_size)
        n = data.n
        if isinstance(weight_decay, numbers.Real) and not weight_decay > 0:  # other types: _check_fit_args
            raise ValueError(f"weight_decay must be positive or None, got {weight_decay!r}")
        batch_size = _check_fit_args(n, num_epochs=num_epochs, lr=lr, batch_size=batch_size, weight_decay=weight_decay)
        batch_size = None if batch_size >= n else batch_size  # None: the full data in every step
        if isinstance(num_particles, bool) or not isinstance(num_particles, int) or num_particles < 1:
            raise ValueError(f"num_particles must be a positive integer, got {num_particles!r}")
        if optim is not None and not isinstance(optim, pyro.optim.PyroOptim):
            raise TypeError(f"optim must be a pyro.optim.PyroOptim (or PyroLRScheduler) or None, got {optim!r}")
        clip_norm, clip_inf_norm = check_clip(clip_norm, clip_inf_norm)
        optim = pyro.optim.Adam({"lr": lr}) if optim is None else optim  # type: ignore[attr-defined]  # made at import
        SchedulerStepper(optim, scheduler_step)  # validates scheduler_step before any work
        elbo = self._make_elbo(num_particles)
        state = self._resume_state(resume, loader)
        if state is not None:
            optim.set_state(detached(state["optim"]))
        if weight_decay is not None:  # only once every argument is valid
            self.model.set_prior_scale(1.0 / math.sqrt(n * weight_decay))
        device = next(iter(self.model.init_values.values())).device
        dtype = next(iter(self.model.init_values.values())).dtype
        x, y = _follow_module(x, y, device=device, dtype=dtype)  # tensors: on the weights' device and dtype
        store = pyro.get_param_store()
        with store.scope(self._store_state) as scope:
            if self.guide.prototype_trace is None or self._input_shape is None:
                xb, yb = data.first_batch(device, dtype)  # for a loader: without any random draw
                self._input_shape = list(xb.shape[1:])
                if self.guide.prototype_trace is None:  # set up the guide's parameters (also for num_epochs=0)
                    if loader is None:
                        self.guide(x, y, subsample_size=batch_size)
                    else:
                        self.guide(xb, yb, data_size=n)
            self._data_parallel_sampler(loader)  # data-parallel or not: remembered for save (train_svi averages)
            first = self.epoch  # the epochs are counted over every fit (the sampler's set_epoch)

            def record(epoch: int, loss: float) -> None:  # after every epoch, so an error keeps the losses so far
                _check_finite(loss, desc=type(self).__name__, epoch=epoch - first, lr=lr, what="ELBO loss")
                self.losses.append(loss)
                if callback is not None:
                    callback(epoch, loss)

            if num_epochs > 0:  # tensors: the whole data in every step, the model's plate draws the minibatch;
                # a loader: one step per batch, the likelihood scaled by N / b
                tensors = loader is None
                train_svi(SVI(self.model, self.guide, optim, elbo), (x, y) if tensors else x,
                          num_epochs=first + num_epochs, first_epoch=first,
                          subsample_size=(n if batch_size is None else batch_size) if tensors else None,
                          model_kwargs=None if tensors else {"data_size": n}, loss_per_datum=True,
                          device=device, dtype=dtype, scheduler_step=scheduler_step, clip_norm=clip_norm,
                          clip_inf_norm=clip_inf_norm, progress=progress, callback=record,
                          modules=[self.model, self.guide])
            optim_state = detached(optim.get_state())
        self._store_state = scope
        self._publish()
        self._end_fit(loader, optim=optim_state)
        return self

    def _publish(self) -> None:
        """Put this method's guide parameters (the tensors themselves) into Pyro's global param store."""
        if self._store_state is not None:
            pyro.get_param_store().set_state({"params": dict(self._store_state["params"]),
                                              "constraints": dict(self._store_state["constraints"])})

    def _guide_names(self, shape) -> tuple[Any, StateDict]:
        """A fresh guide set up (in a scratch param-store scope) for inputs of ``shape``; and that scope."""
        guide = self._make_guide()
        ref = next(iter(self.model.init_values.values()))
        x = torch.zeros(1, *shape, dtype=ref.dtype, device=ref.device)
        y = torch.zeros(1, dtype=torch.long if self.likelihood == "categorical" else ref.dtype, device=ref.device)
        # setting up an autoguide runs the model, which draws random numbers: not from the caller's stream
        devices = [ref.device] if ref.device.type == "cuda" else []
        with pyro.get_param_store().scope() as scope, torch.random.fork_rng(devices=devices):
            try:
                guide(x, y, data_size=1)
            except (RuntimeError, ValueError) as err:
                raise ValueError(f"inputs of shape {list(shape)} do not fit this network: {err}") from None
        return guide, scope

    def _from_param_store(self, shape) -> None:
        """Take the guide parameters from Pyro's global param store (e.g. after ``pyro.get_param_store().load``).

        :raises RuntimeError: if the store does not hold every parameter of this method's guide.
        """
        guide, scope = self._guide_names(shape)
        state = pyro.get_param_store().get_state()
        missing = [name for name in scope["params"] if name not in state["params"]]
        if missing:
            raise RuntimeError(
                "call fit(...) or load(path) before predicting, or load a fit of this model into Pyro's param "
                f"store (pyro.get_param_store().load(path)); the param store lacks {missing[:3]}"
            )
        for name, fresh in scope["params"].items():
            if state["params"][name].shape != fresh.shape:
                raise ValueError(f"the param store's {name!r} has shape {tuple(state['params'][name].shape)}, this "
                                 f"guide's {tuple(fresh.shape)}: the store holds the fit of another network")
        self.guide = guide
        self._input_shape = list(shape)
        self._store_state = {"params": {name: state["params"][name] for name in scope["params"]},
                             "constraints": {name: state["constraints"][name] for name in scope["params"]}}

    def _weight_draws(self, num_samples: int) -> list[dict[str, Tensor]]:
        """``num_samples`` weight draws from the guide (inside this method's parameter-store scope)."""
        return [{k: v.detach() for k, v in self.guide().items()} for _ in range(num_samples)]

    @torch.no_grad()
    def predict_outputs(self, x, num_samples: int = 100) -> Tensor:
        """Network outputs under ``num_samples`` guide draws, shape ``(S, N, C)``.

        The ``S`` weight draws are made once and applied to every input, so a loader ``x`` (its
        batches' inputs, moved to the model's device one at a time) gives the same outputs as the
        concatenated tensors.
        """
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        ref = next(iter(self.model.init_values.values()))
        if self._store_state is None:  # neither fitted nor loaded: the fit in Pyro's param store, if any
            self._from_param_store(_first_inputs(x, ref.device, ref.dtype, self.likelihood).shape[1:])
        with pyro.get_param_store().scope(self._store_state):
            draws = self._weight_draws(num_samples)
            chunks = []
            for xb in _iter_inputs(x, ref.device, ref.dtype, self.likelihood):
                outs = []
                for draw in draws:
                    with poutine.condition(data=draw):
                        outs.append(self.model.net(xb))
                chunks.append(torch.stack(outs))
        return torch.cat(chunks, 1)

    # ------------------------------------------------------------------ checkpoints
    def _fitted_state(self) -> dict:
        if self._store_state is None or self._input_shape is None:
            raise RuntimeError("call fit(...) before state_dict() or save(path)")
        params = self._store_state["params"]
        constraints = self._store_state["constraints"]
        return {
            "prior_scale": self.model.prior_scale,
            "input_shape": list(self._input_shape),
            "params": {name: value.detach().clone() for name, value in params.items()},
            "constraints": {name: repr(constraints[name]) for name in params},
        }

    def _prepare_load(self, state: dict):
        shape, prior_scale = state.get("input_shape"), state.get("prior_scale")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d > 0 for d in shape):
            raise ValueError(f"the checkpoint's input_shape must be a list of positive integers, got {shape!r}")
        if not isinstance(prior_scale, float) or not prior_scale > 0:
            raise ValueError(f"the checkpoint's prior_scale must be a positive float, got {prior_scale!r}")
        saved, saved_constraints = state.get("params"), state.get("constraints")
        # A fresh guide in a scratch scope: its parameter names, shapes and constraints.
        try:
            guide, scope = self._guide_names(shape)
        except ValueError as err:
            raise ValueError(f"the checkpoint's input shape: {err}") from None
        fresh = scope["params"]
        check_tensors(saved, fresh, "guide parameters")
        expected = {name: repr(scope["constraints"][name]) for name in fresh}
        if saved_constraints != expected:
            raise ValueError(
                f"the checkpoint's guide constraints {saved_constraints} differ from this guide's {expected}"
            )

        def apply():
            self.guide = guide
            self.model.set_prior_scale(prior_scale)
            self._input_shape = list(shape)
            params = {name: saved[name].detach().clone().to(fresh[name]).requires_grad_() for name in fresh}
            self._store_state = {"params": params, "constraints": dict(scope["constraints"])}
            self._publish()

        return apply
