# SPDX-License-Identifier: Apache-2.0
r"""Deep ensembles across ranks: the members are split over the ranks and gathered for prediction.

The members of a deep ensemble (Lakshminarayanan et al. [1]) are trained independently, so :math:`K` members need
no communication during training: every rank builds a :class:`~pyro_sdebnn.infer.DeepEnsemble` of its
:func:`local_members` share, seeded by :func:`~pyro_sdebnn.distributed.init` with ``seed + rank``, and fits it on
the full data. :func:`gather_prediction` then stacks every rank's member outputs on rank 0, rank after rank, into
the mixture predictive of all :math:`K` members,

.. math::

    \hat p(y \mid x, \mathcal D) = \frac1K \sum_{r} \sum_{k \in \mathcal K_r} p(y \mid x, \hat w_k),

the prediction of one ensemble holding all the members. It works for any baseline with ``predict_outputs``
(e.g. the MC-dropout samples of :class:`~pyro_sdebnn.infer.MCDropout`, one share of the samples per rank).

**References**

[1] Balaji Lakshminarayanan, Alexander Pritzel, Charles Blundell (2017). "Simple and Scalable Predictive
Uncertainty Estimation using Deep Ensembles". NeurIPS 2017.

>>> local_members(5)  # one process holds them all
5
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from pyro_sdebnn._comm import all_gather_objects, gather_objects, rank, world_size
from pyro_sdebnn.infer.methods import outputs_to_prediction

__all__ = ["gather_prediction", "local_members"]


def local_members(num_members: int) -> int:
    """How many of ``num_members`` ensemble members this rank trains: ``K // W``, plus one on the first ``K % W``
    ranks.

    :raises ValueError: if ``num_members`` is not an int of at least the world size (a rank without members).
    """
    size = world_size()
    if isinstance(num_members, bool) or not isinstance(num_members, int) or num_members < size:
        raise ValueError(f"num_members must be an int of at least the world size {size} (every rank trains one "
                         f"member or more), got {num_members!r}")
    return num_members // size + (rank() < num_members % size)


def gather_predict_outputs(method: Any, x, dst: int = 0, **kwargs: Any) -> Optional[Tensor]:
    """The ``method.predict_outputs(x)`` of every rank, concatenated along the members (dim 0) on rank ``dst``.

    :param method: a fitted baseline with ``predict_outputs`` (e.g. a :class:`~pyro_sdebnn.infer.DeepEnsemble`);
        the same likelihood and output shape on every rank.
    :param x: the inputs (a tensor or a loader), the same on every rank.
    :param kwargs: passed to ``predict_outputs``.
    :returns: ``(K, N, C)`` on rank ``dst`` (on the CPU), ``None`` on the other ranks.
    :raises ValueError: if the ranks' outputs differ in shape beyond the member dimension.
    """
    outputs = method.predict_outputs(x, **kwargs).detach().cpu()
    shapes = all_gather_objects(tuple(outputs.shape[1:]))
    if len(set(shapes)) != 1:
        raise ValueError(f"the ranks' outputs have different shapes {shapes}: predict on the same inputs everywhere")
    gathered = gather_objects(outputs, dst=dst)
    return None if gathered is None else torch.cat(gathered)


def gather_prediction(method: Any, x, dst: int = 0, **kwargs: Any) -> Any:
    """The predictive of the members of all the ranks on rank ``dst`` (``None`` on the others).

    ``outputs_to_prediction`` of ``gather_predict_outputs`` (the members' raw outputs on rank ``dst``): a
    :class:`~pyro_sdebnn.predictive.ClassificationPrediction` or
    :class:`~pyro_sdebnn.predictive.RegressionPrediction` over all the members, as ``method.predict(x)`` of
    one ensemble holding them.
    """
    outputs = gather_predict_outputs(method, x, dst=dst, **kwargs)
    return None if outputs is None else outputs_to_prediction(outputs, method.likelihood)
