# SPDX-License-Identifier: Apache-2.0
"""Deep ensembles: ``K`` independently initialised MAP networks and their mixture predictive.

Each member is trained on the full data from its own random initialisation and data order
(Lakshminarayanan et al. [1]); the predictive is the equal-weight mixture

.. math::

    \\hat p(y|x,\\mathcal D) = \\frac1K \\sum_{k=1}^K p(y|x, \\hat w_k),

so for heteroscedastic regression the predictive variance splits into an aleatoric and an epistemic
part, :math:`\\frac1K\\sum_k \\sigma_k^2(x) + \\operatorname{Var}_k[\\mu_k(x)]` ([1], Sec. 2.4), which
:class:`~pyro_sdebnn.predictive.RegressionPrediction` exposes; for classification use
:func:`pyro_sdebnn.metrics.uncertainty_decomposition` on ``prediction.probs``.

**References**

1. B. Lakshminarayanan, A. Pritzel, C. Blundell (2017), *Simple and scalable predictive uncertainty
   estimation using deep ensembles*, NeurIPS.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from pyro_sdebnn.infer._baseline_data import (
    _follow_module,
    _is_loader_arg,
    _is_sharded,
    _iter_inputs,
    _module_device_dtype,
    _network_training_data,
    _TrainingData,
)
from pyro_sdebnn.infer._training import SchedulerStepper, clip_gradients_batched, make_torch_scheduler
from pyro_sdebnn.infer.checkpoint import check_tensors, detached
from pyro_sdebnn.infer.map_training import _check_finite, _epochs, _NetworkTrainer, load_optimizer_state
from pyro_sdebnn.infer.methods import (
    BaselineMethod,
    _dropout_layers,
    negative_log_likelihood_terms,
    register_method,
)

__all__ = ["DeepEnsemble"]


@register_method("deep-ensemble")
class DeepEnsemble(BaselineMethod):
    """An ensemble of ``num_members`` networks built by calling ``net_factory`` once per member.

    .. math::

        \\hat p(y|x) = \\frac1K \\sum_{k=1}^K p(y | f_{\\hat w_k}(x)), \\qquad
        \\hat w_k = \\arg\\min_w \\textstyle\\sum_n -\\log p(y_n|f_w(x_n)) + \\tfrac{N\\lambda}2 \\|w\\|^2
        \\text{ from init } k

    **References**

    1. B. Lakshminarayanan, A. Pritzel, C. Blundell (2017), *Simple and scalable predictive uncertainty
       estimation using deep ensembles*, NeurIPS.

    :param net_factory: zero-argument callable returning a fresh, randomly initialised ``nn.Module``.
    :param str likelihood: ``"categorical"`` (``C`` logits) or ``"normal"`` (mean, log-variance).
    :param int num_members: ``K``.

    >>> from torch import nn
    >>> x, y = torch.randn(32, 1), torch.randn(32)
    >>> def net():
    ...     return nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 2))
    >>> ens = DeepEnsemble(net, "normal", num_members=3)
    >>> pred = ens.fit(x, y, num_epochs=2).predict(x[:4])
    >>> pred.loc.shape, pred.epistemic_variance.shape
    (torch.Size([3, 4]), torch.Size([4]))
    """

    def __init__(
        self, net_factory: Callable[[], nn.Module], likelihood: str = "categorical", *, num_members: int = 5
    ) -> None:
        super().__init__(likelihood)
        if not callable(net_factory) or isinstance(net_factory, nn.Module):
            raise TypeError("net_factory must be a zero-argument callable returning a fresh nn.Module (not a module)")
        if not isinstance(num_members, int) or num_members < 1:
            raise ValueError(f"num_members must be a positive integer, got {num_members!r}")
        members = [net_factory() for _ in range(num_members)]
        for member in members:
            if not isinstance(member, nn.Module):
                raise TypeError(f"net_factory must return an nn.Module, got {type(member).__name__}")
        if num_members > 1 and members[0] is members[1]:
            raise ValueError("net_factory returned the same module twice; it must build a new network per call")
        self.members = nn.ModuleList(members)

    @property
    def num_members(self) -> int:
        return len(self.members)

    def fit(
        self,
        x,
        y: Tensor | None = None,
        *,
        num_epochs: int = 200,
        lr: float = 1e-2,
        batch_size: int | None = 32,
        weight_decay: float = 1e-4,
        vectorize: bool | None = None,
        progress: bool = False,
        scheduler: Callable | None = None,
        scheduler_step: str = "epoch",
        clip_norm: float | None = None,
        clip_inf_norm: float | None = None,
        resume: bool = False,
    ) -> "DeepEnsemble":
        """Train every member independently (Adam, mean NLL, weight decay); returns ``self``.

        :param x: inputs ``(N, ...)`` with targets ``y``, or a loader of ``(x, y)`` batches (``y``
            omitted, ``batch_size`` unused; an epoch is one pass over the loader, batches moved to the
            members' device one at a time). With tensors every member draws its own minibatch order;
            with a loader the vectorised members share the loader's order (one pass per epoch) and
            one-by-one members each make their own pass.
        :param vectorize: train all members at once with :func:`torch.func.vmap` over stacked weights
            (Adam acts elementwise, so this is the same optimisation as training them one by one).
            ``None``: when every member is a ``nn.Module`` without buffers or dropout (e.g. a plain
            MLP), else one by one (epoch by epoch, each member with its own optimiser).
        :param scheduler: ``None`` or a callable ``optimizer -> torch.optim.lr_scheduler`` object, built
            for every member's Adam optimiser (see :func:`~pyro_sdebnn.infer.map_training.train_network`).
            ``ReduceLROnPlateau`` needs each member's own loss, so it trains the members one by one
            (``vectorize=True`` with it raises ``ValueError``).
        :param str scheduler_step: ``"epoch"`` or ``"step"``: when the scheduler is stepped.
        :param clip_norm: clip each member's whole gradient by its :math:`L_2` norm,
            :math:`g \\leftarrow g \\min(1, c/\\|g\\|_2)`.
        :param clip_inf_norm: clip each member's whole gradient by its :math:`L_\\infty` norm,
            :math:`g \\leftarrow g \\min(1, c/\\|g\\|_\\infty)` (after ``clip_norm`` when both are given).
        :param bool resume: continue the last (or a loaded) run with its optimiser, scheduler and random
            states, in the same mode (vectorised or not), so that ``fit(num_epochs=k)`` then
            ``fit(num_epochs=K - k, resume=True)`` equals ``fit(num_epochs=K)``. ``losses`` holds
            the members' mean loss of every epoch.
        :raises ValueError: for a loader sharded by a ``DistributedSampler`` over several ranks: the members, not
            the data, are split over the ranks (:func:`pyro_sdebnn.distributed.local_members`).
        """
        loader = x if _is_loader_arg(x) else None
        if _is_sharded(loader):
            raise ValueError(
                "x: a deep ensemble is distributed by members, not by data: give every rank its share of the members "
                "(num_members=pyro_sdebnn.distributed.local_members(K)) and the whole data (tensors or a loader "
                "without a DistributedSampler), then gather them with pyro_sdebnn.distributed.gather_prediction"
            )
        x, y = _follow_module(x, y, self.members[0])  # tensors: on the members' device and dtype
        data, size, (clip_norm, clip_inf_norm) = _network_training_data(
            x, y, self.likelihood, num_epochs=num_epochs, lr=lr, batch_size=batch_size, weight_decay=weight_decay,
            scheduler_step=scheduler_step, clip_norm=clip_norm, clip_inf_norm=clip_inf_norm,
        )
        if vectorize is not None and not isinstance(vectorize, bool):
            raise TypeError(f"vectorize must be True, False or None, got {vectorize!r}")
        if resume is True and self._train_state is not None:
            saved_vectorized = self._train_state.get("mode") == "vectorized"
            if vectorize is not None and vectorize != saved_vectorized:
                raise ValueError(
                    f"resume=True continues a run with vectorize={saved_vectorized}, got vectorize={vectorize}"
                )
            vectorize = saved_vectorized
        forced = vectorize is True
        if vectorize is None:
            vectorize = self._vectorizable()
        elif vectorize and not self._vectorizable():
            raise ValueError("vectorize=True needs members with identical parameter shapes and no buffers or dropout")
        state = self._resume_state(resume, loader)
        if vectorize:
            done = self._fit_vectorized(data, num_epochs, lr, size, weight_decay, progress, forced, scheduler=scheduler,
                                        scheduler_step=scheduler_step, clip_norm=clip_norm, clip_inf_norm=clip_inf_norm,
                                        state=state)
            if done is not None:
                self._end_fit(loader, mode="vectorized", trainer=done)
                return self
        trainers = [
            _NetworkTrainer(
                member, self.likelihood, lr=lr, weight_decay=weight_decay, desc=f"deep-ensemble member {k}",
                state=None if state is None else state["trainers"][k], scheduler=scheduler,
                scheduler_step=scheduler_step, clip_norm=clip_norm, clip_inf_norm=clip_inf_norm,
            )
            for k, member in enumerate(self.members)
        ]
        for epoch in _epochs(num_epochs, progress, "deep-ensemble"):
            losses = [trainer.run_epoch(data, epoch) for trainer in trainers]
            self.losses.append(sum(losses) / len(losses))
        self._end_fit(loader, mode="sequential", trainers=[trainer.state_dict() for trainer in trainers])
        return self

    def _vectorizable(self) -> bool:
        first = self.members[0]
        shapes = [(n, p.shape, p.dtype) for n, p in first.named_parameters()]
        for member in self.members:
            if [(n, p.shape, p.dtype) for n, p in member.named_parameters()] != shapes:
                return False
            if any(True for _ in member.buffers()):
                return False
            if _dropout_layers(member):
                return False
        return True

    def _fit_vectorized(
        self, data: _TrainingData, num_epochs: int, lr: float, batch_size: int, weight_decay: float, progress,
        forced: bool = True, scheduler=None, scheduler_step: str = "epoch", clip_norm=None, clip_inf_norm=None,
        state: dict | None = None,
    ) -> dict | None:
        """All members at once (arguments already checked by :meth:`fit`); the optimiser state, or
        ``None`` if declined.

        One Adam over the stacked weights with one scheduler: every member takes the same number of
        steps, so a schedule gives every member the learning rate it would get alone. The exception is
        ``ReduceLROnPlateau``, which needs each member's own loss: then nothing is trained and ``None``
        is returned (or, when ``forced``, a ``ValueError`` raised).
        """
        from torch.func import functional_call, stack_module_state, vmap

        n, k = data.n, self.num_members
        params, _ = stack_module_state(list(self.members))
        params = {name: p.detach().requires_grad_() for name, p in params.items()}
        base = self.members[0]
        device, dtype = _module_device_dtype(base)
        optimizer = torch.optim.Adam(params.values(), lr=lr, weight_decay=weight_decay)
        stepper = SchedulerStepper(make_torch_scheduler(scheduler, optimizer), scheduler_step)
        if isinstance(stepper.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            if forced:
                raise ValueError(
                    "vectorize=True cannot use a ReduceLROnPlateau scheduler (it needs each member's loss)"
                )
            return None
        if state is not None:
            load_optimizer_state(optimizer, stepper.scheduler, state["trainer"])
        clipping = clip_norm is not None or clip_inf_norm is not None

        def member_loss(theta, xb, yb):
            return negative_log_likelihood_terms(functional_call(base, theta, (xb,)), yb, self.likelihood).mean()

        # Tensors: every member its own minibatch (k, b, ...); a loader: one batch (b, ...) for all.
        batched_loss = vmap(member_loss) if not data.is_loader else vmap(member_loss, in_dims=(0, None, None))

        def batches():
            if data.is_loader:
                yield from data.batches(device, dtype)
                return
            x, y = data.x, data.y
            perms = torch.stack([torch.randperm(n, device=x.device) for _ in range(k)])  # own order per member
            for start in range(0, n, batch_size):
                idx = perms[:, start : start + batch_size]
                yield x[idx], y[idx]

        for epoch in _epochs(num_epochs, progress, "deep-ensemble (vectorised)"):
            total = torch.zeros((), dtype=torch.float64, device=device)
            steps = 0
            for xb, yb in batches():
                steps += 1
                size = yb.shape[-1]
                losses = batched_loss(params, xb, yb)
                optimizer.zero_grad(set_to_none=True)
                losses.sum().backward()  # member parameters are disjoint: each gets its own gradient
                if clipping:
                    clip_gradients_batched(params.values(), clip_norm, clip_inf_norm)
                optimizer.step()
                if stepper.scheduler is not None and scheduler_step == "step":
                    stepper.after_step(float(losses.detach().mean()))
                total = total + losses.detach().double().sum() * size
            if steps == 0:  # an epoch without a step would record a loss of 0 for members never trained
                raise ValueError("x: the loader yielded no batch in an epoch (fewer points than one batch with "
                                 "drop_last=True?)")
            _check_finite(float(total) / (n * k), desc="deep-ensemble", epoch=epoch, lr=lr)
            self.losses.append(float(total) / (n * k))
            stepper.after_epoch(float(total) / (n * k))
        with torch.no_grad():
            for i, member in enumerate(self.members):
                for name, p in member.named_parameters():
                    p.copy_(params[name][i])
        return {
            "optimizer": detached(optimizer.state_dict()),
            "scheduler": None if stepper.scheduler is None else detached(stepper.scheduler.state_dict()),
        }

    @torch.no_grad()
    def predict_outputs(self, x) -> Tensor:
        """Raw member outputs, shape ``(K, N, C)`` (members in eval mode); ``x`` may be a loader."""
        device, dtype = _module_device_dtype(self.members[0])
        modes = [member.training for member in self.members]
        for member in self.members:
            member.eval()
        try:
            chunks = [torch.stack([member(xb) for member in self.members])
                      for xb in _iter_inputs(x, device, dtype, self.likelihood)]
        finally:
            for member, mode in zip(self.members, modes):
                member.train(mode)
        return torch.cat(chunks, 1)

    def _fitted_state(self) -> dict:
        return {"members": [detached(member.state_dict()) for member in self.members]}

    def _prepare_load(self, state: dict):
        saved = state.get("members")
        if not isinstance(saved, list) or len(saved) != self.num_members:
            count = len(saved) if isinstance(saved, list) else type(saved).__name__
            raise ValueError(f"the checkpoint has {count} ensemble members, this ensemble {self.num_members}")
        for k, (member_state, member) in enumerate(zip(saved, self.members)):
            check_tensors(member_state, member.state_dict(), f"member {k} weights")

        def apply():
            for member_state, member in zip(saved, self.members):
                member.load_state_dict(member_state)

        return apply
