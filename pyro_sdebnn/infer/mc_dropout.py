# SPDX-License-Identifier: Apache-2.0
"""MC-dropout: dropout kept on at prediction time, ``T`` stochastic forward passes (Gal & Ghahramani [1]).

Training with dropout and weight decay :math:`\\lambda` maximises the ELBO of a Bernoulli variational
family (Gal & Ghahramani [1]); its predictive is the average over ``T`` fresh dropout masks

.. math::

    \\hat p(y|x,\\mathcal D) \\approx \\frac1T \\sum_{t=1}^T p(y | x, \\hat M \\operatorname{diag}(b_t)),
    \\qquad b_{t} \\sim \\mathrm{Bernoulli}(\\rho).

**References**

1. Y. Gal, Z. Ghahramani (2016), *Dropout as a Bayesian approximation: representing model
   uncertainty in deep learning*, ICML.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pyro_sdebnn.infer._baseline_data import (
    _first_inputs,
    _iter_inputs,
    _module_device_dtype,
)
from pyro_sdebnn.infer.checkpoint import check_tensors, detached
from pyro_sdebnn.infer.methods import (
    BaselineMethod,
    _dropout_layers,
    register_method,
)

__all__ = ["MCDropout"]


@register_method("mc-dropout")
class MCDropout(BaselineMethod):
    """MC-dropout around a network that contains dropout layers.

    .. math::

        \\hat p(y|x) = \\frac1T \\sum_{t=1}^T p(y | f_{\\hat M \\operatorname{diag}(b_t)}(x)),
        \\qquad b_t \\sim \\mathrm{Bernoulli}(\\rho)

    **References**

    1. Yarin Gal, Zoubin Ghahramani (2016), *Dropout as a Bayesian approximation: representing model uncertainty in
       deep learning*, ICML.

    :param nn.Module net: the network; must contain at least one ``nn.Dropout*`` module with ``p > 0``
        (e.g. an ``nn.Dropout(0.1)`` after each hidden activation).
    :param str likelihood: ``"categorical"`` (``C`` logits) or ``"normal"`` (mean, log-variance).
    :param int num_samples: ``T``, the number of stochastic forward passes at prediction.

    >>> from torch import nn
    >>> x, y = torch.randn(32, 2), torch.randint(0, 2, (32,))
    >>> net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
    >>> method = MCDropout(net, "categorical", num_samples=8)
    >>> method.fit(x, y, num_epochs=2).predict(x[:5]).probs.shape
    torch.Size([8, 5, 2])
    """

    def __init__(self, net: nn.Module, likelihood: str = "categorical", *, num_samples: int = 50) -> None:
        super().__init__(likelihood)
        if not isinstance(net, nn.Module):
            raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        self.dropout_layers = [m for m in _dropout_layers(net) if m.p > 0]
        if not self.dropout_layers:
            raise ValueError("net has no dropout layer with p > 0; add e.g. nn.Dropout(0.1) after each hidden "
                             "activation")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        self.net = net
        self.num_samples = num_samples

    def fit(
        self,
        x,
        y: Tensor | None = None,
        *,
        num_epochs: int = 200,
        lr: float = 1e-2,
        batch_size: int | None = 32,
        weight_decay: float = 1e-4,
        progress: bool = False,
        scheduler=None,
        scheduler_step: str = "epoch",
        clip_norm: float | None = None,
        clip_inf_norm: float | None = None,
        resume: bool = False,
    ) -> "MCDropout":
        """Train with dropout active (Adam, mean NLL, weight decay); returns ``self``.

        ``x`` is the inputs ``(N, ...)`` with targets ``y``, or a loader of ``(x, y)`` batches (``y``
        omitted, ``batch_size`` unused; an epoch is one pass over the loader).
        ``scheduler``, ``scheduler_step``, ``clip_norm`` and ``clip_inf_norm`` are those of
        :func:`~pyro_sdebnn.infer.map_training.train_network`: a callable ``optimizer -> lr_scheduler``
        stepped per epoch or per step, and clipping of the whole gradient,
        :math:`g \\leftarrow g \\min(1, c/\\|g\\|_2)` and :math:`g \\leftarrow g \\min(1, c/\\|g\\|_\\infty)`.
        The loss of every epoch is appended to ``losses``.

        :param bool resume: continue the last (or a loaded) run: Adam's and the scheduler's state and
            torch's random state are restored, so ``fit(num_epochs=k)`` then ``fit(num_epochs=K - k,
            resume=True)`` (with the same other arguments) equals ``fit(num_epochs=K)``.

        **Data-parallel.** Under ``torchrun`` (:func:`pyro_sdebnn.distributed.init`, more than one rank), a loader
        ``x`` sharded by a :class:`~torch.utils.data.distributed.DistributedSampler` (e.g.
        :func:`pyro_sdebnn.distributed.distributed_loader`) makes the training data-parallel as in
        :func:`~pyro_sdebnn.infer.map_training.train_network` (rank 0's weights copied to every rank, gradients averaged
        before every step, ``x.sampler.set_epoch(epoch)`` with the epochs counted as :attr:`epoch`), and
        :meth:`save` writes on rank 0 only (with every rank's random state: each rank resumes from its own). Each rank
        draws its own dropout masks for its shard (seed the ranks differently, e.g. ``init(seed=s)``), so the ranks
        together thin the global batch as one process would.
        """
        self._fit_network(
            self.net, x, y, desc="mc-dropout", resume=resume, num_epochs=num_epochs, lr=lr, batch_size=batch_size,
            weight_decay=weight_decay, progress=progress, scheduler=scheduler, scheduler_step=scheduler_step,
            clip_norm=clip_norm, clip_inf_norm=clip_inf_norm,
        )
        return self

    @torch.no_grad()
    def predict_outputs(self, x, num_samples: int | None = None) -> Tensor:
        """Raw outputs under ``T`` dropout masks, shape ``(T, N, C)``; other layers in eval mode.

        Each of the ``T`` samples is one thinned network :math:`\\hat M \\operatorname{diag}(b_t)`: its
        masks :math:`b_t` are drawn once and shared by every input (and every batch of a loader ``x``),
        so predictions over a loader equal those on the concatenated tensors. ``nn.Dropout`` masks a
        layer's features, ``nn.Dropout1d/2d/3d`` its channels.
        """
        num_samples = self.num_samples if num_samples is None else num_samples
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        device, dtype = _module_device_dtype(self.net)
        masks: list[dict[int, Tensor]] = [{} for _ in range(num_samples)]
        current: list[dict[int, Tensor]] = [masks[0]]

        def apply_mask(layer, args, output):
            return _shared_mask_dropout(layer, args[0], current[0])

        was_training = self.net.training
        self.net.eval()  # every dropout layer too: the hooks apply the shared masks
        hooks = [layer.register_forward_hook(apply_mask) for layer in self.dropout_layers]
        try:
            # Draw every mask first (one forward pass of one input per sample), before a loader's
            # iteration draws its seeds: the masks are then those the concatenated tensors would get.
            first = _first_inputs(x, device, dtype, self.likelihood)[:1]
            for t in range(num_samples):
                current[0] = masks[t]
                self.net(first)
            chunks = []
            for xb in _iter_inputs(x, device, dtype, self.likelihood):
                outs = []
                for t in range(num_samples):
                    current[0] = masks[t]
                    outs.append(self.net(xb))
                chunks.append(torch.stack(outs))
            return torch.cat(chunks, 1)
        finally:
            for hook in hooks:
                hook.remove()
            self.net.train(was_training)

    def _fitted_state(self) -> dict:
        return {"net": detached(self.net.state_dict()), "num_samples": self.num_samples}

    def _prepare_load(self, state: dict):
        check_tensors(state.get("net"), self.net.state_dict(), "network weights")
        return lambda: self.net.load_state_dict(state["net"])


def _shared_mask_dropout(layer: nn.Module, inputs: Tensor, masks: dict[int, Tensor]) -> Tensor:
    """``inputs`` times the mask of ``layer`` kept in ``masks`` (drawn at the first call), over ``1 - p``.

    The mask has the shape of one example (``nn.Dropout``) or one weight per channel
    (``nn.Dropout1d/2d/3d``), so every input of every batch is thinned the same way.
    """
    key = id(layer)
    if key not in masks:
        shape: tuple[int, ...]
        if isinstance(layer, nn.Dropout):
            shape = tuple(inputs.shape[1:])
        elif isinstance(layer, (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)):
            shape = (inputs.shape[1],) + (1,) * (inputs.dim() - 2)
        else:
            raise TypeError(
                f"MC-dropout prediction supports nn.Dropout and nn.Dropout1d/2d/3d layers, got {type(layer).__name__}"
            )
        keep = 1.0 - layer.p
        masks[key] = torch.bernoulli(torch.full(shape, keep, dtype=inputs.dtype, device=inputs.device)) / keep
    return inputs * masks[key]
