# SPDX-License-Identifier: Apache-2.0
"""Out-of-distribution detection from an uncertainty score (e.g. the predictive entropy)."""

from __future__ import annotations

import torch
from torch import Tensor

from ._validation import _check_vector

__all__ = ["ood_auroc"]


def ood_auroc(scores_in, scores_out) -> Tensor:
    """Area under the ROC curve for telling out-of-distribution from in-distribution inputs.

    Higher scores should mean "more likely out-of-distribution" (use the predictive entropy of
    :func:`~pyro_sdebnn.metrics.predictive_entropy`, or the mutual information for epistemic
    uncertainty). The AUROC is the probability that a random OOD input scores higher than a random
    in-distribution input, ties counting one half:

    .. math::

        \\mathrm{AUROC} = \\frac1{n_\\text{in} n_\\text{out}} \\sum_{i, j}
        \\Bigl(\\mathbb 1[s^\\text{out}_j > s^\\text{in}_i]
        + \\tfrac12 \\mathbb 1[s^\\text{out}_j = s^\\text{in}_i]\\Bigr).

    Computed with ``sklearn.metrics.roc_auc_score`` (on CPU); 0.5 is chance, 1 perfect separation.

    :param scores_in: ``(N_in,)`` scores of in-distribution test inputs.
    :param scores_out: ``(N_out,)`` scores of out-of-distribution inputs.
    :return: 0-dim tensor in :math:`[0, 1]`, dtype (float32 for float16/bfloat16) and device of
        ``scores_in``.

    **References**

    [1] D. Hendrycks, K. Gimpel (2017), "A baseline for detecting misclassified and
    out-of-distribution examples in neural networks", ICLR.

    >>> ood_auroc(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.25, 0.9]))
    tensor(0.8333)
    """
    from sklearn.metrics import roc_auc_score

    scores_in = _check_vector("scores_in", scores_in)
    scores_out = _check_vector("scores_out", scores_out)
    scores = torch.cat([scores_in, scores_out.to(scores_in)]).detach().cpu().double().numpy()
    is_out = torch.cat([torch.zeros(len(scores_in)), torch.ones(len(scores_out))]).numpy()
    return torch.tensor(roc_auc_score(is_out, scores), dtype=scores_in.dtype, device=scores_in.device)
