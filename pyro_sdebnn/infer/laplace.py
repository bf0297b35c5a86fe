# SPDX-License-Identifier: Apache-2.0
# One module for one object: the fit, the three curvature structures, the evidence, the predictives and the
# checkpoint of the Laplace approximation all read one representation of the posterior (the eigendecomposition
# ``_eig`` and the Kronecker factors ``_kron``), so they stay side by side, in the order of the section comments
# below. The online training of the prior precision reads only the evidence, so it lives in ``_online_marglik.py``.
"""The Laplace approximation of a network's weight posterior (MacKay [2]; Daxberger et al. [1]).

Around the MAP :math:`\\hat w` the posterior is approximated by :math:`\\mathcal N(\\hat w, H^{-1})` with

.. math::

    H = H_{\\mathrm{data}} + \\delta I, \\qquad
    H_{\\mathrm{data}} \\approx \\sum_n J_n^\\top \\Lambda_n J_n \\quad \\text{(generalised Gauss-Newton)},

where :math:`J_n = \\partial f_{\\hat w}(x_n)/\\partial w`, :math:`\\Lambda_n` is the Hessian of the negative
log-likelihood with respect to the network outputs and :math:`\\delta = 1/\\tau^2` the prior precision. Structures of
:math:`H_{\\mathrm{data}}`: ``"full"`` (the dense GGN, or with ``curvature="hessian"`` the exact Hessian), ``"diag"``
(its diagonal) and ``"kron"`` (per linear layer :math:`G_\\ell \\otimes A_\\ell`, KFAC [3]); ``subset="last_layer"``
restricts the approximation to the last linear layer [1]. All structures store an eigendecomposition of
:math:`H_{\\mathrm{data}}`, so the Laplace evidence

.. math::

    \\log p(\\mathcal D | \\delta) \\approx \\log p(\\mathcal D|\\hat w) - \\tfrac\\delta2 \\|\\hat w\\|^2
    + \\tfrac P2 \\log\\delta - \\tfrac12 \\log\\det(H_{\\mathrm{data}} + \\delta I)

is cheap for every :math:`\\delta`: :meth:`Laplace.optimize_prior_precision` maximises it on a grid [2], and the
online tuning [4] during the MAP training ascends it. Predictives: linearised (``pred_type="glm"``; logits
:math:`\\mathcal N(f_{\\hat w}(x), J(x) H^{-1} J(x)^\\top)`, then the probit approximation or Monte Carlo) or
sampled weights (``pred_type="nn"``). :doc:`/methods/baselines` gives the curvature of each likelihood, the KFAC
factors and the predictive in full.

**References**

1. E. Daxberger, A. Kristiadi, A. Immer, R. Eschenhagen, M. Bauer, P. Hennig (2021),
   *Laplace Redux -- effortless Bayesian deep learning*, NeurIPS.
2. D. J. C. MacKay (1992), *A practical Bayesian framework for backpropagation networks*,
   Neural Computation.
3. J. Martens, R. Grosse (2015), *Optimizing neural networks with Kronecker-factored approximate
   curvature*, ICML.
4. A. Immer, M. Bauer, V. Fortuin, G. Rätsch, M. E. Khan (2021), *Scalable marginal likelihood estimation
   for model selection in deep learning*, ICML.
"""

from __future__ import annotations

import math
import os
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.func import functional_call, jacrev, vmap

from pyro_sdebnn._comm import all_reduce_sum, broadcast_module_
from pyro_sdebnn.data.loaders import check_finite_batch, iter_batches
from pyro_sdebnn.infer._baseline_data import (
    _follow_module,
    _check_data,
    _check_fit_args,
    _is_loader_arg,
    _iter_inputs,
    _module_device_dtype,
    _TrainingData,
)
from pyro_sdebnn.infer._online_marglik import check_tuning, log_evidence, train_online
from pyro_sdebnn.infer.checkpoint import check_tensors, detached
from pyro_sdebnn.infer.methods import (
    BaselineMethod,
    Prediction,
    negative_log_likelihood_terms,
    outputs_to_prediction,
    register_method,
)
from pyro_sdebnn.predictive import ClassificationPrediction, RegressionPrediction

__all__ = ["Laplace"]

_STRUCTURES = ("full", "diag", "kron")
_SUBSETS = ("all", "last_layer")
_MAX_JACOBIAN_ELEMENTS = 2**24  # memory bound for one chunk of Jacobians (64 MiB in float32)


def _wide(t: Tensor) -> Tensor:
    """float64 for eigen-decompositions and log-determinants where the device supports it."""
    return t if t.device.type == "mps" else t.double()


