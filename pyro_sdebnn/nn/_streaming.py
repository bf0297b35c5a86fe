# SPDX-License-Identifier: Apache-2.0
"""Prediction streamed over a loader: one batch on the device at a time, the same posterior draws for all."""

from __future__ import annotations

from typing import Any, Callable, Optional, TypeVar, cast

import torch
from torch import Tensor, nn

from pyro_sdebnn.data.loaders import iter_batches, module_device_dtype
from pyro_sdebnn.predictive import ClassificationPrediction, RegressionPrediction

# the CPU generator's state and, on a CUDA device, that device's generator state
_RngStates = tuple[Tensor, Optional[Tensor]]
_Prediction = TypeVar("_Prediction", bound="ClassificationPrediction | RegressionPrediction")


def _rng_states(device: torch.device | None) -> _RngStates:
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state(device) if device is not None and device.type == "cuda" else None
    return cpu, cuda


def _set_rng_states(states: _RngStates, device: torch.device | None) -> None:
    torch.set_rng_state(states[0])
    if states[1] is not None:
        assert device is not None  # a CUDA state is only saved for a CUDA device
        torch.cuda.set_rng_state(states[1], device)


def stream_predict(
    predict: Callable[[Tensor], _Prediction], loader: Any, module: nn.Module, *, same_draws: bool = True
) -> _Prediction:
    """Apply ``predict`` to every input batch of ``loader`` and concatenate the predictions along ``N``.

    Each batch is moved to ``module``'s device and dtype on its own (targets, if the loader yields
    ``(x, y)``, are ignored). With ``same_draws`` the random generators are rewound to the same state
    before every batch, so that every batch sees the same posterior draws (weight samples, paths) as
    one call on the whole data would; afterwards they are left where one call would leave them.

    :returns: a :class:`~pyro_sdebnn.infer.ClassificationPrediction` (``probs`` concatenated on dim 1)
        or :class:`~pyro_sdebnn.infer.RegressionPrediction` (``loc`` and ``scale`` concatenated on dim 1).
    """
    device, dtype = module_device_dtype(module, buffers=True)
    start = _rng_states(device) if same_draws else None
    after: Optional[_RngStates] = None
    preds: list[_Prediction] = []
    for x, _ in iter_batches(loader, device, dtype, with_targets=False):
        if start is not None:
            _set_rng_states(start, device)
        preds.append(predict(x))
        if after is None and same_draws:
            after = _rng_states(device)
    if not preds:
        raise ValueError("the loader yields no batch to predict")
    if after is not None:
        _set_rng_states(after, device)
    # predict returns one type of prediction: the first batch's type is that of all of them
    if isinstance(preds[0], ClassificationPrediction):
        cls_preds = cast(list[ClassificationPrediction], preds)
        return cast(_Prediction, ClassificationPrediction(torch.cat([p.probs for p in cls_preds], 1)))
    if isinstance(preds[0], RegressionPrediction):
        reg_preds = cast(list[RegressionPrediction], preds)
        return cast(_Prediction, RegressionPrediction(torch.cat([p.loc for p in reg_preds], 1),
                                                      torch.cat([p.scale for p in reg_preds], 1)))
    raise TypeError(f"cannot concatenate predictions of type {type(preds[0]).__name__}")
