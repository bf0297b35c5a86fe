# SPDX-License-Identifier: Apache-2.0
"""Online marginal-likelihood training of the Laplace prior precision (Immer et al. [1], Algorithm 1).

The Laplace evidence of a network with MAP weights :math:`\\hat w`, data curvature eigenvalues
:math:`\\lambda_p` and prior precision :math:`\\delta` (up to constants),

.. math::

    \\log p(\\mathcal D | \\delta) \\approx \\log p(\\mathcal D|\\hat w) - \\tfrac\\delta2 \\|\\hat w\\|^2
    + \\tfrac P2 \\log\\delta - \\tfrac12 \\sum_p \\log(\\lambda_p + \\delta),

is maximised over :math:`\\log\\delta` by a few Adam steps every few epochs of the MAP training, whose loss
uses the current :math:`\\delta` as its weight decay, so that the weights end at the mode of the posterior whose
prior the evidence chose. :class:`~pyro_sdebnn.infer.Laplace` calls :func:`train_online` from ``fit``.

**References**

1. A. Immer, M. Bauer, V. Fortuin, G. Rätsch, M. E. Khan (2021), *Scalable marginal likelihood estimation for
   model selection in deep learning*, ICML.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

if TYPE_CHECKING:  # the class of `la`: it imports this module
    from pyro_sdebnn.infer.laplace import Laplace

from pyro_sdebnn.infer._baseline_data import _check_fit_args, _is_loader_arg
from pyro_sdebnn.infer.map_training import _train_network


def check_tuning(tune, burnin, frequency, steps, lr) -> str | None:
    """``"posthoc"``, ``"online"`` or ``None`` from ``fit``'s ``tune_prior_precision``; checks the schedule."""
    if tune is True or tune == "posthoc":
        return "posthoc"
    if tune is False:
        return None
    if tune != "online":
        raise ValueError(f"tune_prior_precision must be True, False, 'posthoc' or 'online', got {tune!r}")
    for name, value, least in (("marglik_burnin", burnin, 0), ("marglik_frequency", frequency, 1),
                               ("marglik_steps", steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"marglik_lr must be positive, got {lr!r}")
    return "online"


def log_evidence(log_likelihood: Tensor, sq_norm: Tensor, evals: Tensor, delta: Tensor) -> Tensor:
    """The Laplace evidence at every prior precision in ``delta`` (differentiable in ``delta``)."""
    delta = delta.to(evals)
    log_det = torch.log(evals.unsqueeze(-1) + delta.reshape(-1)).sum(0)
    value = log_likelihood - 0.5 * delta * sq_norm + 0.5 * evals.shape[0] * torch.log(delta) - 0.5 * log_det
    return value.reshape(delta.shape)


def train_online(la, x, y, n: int, *, num_epochs: int, weight_decay: float, burnin: int, frequency: int,
                 steps: int, hyper_lr: float, resume_state: dict | None = None, **training) -> None:
    """The MAP training of :meth:`Laplace.fit <pyro_sdebnn.infer.Laplace.fit>` with
    ``tune_prior_precision="online"`` (Immer et al. [1], Algorithm 1): ``la.net`` is trained in segments between
    the evidence updates (at the epochs :math:`e \\ge` ``burnin``, :math:`e` a multiple of ``frequency``, counted
    over every ``fit``), one Adam optimiser going on across them with the weight decay :math:`\\delta / N`; sets
    ``la.prior_precision``, ``la.online_prior_precisions`` and the training state of a later ``resume``
    (``resume_state``: that state, whose run continues exactly)."""
    loader = x if _is_loader_arg(x) else None
    _check_fit_args(n, num_epochs=num_epochs, lr=training["lr"], batch_size=training["batch_size"],
                    weight_decay=weight_decay)
    la._note_data_parallel(loader)
    if resume_state is not None:
        online = resume_state.get("online")
        if not isinstance(online, dict):
            raise ValueError("resume=True with tune_prior_precision='online' continues a run fitted online; "
                             "the last fit was not")
        delta, state = float(online["delta"]), resume_state["trainer"]
    else:
        delta = la.prior_precision if la.prior_precision is not None else max(n * weight_decay, 1e-8)
        state = None
    log_delta = torch.tensor(math.log(delta), dtype=torch.float64, requires_grad=True)
    hyper = torch.optim.Adam([log_delta], lr=hyper_lr)
    if resume_state is not None:
        hyper.load_state_dict(resume_state["online"]["hyper"])
    linear = all(isinstance(m, nn.Linear) and m.bias is not None for _, m in la._all_layers())
    structure = "kron" if linear and la.hessian_structure != "diag" else "diag"
    first = done = la.epoch
    total = first + num_epochs
    updates = [e for e in range(max(burnin, 1, first), total) if e % frequency == 0]
    if resume_state is None or not hasattr(la, "online_prior_precisions"):
        la.online_prior_precisions = []
    for end in updates + [total]:
        if end > done:
            if state is not None:  # the optimiser goes on with the new delta as its weight decay
                for group in state["optimizer"]["param_groups"]:
                    group["weight_decay"] = delta / n
            history, state = _train_network(
                la.net, x, y, la.likelihood, desc="laplace MAP (online marginal likelihood)",
                num_epochs=end - done, weight_decay=delta / n, state=state, first_epoch=la.epoch, **training)
            la.losses.extend(history)
            done = end
        if end == total:
            break
        evidence = cast("Laplace", type(la)(la.net, la.likelihood, hessian_structure=structure, prior_precision=delta))
        evidence.fit(x, y, num_epochs=0, batch_size=training["batch_size"], tune_prior_precision=False)
        terms = evidence._evidence_terms()
        for _ in range(steps):
            hyper.zero_grad()
            (-log_evidence(*terms, log_delta.exp())).backward()
            hyper.step()
        delta = float(log_delta.detach().exp())
        la.online_prior_precisions.append((end, delta))
        if not math.isfinite(delta) or delta <= 0:
            raise FloatingPointError(f"the online prior precision became {delta} after epoch {end}; "
                                     f"try a smaller marglik_lr (now {hyper_lr})")
    if state is not None:
        for group in state["optimizer"]["param_groups"]:
            group["weight_decay"] = delta / n
    la.prior_precision = delta
    la._end_fit(loader, trainer=state, online={"delta": delta, "hyper": hyper.state_dict()})