def _eigh_low_rank(h: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """``torch.linalg.eigh`` of a symmetric positive semi-definite :math:`P \\times P` matrix of rank at most
    ``rank`` :math:`= r < P`, in :math:`O(P^2 r)` instead of :math:`O(P^3)`.

    A Gaussian test matrix :math:`\\Omega` (a fixed seed: no draw from torch's random state) gives an orthonormal
    basis :math:`Q` of the range of :math:`H \\Omega`, which is the range of :math:`H` (Halko, Martinsson, Tropp
    (2011), "Finding structure with randomness", SIAM Review 53(2)); the eigenpairs of :math:`Q^\\top H Q` are those of
    :math:`H` on its range, and a complete QR factorisation of :math:`Q` completes the basis with eigenvalue 0.
    Returns the eigenvalues in ascending order and the eigenvectors as columns, as ``eigh`` does.
    """
    p = h.shape[0]
    generator = torch.Generator(device=h.device).manual_seed(0)
    omega = torch.randn(p, rank, dtype=h.dtype, device=h.device, generator=generator)
    q = torch.linalg.qr(h @ omega)[0]
    evals_range, u = torch.linalg.eigh(q.T @ h @ q)
    complement = torch.linalg.qr(q, mode="complete")[0][:, rank:]
    evals = torch.cat([evals_range.new_zeros(p - rank), evals_range])
    evecs = torch.cat([complement, q @ u], 1)
    order = torch.argsort(evals)
    return evals[order], evecs[:, order]


def _join(prefix: str, leaf: str) -> str:
    return f"{prefix}.{leaf}" if prefix else leaf


def _available_memory(device: torch.device) -> int | None:
    """Bytes that can still be allocated on ``device``: the free memory of a CUDA device, else the system's
    available memory (``psutil`` when installed, else ``MemAvailable`` of ``/proc/meminfo``, else the physical
    memory); ``None`` when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        import psutil  # type: ignore[import-untyped]  # optional, its stubs (types-psutil) need not be installed

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _finite(x: Tensor, batch_index: int | None) -> Tensor:
    """``x`` after :func:`~pyro_sdebnn.data.loaders.check_finite_batch` (the inputs to predict on)."""
    check_finite_batch(x, what="x", batch_index=batch_index)
    return x


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


def _sum_over_ranks(curvature: dict[str, Tensor], log_likelihood: Tensor, n: int):
    """The sums over the ranks of the shards' curvature statistics, log-likelihoods and point counts (one
    all-reduce, in float64 where the device has it)."""
    keys = sorted(curvature)
    parts = [curvature[k] for k in keys] + [log_likelihood.reshape(1)]
    flat = torch.cat([_wide(t).reshape(-1) for t in parts] + [_wide(log_likelihood.new_tensor([float(n)]))])
    total = all_reduce_sum(flat)
    out, offset = {}, 0
    for k, t in zip(keys, parts):
        out[k] = total[offset:offset + t.numel()].view_as(t).to(t.dtype)
        offset += t.numel()
    return out, total[offset].to(log_likelihood.dtype), int(total[offset + 1])


@register_method("laplace")
class Laplace(BaselineMethod):
    """Laplace approximation around the MAP of ``net``, with a GGN curvature of a chosen structure.

    .. math::

        q(w) = \\mathcal N(\\hat w, (H_{\\mathrm{data}} + \\delta I)^{-1}), \\qquad
        f(x) \\approx \\mathcal N(f_{\\hat w}(x), J(x) (H_{\\mathrm{data}} + \\delta I)^{-1} J(x)^\\top)

    **References**

    1. Erik Daxberger, Agustinus Kristiadi, Alexander Immer, Runa Eschenhagen, Matthias Bauer, Philipp Hennig (2021),
       *Laplace Redux -- effortless Bayesian deep learning*, NeurIPS.
    2. David J. C. MacKay (1992), *A practical Bayesian framework for backpropagation networks*, Neural
       Computation 4(3).
    3. J. Martens, R. Grosse (2015), *Optimizing neural networks with Kronecker-factored approximate curvature*,
       ICML.
    4. A. Immer, M. Bauer, V. Fortuin, G. Rätsch, M. E. Khan (2021), *Scalable marginal likelihood estimation
       for model selection in deep learning*, ICML.

    :param nn.Module net: the network; it is trained in place by :meth:`fit` (use ``num_epochs=0``
        for an already trained network).
    :param str likelihood: ``"categorical"`` or ``"normal"`` (2 outputs: mean, log-variance).
    :param str subset: ``"all"`` weights or the ``"last_layer"`` (the last ``nn.Linear``).
    :param str hessian_structure: ``"full"``, ``"diag"`` or ``"kron"``.
    :param str curvature: ``"ggn"`` (positive semi-definite) or, for ``"full"``, the exact ``"hessian"``.
    :param prior_precision: :math:`\\delta`; ``None`` uses :math:`N\\lambda` from the weight decay of
        :meth:`fit` (before tuning by the evidence).

    >>> from torch import nn
    >>> x, y = torch.randn(40, 2), torch.randint(0, 2, (40,))
    >>> net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> la = Laplace(net, "categorical", hessian_structure="kron").fit(x, y, num_epochs=5)
    >>> la.predict(x[:3]).probs.shape, la.predict(x[:3], pred_type="nn", num_samples=10).probs.shape
    (torch.Size([1, 3, 2]), torch.Size([10, 3, 2]))
    """

    # the fitted posterior, set by ``fit`` (or ``load``): log p(D | w_hat), the eigenvalues of H_data (and its
    # eigenvectors for "full"), and per layer (name, eigenvalues and eigenvectors of G, then of A) for "kron"
    _log_likelihood: Tensor
    _eig: tuple[Tensor, ...]
    _kron: list[tuple[Any, ...]]

    def __init__(
        self,
        net: nn.Module,
        likelihood: str = "categorical",
        *,
        subset: str = "all",
        hessian_structure: str = "full",
        curvature: str = "ggn",
        prior_precision: float | None = None,
    ) -> None:
        super().__init__(likelihood)
        if not isinstance(net, nn.Module):
            raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        if subset not in _SUBSETS:
            raise ValueError(f"subset must be one of {_SUBSETS}, got {subset!r}")
        if hessian_structure not in _STRUCTURES:
            raise ValueError(f"hessian_structure must be one of {_STRUCTURES}, got {hessian_structure!r}")
        if curvature not in ("ggn", "hessian"):
            raise ValueError(f"curvature must be 'ggn' or 'hessian', got {curvature!r}")
        if curvature == "hessian" and hessian_structure != "full":
            raise ValueError("curvature='hessian' is only available with hessian_structure='full'")
        if prior_precision is not None and not prior_precision > 0:
            raise ValueError(f"prior_precision must be positive or None, got {prior_precision!r}")
        self.net = net
        self.subset = subset
        self.hessian_structure = hessian_structure
        self.curvature = curvature
        self.prior_precision = prior_precision
        self._layers = self._select_layers()
        self._names = [_join(prefix, leaf) for prefix, module in self._layers
                       for leaf, _ in module.named_parameters(recurse=False)]
        if not self._names:
            raise ValueError("the selected subset of net has no parameters")
        if hessian_structure == "kron":
            for prefix, module in self._layers:
                if not isinstance(module, nn.Linear) or module.bias is None:
                    raise ValueError(
                        "hessian_structure='kron' supports nn.Linear layers with a bias; layer "
                        f"{prefix!r} is a {type(module).__name__}"
                        + (" without bias" if isinstance(module, nn.Linear) else "")
                    )
        self._fitted = False

    # ------------------------------------------------------------------ set-up
    def _select_layers(self) -> list[tuple[str, nn.Module]]:
        modules = self._all_layers()
        if self.subset == "last_layer":
            linears = [(name, m) for name, m in modules if isinstance(m, nn.Linear)]
            if not linears:
                raise ValueError("subset='last_layer' needs a network with an nn.Linear layer")
            return [linears[-1]]
        return modules

    def _theta(self) -> dict[str, Tensor]:
        params = dict(self.net.named_parameters())
        return {name: params[name].detach() for name in self._names}

    def _hold_map(self) -> None:
        """Hold the current weights as the MAP :math:`\\hat w` (the selected ones) and the others as constants."""
        self._theta_hat = self._theta()
        self._frozen = {n: p.detach() for n, p in self.net.named_parameters() if n not in self._theta_hat}
        self._frozen.update(dict(self.net.named_buffers()))

    def _outputs(self, theta: dict[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(self.net, {**self._frozen, **theta}, (x,))

    def _chunks(self, n: int, width: int | None = None) -> list[slice]:
        """Slices of at most :data:`_MAX_JACOBIAN_ELEMENTS` Jacobian entries (``width`` weights per output,
        default all :math:`P`)."""
        width = self.num_params if width is None else width
        size = max(1, _MAX_JACOBIAN_ELEMENTS // max(1, self._num_outputs * width))
        return [slice(i, min(n, i + size)) for i in range(0, n, size)]

    def _jacobian(self, x: Tensor, names: list[str] | None = None) -> dict[str, Tensor]:
        """``{name: (N, K, *shape)}``: Jacobian of the outputs with respect to the selected weights
        (or only to those in ``names``, the others held at the MAP)."""
        wrt = self._theta_hat if names is None else {name: self._theta_hat[name] for name in names}

        # Per-example Jacobians (vmap over examples of jacrev): O(N K P), not the O(N^2 K P) of jacrev of the batch.
        def single(theta: dict[str, Tensor], xi: Tensor) -> Tensor:
            return self._outputs({**self._theta_hat, **theta}, xi.unsqueeze(0)).squeeze(0)

        return vmap(jacrev(single), in_dims=(None, 0))(wrt, x)

    def _unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """Split a ``(..., P)`` weight vector into ``{name: (..., *shape)}`` in the order of the selected weights."""
        sizes = [self._theta_hat[name].numel() for name in self._names]
        return {
            name: part.reshape(*flat.shape[:-1], *self._theta_hat[name].shape)
            for name, part in zip(self._names, flat.split(sizes, -1))
        }

    def _output_hessian(self, outputs: Tensor) -> Tensor:
        """:math:`\\Lambda_n`, shape ``(N, K, K)``."""
        if self.likelihood == "categorical":
            p = outputs.softmax(-1)
            return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
        log_var = outputs[..., 1]
        diag = torch.stack([torch.exp(-log_var), torch.full_like(log_var, 0.5)], -1)
        return torch.diag_embed(diag)

    def full_curvature_bytes(self, dtype: torch.dtype | None = None) -> int:
        """Peak memory of ``hessian_structure="full"`` in bytes: :math:`P^2 (b + 32)` for weights of
        :math:`b` bytes each -- the :math:`P \\times P` curvature in the network's dtype and, in float64, its
        symmetrised copy, the eigenvectors and the eigensolver's workspace (plus the Jacobian chunks)."""
        dtype = _module_device_dtype(self.net)[1] if dtype is None else dtype
        item = torch.empty((), dtype=dtype).element_size()
        return self.num_params ** 2 * (item + 32)

    def _check_memory(self) -> None:
        """Refuse ``"full"`` before any work when its curvature cannot fit in the device's memory."""
        if self.hessian_structure != "full":
            return
        device, dtype = _module_device_dtype(self.net)
        need, free = self.full_curvature_bytes(dtype), _available_memory(device)
        if free is None or need <= free:
            return
        alternatives = "hessian_structure='kron' or 'diag'"
        if self.subset == "all":
            last = [m for _, m in self.net.named_modules() if isinstance(m, nn.Linear)]
            if last:
                size = sum(p.numel() for p in last[-1].parameters(recurse=False))
                alternatives += f", or subset='last_layer' (P = {size:,})"
        raise MemoryError(
            f"hessian_structure='full' over P = {self.num_params:,} weights needs about {_gib(need)} (the P x P "
            f"curvature and its float64 eigendecomposition) but {_gib(free)} is available on {device}; "
            f"use {alternatives}"
        )

    @property
    def num_params(self) -> int:
        """:math:`P`, the number of weights under the Laplace approximation."""
        return sum(p.numel() for p in self._theta().values())  # parameter shapes never change

    # ------------------------------------------------------------------ fitting
    def fit(
        self,
        x,
        y: Tensor | None = None,
        *,
        num_epochs: int = 200,
        lr: float = 1e-2,
        batch_size: int | None = 32,
        weight_decay: float = 1e-4,
        tune_prior_precision: bool | str | None = None,
        marglik_burnin: int = 10,
        marglik_frequency: int = 5,
        marglik_steps: int = 20,
        marglik_lr: float = 0.1,
        progress: bool = False,
        scheduler=None,
        scheduler_step: str = "epoch",
        clip_norm: float | None = None,
        clip_inf_norm: float | None = None,
        resume: bool = False,
    ) -> "Laplace":
        """Train the MAP (Adam with weight decay), compute the curvature and tune :math:`\\delta`.

        :param x: inputs ``(N, ...)`` with targets ``y``, or a loader of ``(x, y)`` batches (``y`` omitted,
            ``batch_size`` unused): the curvature and log-likelihood are then accumulated batch by batch,
            :math:`H_{\\mathrm{data}} = \\sum_{\\mathcal B} \\sum_{n \\in \\mathcal B} J_n^\\top \\Lambda_n J_n`.
        :param int num_epochs: MAP training epochs (0: use ``net`` as trained).
        :param float lr: Adam's learning rate for the MAP training.
        :param batch_size: minibatch size on tensors (``None``: the whole data set at once).
        :param float weight_decay: the MAP training's weight decay; :math:`\\delta = N \\cdot` ``weight_decay`` is the
            starting prior precision when none is set (``"online"`` then decays by :math:`\\delta/N` as it learns it).
        :param tune_prior_precision: how :math:`\\delta` is chosen from the Laplace evidence
            :math:`\\log p(\\mathcal D|\\delta)`: ``True`` or ``"posthoc"``, maximise it after the MAP training [2];
            ``"online"``, learn it during the MAP training, which uses it as its weight decay :math:`\\delta/N`
            (Immer et al. [4], Algorithm 1; every ``marglik_frequency`` epochs after ``marglik_burnin``,
            ``marglik_steps`` Adam steps of rate ``marglik_lr`` on :math:`\\log\\delta`), then post-hoc;
            ``False``, keep :math:`\\delta`; ``None`` (default), ``"online"`` for ``subset="all"`` and ``"posthoc"``
            for the last layer. :doc:`/methods/baselines` explains the choice.
        :param scheduler: learning-rate schedule of the MAP training, as in
            :func:`~pyro_sdebnn.infer.map_training.train_network` (a callable ``optimizer -> lr_scheduler``), stepped
            per ``scheduler_step`` (``"epoch"`` or ``"step"``).
        :param clip_norm: clip the whole MAP gradient by its :math:`L_2` norm,
            :math:`g \\leftarrow g \\min(1, c/\\|g\\|_2)`.
        :param clip_inf_norm: clip it by its :math:`L_\\infty` norm.
        :param int marglik_burnin: ``"online"``: MAP epochs before the first update of :math:`\\delta`.
        :param int marglik_frequency: ``"online"``: epochs between updates.
        :param int marglik_steps: ``"online"``: Adam steps on :math:`\\log\\delta` per update.
        :param float marglik_lr: ``"online"``: their learning rate.
        :param bool progress: show a progress bar of the MAP epochs.
        :param bool resume: continue the MAP training (and an online tuning) of the last or a loaded run from its
            optimiser, scheduler and random states, so that ``fit(num_epochs=k)`` then
            ``fit(num_epochs=K - k, resume=True)`` equals ``fit(num_epochs=K)``.
        :returns: ``self``.
        :raises ValueError: if data-parallel and the ranks' loaders take different numbers of steps, or the data
            set has fewer points than ranks.
        :raises MemoryError: before any training, if ``hessian_structure="full"`` needs more memory
            (:meth:`full_curvature_bytes`) than the network's device has available.

        Under ``torchrun`` with a sharded loader the MAP trains data-parallel and the ranks sum their shards'
        curvature, so every rank holds the posterior of the whole data set (:doc:`/distributed`).
        """
        loader = x if _is_loader_arg(x) else None
        x, y = _follow_module(x, y, self.net)  # tensors: on the network's device and dtype (loader batches are moved)
        if tune_prior_precision is None:
            tune_prior_precision = "online" if self.subset == "all" else "posthoc"
        tuning = check_tuning(tune_prior_precision, marglik_burnin, marglik_frequency, marglik_steps, marglik_lr)
        self._check_memory()
        data = _TrainingData(x, y, self.likelihood, batch_size)
        if not data.is_loader:  # a loader's batches are checked as they are read
            check_finite_batch(x, y, what="x")
        training = dict(lr=lr, batch_size=batch_size, progress=progress, scheduler=scheduler,
                        scheduler_step=scheduler_step, clip_norm=clip_norm, clip_inf_norm=clip_inf_norm)
        # the training state is kept before the curvature pass, which reads the loader again
        if tuning == "online":
            train_online(self, x, y, data.n, num_epochs=num_epochs, weight_decay=weight_decay, burnin=marglik_burnin,
                         frequency=marglik_frequency, steps=marglik_steps, hyper_lr=marglik_lr,
                         resume_state=self._resume_state(resume, loader), **training)
        else:
            self._fit_network(self.net, x, y, desc="laplace MAP", resume=resume, num_epochs=num_epochs,
                              weight_decay=weight_decay, **training)
        sampler = self._data_parallel_sampler(loader)  # several ranks, a sharded loader: the shards' sums add up
        keep = None
        if sampler is not None:
            broadcast_module_(self.net)  # the same network on every rank (already so after a data-parallel MAP)
            # this rank's points without the ones the sampler repeats to even out the shards (positions >= N)
            keep = len(range(sampler.rank, min(data.n, sampler.total_size), sampler.num_replicas))
            if keep == 0:
                raise ValueError(f"x: {data.n} points cannot give every one of the {sampler.num_replicas} ranks "
                                 "a point for the curvature")
        if self.prior_precision is None:
            self.prior_precision = max(data.n * weight_decay, 1e-8)
        self.net.eval()  # dropout off (and left off): the approximation is around the deterministic network
        self._hold_map()
        if data.is_loader:
            device, dtype = _module_device_dtype(self.net)
            batches = iter_batches(loader, device, dtype, check_finite="x")
        else:
            assert y is not None  # _TrainingData requires y with tensors
            batches = iter([(x, y)])  # the whole data set as one batch
        log_likelihood, curvature, n = None, None, 0
        for xb, yb in batches:
            if keep is not None:
                if n >= keep:
                    break
                xb, yb = xb[:keep - n], yb[:keep - n]
            _check_data(xb, yb, self.likelihood)
            with torch.no_grad():
                outputs = self._outputs(self._theta_hat, xb)
                self._num_outputs = outputs.shape[-1]
                term = -negative_log_likelihood_terms(outputs, yb, self.likelihood).sum()
            log_likelihood = term if log_likelihood is None else log_likelihood + term
            part = self._curvature(xb, yb)
            curvature = part if curvature is None else {k: curvature[k] + v for k, v in part.items()}
            n += xb.shape[0]
        if curvature is None:
            raise ValueError("the loader yielded no batch")
        assert log_likelihood is not None  # set with the curvature, batch by batch
        if sampler is not None:
            curvature, log_likelihood, n = _sum_over_ranks(curvature, log_likelihood, n)
        self._log_likelihood = log_likelihood
        self._set_curvature(curvature, n)
        self._fitted = True
        if tuning is not None:
            self.optimize_prior_precision()
        return self

    def _all_layers(self) -> list[tuple[str, nn.Module]]:
        return [(name, m) for name, m in self.net.named_modules() if any(True for _ in m.parameters(recurse=False))]

    def _ggn_terms(self, x: Tensor, names: list[str] | None = None):
        width = None if names is None else sum(self._theta_hat[name].numel() for name in names)
        for chunk in self._chunks(x.shape[0], width):
            xc = x[chunk]
            jac = self._jacobian(xc, names)
            with torch.no_grad():
                sqrt_lam = self._sqrt_output_hessian(self._outputs(self._theta_hat, xc))
            yield jac, sqrt_lam

    def _sqrt_output_hessian(self, outputs: Tensor) -> Tensor:
        """:math:`L_n` with :math:`\\Lambda_n = L_n L_n^\\top`, from the :math:`K \\times K` eigendecomposition of
        :math:`\\Lambda_n`, so that :math:`J^\\top \\Lambda J = V^\\top V` with :math:`V = L^\\top J`."""
        evals, evecs = torch.linalg.eigh(self._output_hessian(outputs))
        return evecs * evals.clamp(min=0).sqrt().unsqueeze(-2)

    def _flat_jacobian(self, jac: dict[str, Tensor]) -> Tensor:
        return torch.cat([jac[name].flatten(2) for name in self._names], -1)

    def _curvature(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        """The additive curvature statistics of one batch (summed over its examples)."""
        if self.hessian_structure == "full":
            return {"h": self._curvature_full(x, y)}
        if self.hessian_structure == "diag":
            return {"diag": self._curvature_diag(x)}
        return self._kron_factors(x)

    def _set_curvature(self, curvature: dict[str, Tensor], n: int) -> None:
        """Eigendecompose the curvature summed over every batch of the ``n`` data points."""
        if self.hessian_structure == "full":
            h_data = _wide(0.5 * (curvature["h"] + curvature["h"].T))
            rank = n * self._num_outputs  # the GGN sums n terms J^T Lambda J of rank <= K each
            if self.curvature == "ggn" and rank <= h_data.shape[0] // 2:
                evals, evecs = _eigh_low_rank(h_data, rank)
            else:
                evals, evecs = torch.linalg.eigh(h_data)
            self._eig = (evals.clamp(min=0), evecs)
        elif self.hessian_structure == "diag":
            self._eig = (_wide(curvature["diag"].clamp(min=0)),)
        else:
            self._kron = []
            for prefix, _ in self._layers:
                a_factor, g_factor = curvature[f"A:{prefix}"], curvature[f"G:{prefix}"] / n
                eval_a, evec_a = torch.linalg.eigh(0.5 * (a_factor + a_factor.T))
                eval_g, evec_g = torch.linalg.eigh(0.5 * (g_factor + g_factor.T))
                self._kron.append((prefix, eval_g.clamp(min=0), evec_g, eval_a.clamp(min=0), evec_a))
            self._eig = (torch.cat([torch.outer(eg, ea).reshape(-1) for _, eg, _, ea, _ in self._kron]),)

    def _curvature_full(self, x: Tensor, y: Tensor) -> Tensor:
        if self.curvature == "hessian":
            flat = torch.cat([self._theta_hat[name].reshape(-1) for name in self._names])

            def total_nll(vec: Tensor) -> Tensor:
                return negative_log_likelihood_terms(self._outputs(self._unflatten(vec), x), y, self.likelihood).sum()

            return jacrev(jacrev(total_nll))(flat).detach()  # reverse-over-reverse: no forward-AD warnings
        h_data = torch.zeros(self.num_params, self.num_params, dtype=x.dtype, device=x.device)
        for jac, sqrt_lam in self._ggn_terms(x):
            v = (sqrt_lam.transpose(-1, -2) @ self._flat_jacobian(jac)).flatten(0, 1)
            h_data += v.T @ v
        return h_data

    def _curvature_diag(self, x: Tensor) -> Tensor:
        diag = torch.zeros(self.num_params, dtype=x.dtype, device=x.device)
        for jac, sqrt_lam in self._ggn_terms(x):
            v = sqrt_lam.transpose(-1, -2) @ self._flat_jacobian(jac)
            diag += v.pow(2).sum((0, 1))
        return diag

    def _layer_inputs(self, x: Tensor) -> dict[str, Tensor]:
        """``{layer: (N, in + 1)}``: the inputs :math:`\\tilde a_n = [a_n, 1]` of every selected linear layer at
        the MAP (read by forward hooks during one forward pass)."""
        inputs: dict[str, Tensor] = {}
        hooks = [
            module.register_forward_hook(lambda mod, args, out, key=prefix: inputs.__setitem__(key, args[0].detach()))
            for prefix, module in self._layers
        ]
        try:
            with torch.no_grad():
                self._outputs(self._theta_hat, x)
        finally:
            for hook in hooks:
                hook.remove()
        out = {}
        for prefix, _ in self._layers:
            a = inputs[prefix].reshape(x.shape[0], -1)
            out[prefix] = torch.cat([a, torch.ones_like(a[:, :1])], -1)
        return out

    def _bias_jacobians(self, x: Tensor) -> tuple[dict[str, Tensor], Tensor, dict[str, Tensor]] | None:
        """At the MAP, the inputs :math:`\\tilde a_n = [a_n, 1]` ``(N, in + 1)`` of every selected linear layer, the
        outputs ``(N, K)`` and every layer's :math:`B_n = \\partial f / \\partial b = \\partial f / \\partial`
        pre-activation ``(N, K, out)``.

        One forward pass over the batch and :math:`K` backward passes, as a hand-written KFAC computes them: the
        examples do not interact (the network is in eval mode), so the backward pass of output :math:`k` summed over
        the batch gives every example's own gradient. ``None`` when a selected layer does not run exactly once on
        ``(N, in)`` inputs (a shared layer, a sequence): the caller then takes per-example Jacobians.
        """
        inputs: dict[str, Tensor] = {}
        pre: dict[str, list[Tensor]] = {prefix: [] for prefix, _ in self._layers}

        def hook(module, args, out, key):
            inputs[key] = args[0].detach()
            if not out.requires_grad:  # the first selected layer: the graph starts at its pre-activation
                out = out.detach().requires_grad_()
            pre[key].append(out)
            return out

        hooks = [module.register_forward_hook(lambda mod, args, out, key=prefix: hook(mod, args, out, key))
                 for prefix, module in self._layers]
        try:
            with torch.enable_grad():
                outputs = self._outputs(self._theta_hat, x)
        finally:
            for h in hooks:
                h.remove()
        if any(len(t) != 1 or t[0].dim() != 2 or inputs[key].dim() != 2 for key, t in pre.items()):
            return None
        tensors = [pre[prefix][0] for prefix, _ in self._layers]
        num_outputs = outputs.shape[-1]
        rows: list[list[Tensor]] = [[] for _ in tensors]
        for k in range(num_outputs):
            seed = torch.zeros_like(outputs)
            seed[:, k] = 1.0
            grads = torch.autograd.grad(outputs, tensors, seed, retain_graph=k < num_outputs - 1, allow_unused=True)
            for row, g, t in zip(rows, grads, tensors):
                row.append(torch.zeros_like(t) if g is None else g)
        jac = {prefix: torch.stack(row, 1) for (prefix, _), row in zip(self._layers, rows)}
        layer_inputs = {key: torch.cat([a, torch.ones_like(a[:, :1])], -1) for key, a in inputs.items()}
        return layer_inputs, outputs.detach(), jac

    def _kron_factors(self, x: Tensor) -> dict[str, Tensor]:
        """``A:<layer>`` (sum of input outer products) and ``G:<layer>`` (sum, not yet divided by N)."""
        bias_names = [_join(prefix, "bias") for prefix, _ in self._layers]  # G needs only the bias Jacobians
        width = sum(self._theta_hat[name].numel() for name in bias_names)
        factors: dict[str, Tensor] = {}

        def add(key: str, value: Tensor) -> None:
            factors[key] = _wide(value) if key not in factors else factors[key] + _wide(value)

        for chunk in self._chunks(x.shape[0], width):
            got = self._bias_jacobians(x[chunk])
            if got is None:
                return self._kron_factors_per_example(x)
            inputs, outputs, jac = got
            with torch.no_grad():
                sqrt_lam = self._sqrt_output_hessian(outputs)
                for prefix, _ in self._layers:
                    v = (sqrt_lam.transpose(-1, -2) @ jac[prefix]).flatten(0, 1)  # (N K, out)
                    add(f"G:{prefix}", v.T @ v)
                    a = inputs[prefix]
                    add(f"A:{prefix}", a.T @ a)
        return factors

    def _kron_factors_per_example(self, x: Tensor) -> dict[str, Tensor]:
        """:meth:`_kron_factors` from per-example Jacobians of the biases (any layer structure)."""
        inputs = self._layer_inputs(x)
        g_factors: dict[str, float | Tensor] = {prefix: 0.0 for prefix, _ in self._layers}
        bias_names = [_join(prefix, "bias") for prefix, _ in self._layers]
        for jac, sqrt_lam in self._ggn_terms(x, bias_names):
            for prefix, _ in self._layers:
                # d f / d bias = d f / d pre-activation of the layer: B_n, shape (N, K, out).
                v = sqrt_lam.transpose(-1, -2) @ jac[_join(prefix, "bias")]
                g_factors[prefix] = g_factors[prefix] + _wide(torch.einsum("nko,nkp->op", v, v))
        factors = {}
        for prefix, _ in self._layers:
            a = inputs[prefix]
            factors[f"A:{prefix}"] = _wide(a.T @ a)
            factors[f"G:{prefix}"] = cast(Tensor, g_factors[prefix])  # a Tensor once a chunk of x is added
        return factors

    # ------------------------------------------------------------------ evidence
    def _data_eigenvalues(self) -> Tensor:
        return self._eig[0]

    def log_marginal_likelihood(self, prior_precision: float | Tensor | None = None) -> Tensor:
        """The Laplace evidence :math:`\\log p(\\mathcal D|\\delta)` (up to the :math:`2\\pi` terms that cancel)."""
        self._check_fitted()
        delta = torch.as_tensor(self.prior_precision if prior_precision is None else prior_precision)
        return log_evidence(*self._evidence_terms(), delta)

    def _evidence_terms(self) -> tuple[Tensor, Tensor, Tensor]:
        """:math:`\\log p(\\mathcal D|\\hat w)`, :math:`\\|\\hat w\\|^2` and the eigenvalues of
        :math:`H_{\\mathrm{data}}`: all the evidence needs."""
        sq_norm = cast(Tensor, sum(_wide(t).pow(2).sum() for t in self._theta_hat.values()))  # >= 1 weight
        return _wide(self._log_likelihood), sq_norm, self._data_eigenvalues()

    def optimize_prior_precision(self, grid: Tensor | None = None) -> float:
        """Set :math:`\\delta` to the maximiser of the evidence over ``grid`` (default :math:`10^{-4..6}`)."""
        self._check_fitted()
        if grid is None:
            grid = torch.logspace(-4, 6, 201, dtype=torch.float64)
        grid = torch.as_tensor(grid)
        if grid.dim() != 1 or not (grid > 0).all():
            raise ValueError("grid must be a 1-D tensor of positive prior precisions")
        evidence = self.log_marginal_likelihood(grid)
        self.prior_precision = float(grid[int(evidence.argmax())])
        return self.prior_precision

    def _check_fitted(self) -> None:
        if not self._fitted:
            raise RuntimeError("call fit(x, y) before using the Laplace approximation")

    # ------------------------------------------------------------------ posterior
    def functional_covariance(self, x: Tensor) -> Tensor:
        """:math:`J(x) H^{-1} J(x)^\\top` of the linearised network, shape ``(N, K, K)``.

        For ``"kron"`` no weight Jacobian is formed: a linear layer's Jacobian for output :math:`k` is the
        outer product :math:`J_{k} = b_k \\tilde a^\\top` of the output's gradient :math:`b_k` with respect to
        the layer's pre-activations and the layer's input :math:`\\tilde a`, so in the eigenbases
        :math:`Q_G, Q_A` of the factors (:math:`b' = Q_G^\\top b`, :math:`a' = Q_A^\\top \\tilde a`)

        .. math::

            [J \\Sigma J^\\top]_{kl} = \\sum_i b'_{k,i}\\, b'_{l,i} \\sum_j
            \\frac{a'^2_j}{\\lambda^G_i \\lambda^A_j + \\delta},

        which costs :math:`O(N(K d_o^2 + d_i^2 + d_i d_o))` per layer of :math:`d_i` inputs and :math:`d_o`
        outputs instead of the :math:`O(N K d_o d_i (d_i + d_o))` of projecting full Jacobians.
        """
        self._check_fitted()
        _check_data(x, None, self.likelihood)
        check_finite_batch(x, what="x")
        return self._functional_covariance(x)

    def _functional_covariance(self, x: Tensor) -> Tensor:
        if self.hessian_structure == "kron":
            return self._kron_functional_covariance(x)
        delta = self.prior_precision
        assert delta is not None  # set by fit
        covs = []
        for chunk in self._chunks(x.shape[0]):
            jac = {k: v.detach() for k, v in self._jacobian(x[chunk]).items()}
            j = self._flat_jacobian(jac)
            if self.hessian_structure == "diag":
                cov = torch.einsum("nkp,p,nlp->nkl", j, (1.0 / (self._eig[0] + delta)).to(j), j)
            else:
                evals, evecs = self._eig
                jq = j @ evecs.to(j)
                cov = torch.einsum("nkp,p,nlp->nkl", jq, (1.0 / (evals + delta)).to(j), jq)
            covs.append(cov)
        return torch.cat(covs)

    def _kron_functional_covariance(self, x: Tensor) -> Tensor:
        delta = self.prior_precision
        assert delta is not None  # set by fit
        bias_names = [_join(prefix, "bias") for prefix, _ in self._layers]
        width = sum(self._theta_hat[name].numel() for name in bias_names)
        covs = []
        for chunk in self._chunks(x.shape[0], width):
            xc = x[chunk]
            got = self._bias_jacobians(xc)  # d f / d bias = d f / d pre-activation: (N, K, out)
            if got is None:
                full = self._jacobian(xc, bias_names)
                jac = {prefix: full[_join(prefix, "bias")] for prefix, _ in self._layers}
                inputs = self._layer_inputs(xc)
            else:
                inputs, _, jac = got
            cov: float | Tensor = 0.0
            for prefix, eg, qg, ea, qa in self._kron:
                b = jac[prefix].detach()
                b = b @ qg.to(b)  # (N, K, out) in the eigenbasis of G
                a = inputs[prefix] @ qa.to(b)  # (N, in + 1) in the eigenbasis of A
                inv = (1.0 / (torch.outer(eg, ea) + delta)).to(b)  # (out, in + 1)
                weight = a.square() @ inv.T  # (N, out)
                cov = cov + torch.einsum("nki,ni,nli->nkl", b, weight, b)
            covs.append(cast(Tensor, cov))  # a Tensor: _kron has a factor pair per layer, >= 1 layer
        return torch.cat(covs)

    @torch.no_grad()
    def sample_weights(self, num_samples: int) -> dict[str, Tensor]:
        """Draw ``(S, *shape)`` weights from :math:`\\mathcal N(\\hat w, H^{-1})` for the selected subset."""
        self._check_fitted()
        delta = self.prior_precision
        assert delta is not None  # set by fit
        theta = self._theta_hat
        ref = next(iter(theta.values()))
        if self.hessian_structure == "kron":
            out = {}
            for prefix, eg, qg, ea, qa in self._kron:
                z = torch.randn(num_samples, eg.shape[0], ea.shape[0], dtype=eg.dtype, device=eg.device)
                noise = qg @ (z / torch.sqrt(torch.outer(eg, ea) + delta)) @ qa.T
                noise = noise.to(ref)
                out[_join(prefix, "weight")] = theta[_join(prefix, "weight")] + noise[..., :-1]
                out[_join(prefix, "bias")] = theta[_join(prefix, "bias")] + noise[..., -1]
            return out
        z = torch.randn(num_samples, self.num_params, dtype=self._eig[0].dtype, device=self._eig[0].device)
        if self.hessian_structure == "diag":
            noise = z / torch.sqrt(self._eig[0] + delta)
        else:
            evals, evecs = self._eig
            noise = (z / torch.sqrt(evals + delta)) @ evecs.T
        return {name: theta[name] + part for name, part in self._unflatten(noise.to(ref)).items()}

    def predict(
        self,
        x,
        *,
        pred_type: str = "glm",
        link_approx: str = "probit",
        num_samples: int = 100,
    ) -> Prediction:
        """The predictive distribution.

        :param x: inputs ``(N, ...)`` or a loader (its batches' ``x`` are used, one batch at a time on
            the network's device). Sampled predictives draw their ``S`` weights once for all batches,
            so a loader gives the same prediction as the concatenated tensors.
        :param str pred_type: ``"glm"`` (linearised network) or ``"nn"`` (sampled weights).
        :param str link_approx: for ``"glm"``: ``"probit"`` (closed form, ``S = 1``; for the Gaussian
            likelihood the mean's variance is added to the noise variance) or ``"mc"`` (``S`` weight draws
            pushed through the linearised network).
        :param int num_samples: ``S`` for Monte Carlo predictives.
        """
        self._check_fitted()
        _is_loader_arg(x)
        if pred_type not in ("glm", "nn"):
            raise ValueError(f"pred_type must be 'glm' or 'nn', got {pred_type!r}")
        if link_approx not in ("probit", "mc"):
            raise ValueError(f"link_approx must be 'probit' or 'mc', got {link_approx!r}")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        device, dtype = _module_device_dtype(self.net)
        is_loader = _is_loader_arg(x)
        batches = (_finite(xb, i if is_loader else None)
                   for i, xb in enumerate(_iter_inputs(x, device, dtype, self.likelihood)))
        if pred_type == "nn":
            samples = self.sample_weights(num_samples)
            with torch.no_grad():
                outputs = torch.cat([
                    torch.stack([self._outputs({k: v[s] for k, v in samples.items()}, xb) for s in range(num_samples)])
                    for xb in batches
                ], 1)
            return outputs_to_prediction(outputs, self.likelihood)
        if link_approx == "probit":
            means, variances = [], []
            for xb in batches:
                with torch.no_grad():
                    means.append(self._outputs(self._theta_hat, xb))
                variances.append(self._functional_covariance(xb).diagonal(dim1=-2, dim2=-1))
            mean, var = torch.cat(means), torch.cat(variances)
            if self.likelihood == "categorical":
                return ClassificationPrediction((mean / torch.sqrt(1 + math.pi / 8 * var)).softmax(-1).unsqueeze(0))
            loc, log_var = mean.unbind(-1)
            return RegressionPrediction(loc.unsqueeze(0), torch.sqrt(torch.exp(log_var) + var[..., 0]).unsqueeze(0))
        draws = self.sample_weights(num_samples)
        outputs = torch.cat([self._linearised_samples(xb, draws) for xb in batches], 1)
        return outputs_to_prediction(outputs, self.likelihood)

    def _linearised_samples(self, x: Tensor, draws: dict[str, Tensor]) -> Tensor:
        """Outputs of the linearised network :math:`f_{\\hat w}(x) + J(x)(w_s - \\hat w)` for weight draws
        :math:`w_s`, shape ``(S, N, K)``; the same draws for every input, so each sample is a smooth function."""
        with torch.no_grad():
            mean = self._outputs(self._theta_hat, x)
        num_samples = next(iter(draws.values())).shape[0]
        outputs = mean.expand(num_samples, *mean.shape).clone()
        for chunk in self._chunks(x.shape[0]):
            jac = self._jacobian(x[chunk])
            with torch.no_grad():
                for name in self._names:
                    delta = (draws[name] - self._theta_hat[name]).flatten(1)
                    outputs[:, chunk] += torch.einsum("nkp,sp->snk", jac[name].flatten(2), delta)
        return outputs

    # ------------------------------------------------------------------ checkpoints
    def _fitted_state(self) -> dict:
        state = {
            "config": {"subset": self.subset, "hessian_structure": self.hessian_structure, "curvature": self.curvature},
            "net": detached(self.net.state_dict()),
            "fitted": self._fitted,
            "prior_precision": None if self.prior_precision is None else float(self.prior_precision),
        }
        if self._fitted:
            state["posterior"] = {
                "log_likelihood": detached(self._log_likelihood),
                "num_outputs": self._num_outputs,
                "eig": [detached(t) for t in self._eig],
                "kron": [[prefix] + [detached(t) for t in rest] for prefix, *rest in getattr(self, "_kron", [])],
            }
        return state

    def _prepare_load(self, state: dict):
        config = {"subset": self.subset, "hessian_structure": self.hessian_structure, "curvature": self.curvature}
        if state.get("config") != config:
            raise ValueError(f"the checkpoint is of a Laplace with {state.get('config')}, this one has {config}")
        check_tensors(state.get("net"), self.net.state_dict(), "network weights")
        prior = state.get("prior_precision")
        if prior is not None and not (isinstance(prior, float) and prior > 0):
            raise ValueError(f"the checkpoint's prior_precision must be a positive float or None, got {prior!r}")
        fitted = state.get("fitted")
        posterior = state.get("posterior")
        if fitted not in (True, False) or (fitted and not isinstance(posterior, dict)):
            raise ValueError("the checkpoint's Laplace posterior is missing or malformed")
        if fitted:
            assert isinstance(posterior, dict)  # checked above
            eig, kron = posterior.get("eig"), posterior.get("kron")
            num_params = sum(self.net.get_parameter(name).numel() for name in self._names)
            if (not isinstance(eig, list) or not eig or not all(isinstance(t, Tensor) for t in eig)
                    or eig[0].shape != (num_params,) or not isinstance(kron, list)
                    or not isinstance(posterior.get("num_outputs"), int)
                    or not isinstance(posterior.get("log_likelihood"), Tensor)):
                raise ValueError(f"the checkpoint's Laplace posterior does not fit this network ({num_params} weights)")
            if self.hessian_structure == "kron" and [entry[0] if isinstance(entry, list) and entry else None
                                                     for entry in kron] != [prefix for prefix, _ in self._layers]:
                raise ValueError("the checkpoint's Kronecker factors do not match this network's layers")

        def apply():
            self.net.load_state_dict(state["net"])
            self.prior_precision = prior
            self._fitted = fitted
            if fitted:
                self.net.eval()
                self._hold_map()
                self._log_likelihood = posterior["log_likelihood"]
                self._num_outputs = posterior["num_outputs"]
                self._eig = tuple(posterior["eig"])
                self._kron = [tuple(entry) for entry in posterior["kron"]]

        return apply
