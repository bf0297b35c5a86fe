# SPDX-License-Identifier: Apache-2.0
"""Deep ensembles: ``K`` independently initialised MAP networks and their mixture predictive.

Each member is trained on the full data from its own random initialisation and data order
(Lakshminarayanan et al. [1]); the predictive is the equal-weight mixture

.. math::

    \\hat p(y|x,\\mathcal D) = \\frac1K \\sum_{k=1}^K p(y|x, \\hat w_k),

so for heteroscedastic regression the predictive variance splits into an aleatoric and an epistemic
part, :math:`\\frac1K\\sum_k \\sigma_k^2(x) + \\operatorname{Var}_k[\\mu_k(x)]` ([1], Sec. 2.4), which
:class:`~pyro_sdebnn.infer.predictive.RegressionPrediction` exposes; for classification use
:func:`pyro_sdebnn.metrics.uncertainty_decomposition` on ``prediction.probs``.

**References**

1. B. Lakshminarayanan, A. Pritzel, C. Blundell (2017), *Simple and scalable predictive uncertainty
   estimation using deep ensembles*, NeurIPS.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from pyro_sdebnn.infer.methods import (
    BaselineMethod,
    _check_data,
    _check_finite,
    _check_fit_args,
    _dropout_layers,
    _epochs,
    negative_log_likelihood_terms,
    register_method,
    train_network,
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
    :param str likelihood: ``"categorical"`` (``C`` logits) or ``"gaussian"`` (mean, log-variance).
    :param int num_members: ``K``.

    >>> from pyro_sdebnn.nn import make_mlp
    >>> x, y = torch.randn(32, 1), torch.randn(32)
    >>> ens = DeepEnsemble(lambda: make_mlp([1, 16, 2]), "gaussian", num_members=3)
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
        x: Tensor,
        y: Tensor,
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
    ) -> "DeepEnsemble":
        """Train every member independently (Adam, mean NLL, weight decay); returns ``self``.

        :param vectorize: train all members at once with :func:`torch.func.vmap` over stacked weights
            (each member keeps its own minibatch order; Adam acts elementwise, so this is the same
            optimisation as training them one by one). ``None``: when every member is a
            ``nn.Module`` without buffers or dropout (e.g. a plain MLP), else one by one.
        :param scheduler: ``None`` or a callable ``optimizer -> torch.optim.lr_scheduler`` object, built
            for every member's Adam optimiser (see :func:`~pyro_sdebnn.infer.methods.train_network`).
            ``ReduceLROnPlateau`` needs each member's own loss, so it trains the members one by one
            (``vectorize=True`` with it raises ``ValueError``).
        :param str scheduler_step: ``"epoch"`` or ``"step"``: when the scheduler is stepped.
        :param clip_norm: clip each member's whole gradient by its :math:`L_2` norm,
            :math:`g \\leftarrow g \\min(1, c/\\|g\\|_2)`.
        :param clip_inf_norm: clip each member's whole gradient by its :math:`L_\\infty` norm,
            :math:`g \\leftarrow g \\min(1, c/\\|g\\|_\\infty)` (after ``clip_norm`` when both are given).
        """
        from pyro_sdebnn.infer._training import SchedulerStepper, check_clip

        _check_data(x, y, self.likelihood)
        size = _check_fit_args(
            x.shape[0], num_epochs=num_epochs, lr=lr, batch_size=batch_size, weight_decay=weight_decay
        )
        clip_norm, clip_inf_norm = check_clip(clip_norm, clip_inf_norm)
        SchedulerStepper(None, scheduler_step)  # validates scheduler_step
        forced = vectorize is True
        if vectorize is None:
            vectorize = self._vectorizable()
        elif vectorize and not self._vectorizable():
            raise ValueError("vectorize=True needs members with identical parameter shapes and no buffers or dropout")
        clip = {"clip_norm": clip_norm, "clip_inf_norm": clip_inf_norm}
        sched = {"scheduler": scheduler, "scheduler_step": scheduler_step}
        if vectorize and self._fit_vectorized(
            x, y, num_epochs, lr, size, weight_decay, progress, forced, **sched, **clip
        ):
            return self
        members = self.members
        if progress:
            from tqdm.auto import tqdm

            members = tqdm(members, desc="deep-ensemble", leave=False)
        for k, member in enumerate(members):
            train_network(
                member,
                x,
                y,
                self.likelihood,
                num_epochs=num_epochs,
                lr=lr,
                batch_size=batch_size,
                weight_decay=weight_decay,
                desc=f"deep-ensemble member {k}",
                **sched,
                **clip,
            )
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
        self, x, y, num_epochs: int, lr: float, batch_size: int, weight_decay: float, progress, forced: bool = True,
        scheduler=None, scheduler_step: str = "epoch", clip_norm=None, clip_inf_norm=None,
    ) -> bool:
        """All members at once (arguments already checked by :meth:`fit`); ``False`` if declined.

        One Adam over the stacked weights with one scheduler: every member takes the same number of
        steps, so a schedule gives every member the learning rate it would get alone. The exception is
        ``ReduceLROnPlateau``, which needs each member's own loss: then nothing is trained and ``False``
        is returned (or, when ``forced``, a ``ValueError`` raised).
        """
        from torch.func import functional_call, stack_module_state, vmap

        from pyro_sdebnn.infer._training import SchedulerStepper, clip_gradients_batched, make_torch_scheduler

        n, k = x.shape[0], self.num_members
        params, _ = stack_module_state(list(self.members))
        params = {name: p.detach().requires_grad_() for name, p in params.items()}
        base = self.members[0]
        optimizer = torch.optim.Adam(params.values(), lr=lr, weight_decay=weight_decay)
        stepper = SchedulerStepper(make_torch_scheduler(scheduler, optimizer), scheduler_step)
        if isinstance(stepper.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            if forced:
                raise ValueError(
                    "vectorize=True cannot use a ReduceLROnPlateau scheduler (it needs each member's loss)"
                )
            return False
        clipping = clip_norm is not None or clip_inf_norm is not None

        def member_loss(theta, xb, yb):
            return negative_log_likelihood_terms(functional_call(base, theta, (xb,)), yb, self.likelihood).mean()

        batched_loss = vmap(member_loss)
        for epoch in _epochs(num_epochs, progress, "deep-ensemble (vectorised)"):
            perms = torch.stack([torch.randperm(n, device=x.device) for _ in range(k)])  # own order per member
            total = torch.zeros((), dtype=torch.float64, device=x.device)
            for start in range(0, n, batch_size):
                idx = perms[:, start : start + batch_size]
                losses = batched_loss(params, x[idx], y[idx])
                optimizer.zero_grad(set_to_none=True)
                losses.sum().backward()  # member parameters are disjoint: each gets its own gradient
                if clipping:
                    clip_gradients_batched(params.values(), clip_norm, clip_inf_norm)
                optimizer.step()
                if stepper.scheduler is not None and scheduler_step == "step":
                    stepper.after_step(float(losses.detach().mean()))
                total = total + losses.detach().double().sum() * idx.shape[1]
            _check_finite(float(total) / (n * k), desc="deep-ensemble", epoch=epoch, lr=lr)
            stepper.after_epoch(float(total) / (n * k))
        with torch.no_grad():
            for i, member in enumerate(self.members):
                for name, p in member.named_parameters():
                    p.copy_(params[name][i])
        return True

    @torch.no_grad()
    def predict_outputs(self, x: Tensor) -> Tensor:
        """Raw member outputs, shape ``(K, N, C)`` (members in eval mode)."""
        _check_data(x, None, self.likelihood)
        outputs = []
        for member in self.members:
            was_training = member.training
            member.eval()
            outputs.append(member(x))
            member.train(was_training)
        return torch.stack(outputs)
