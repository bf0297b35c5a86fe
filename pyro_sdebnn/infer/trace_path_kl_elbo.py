# SPDX-License-Identifier: Apache-2.0
"""``TracePathKL_ELBO``: Trace_ELBO with path-space KL estimators for neural-SDE guided ``OUPath`` sites."""

from __future__ import annotations

import math

import torch
from pyro import poutine
from pyro.infer import Trace_ELBO
from pyro.infer.util import is_identically_zero, is_validation_enabled, torch_item
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import prune_subsample_sites, site_is_subsample
from pyro.util import check_if_enumerated, check_model_guide_match, check_site_shape

from pyro_sdebnn.distributions import OUPath
from pyro_sdebnn.infer.neural_sde_guide import NeuralSDEPath
from pyro_sdebnn.ops.path_kl import check_estimator

__all__ = ["TracePathKL_ELBO"]


class _EstimatorMessenger(Messenger):
    """Makes every :class:`NeuralSDEPath` sampled in the guide compute the ELBO's KL estimator."""

    def __init__(self, estimator: str) -> None:
        super().__init__()
        self.estimator = estimator

    def _process_message(self, msg) -> None:
        if msg["type"] == "sample" and isinstance(msg["fn"], NeuralSDEPath) and msg["value"] is None:
            msg["fn"] = msg["fn"].with_estimator(self.estimator)


class TracePathKL_ELBO(Trace_ELBO):
    """Trace ELBO with a path-space KL estimator for ``OUPath`` sites guided by a ``NeuralSDEPath``.

    For every ``OUPath`` prior site guided by a ``NeuralSDEPath``, :math:`\\log p(w) - \\log q(w)` of
    :class:`~pyro.infer.Trace_ELBO` becomes :math:`-\\kappa\\,\\widehat{\\mathrm{KL}}(q\\|p)` along the sampled path
    (Girsanov's theorem, [1] Sec. 3.1, [3], on the Euler grid, :math:`u_k = (f_q - f_p)(w_k, t_k)/\\sigma`):

    .. math::

        \\mathrm{ELBO} = \\frac{N}{b}\\sum_{i \\in \\text{batch}} \\log p(y_i \\mid x_i, w_\\cdot)
        - \\kappa \\sum_k \\Big(\\tfrac12 |u_k|^2 \\Delta t_k \\,[+ v_k \\cdot \\Delta B_k]\\Big),

    with :math:`v = u` (``"full_mc"``, the exact Euler log-ratio), :math:`v = u(\\cdot; \\mathrm{sg}(\\phi))`
    (``"stl"``, sticking the landing [2]: zero gradient variance at the true posterior) or no :math:`v` term
    (``"analytic"``). The prior must use ``method="euler"`` on the guide's grid and start where the guide path starts
    (checked under validation); a non-finite loss is a ``ValueError``. :doc:`/methods/sdebnn` explains it all.

    :param int num_particles: as in ``Trace_ELBO``.
    :param int max_plate_nesting: as in ``Trace_ELBO``.
    :param bool vectorize_particles: as in ``Trace_ELBO``.
    :param str estimator: ``"stl"`` (default), ``"analytic"`` or ``"full_mc"``.
    :param float kl_scale: :math:`\\kappa \\ge 0`.

    **References**

    1. W. Xu, R. T. Q. Chen, X. Li, D. Duvenaud (2022). Infinitely Deep Bayesian Neural Networks with
       Stochastic Differential Equations. AISTATS 2022, PMLR 151. arXiv:2102.06559 (Sec. 3.1, App. A).
    2. G. Roeder, Y. Wu, D. Duvenaud (2017). Sticking the Landing: Simple, Lower-Variance Gradient
       Estimators for Variational Inference. NeurIPS 2017. arXiv:1703.09194.
    3. X. Li, T.-K. L. Wong, R. T. Q. Chen, D. Duvenaud (2020). Scalable Gradients for Stochastic
       Differential Equations. AISTATS 2020. arXiv:2001.01328.

    >>> from pyro_sdebnn.infer import NeuralSDEGuide
    >>> def model():
    ...     w = pyro.sample("w", OUPath(torch.zeros(2), 0.5, torch.linspace(0, 1, 5), method="euler"))
    ...     pyro.sample("y", pyro.distributions.Normal(w[-1].sum(), 1.0), obs=torch.tensor(1.0))
    >>> svi = pyro.infer.SVI(model, NeuralSDEGuide(model, drift_hidden=8), pyro.optim.Adam({"lr": 1e-2}),
    ...                      TracePathKL_ELBO(estimator="stl"))
    >>> isinstance(svi.step(), float)
    True
    """

    def __init__(self, num_particles: int = 1, max_plate_nesting: float = float("inf"),
                 vectorize_particles: bool = False, *, estimator: str = "stl", kl_scale: float = 1.0,
                 **kwargs) -> None:
        super().__init__(num_particles=num_particles, max_plate_nesting=max_plate_nesting,
                         vectorize_particles=vectorize_particles, **kwargs)
        self.estimator = check_estimator(estimator)
        if not (isinstance(kl_scale, (int, float)) and kl_scale >= 0 and math.isfinite(kl_scale)):
            raise ValueError(f"kl_scale must be a finite float >= 0, got {kl_scale!r}")
        self.kl_scale = float(kl_scale)
        self._calls = 0

    def _get_trace(self, model, guide, args, kwargs):
        """Pyro's :func:`~pyro.infer.enum.get_importance_trace` (the trace pair of ``Trace_ELBO``), except
        that the path sites' densities are not evaluated: their term :math:`\\log p - \\log q` is replaced
        by the path-KL estimate, so ``OUPath.log_prob`` and ``NeuralSDEPath.log_prob`` (a pass over the whole
        ``(..., K, D)`` path each, and their backward) would be computed for nothing. Every other site gets
        its ``log_prob`` / ``score_parts`` and the same validation checks as in ``Trace_ELBO``; the path
        sites' shapes are checked against their batch shapes."""
        guide = _EstimatorMessenger(self.estimator)(guide)
        if isinstance(poutine.unwrap(guide), poutine.messenger.Messenger):  # a GuideMessenger: no path sites
            return super()._get_trace(model, guide, args, kwargs)
        guide_trace = poutine.trace(guide, graph_type="flat").get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace), graph_type="flat").get_trace(
            *args, **kwargs)
        validate = is_validation_enabled()
        if validate:
            check_model_guide_match(model_trace, guide_trace, self.max_plate_nesting)
        guide_trace = prune_subsample_sites(guide_trace)
        model_trace = prune_subsample_sites(model_trace)
        paths = self._path_sites(model_trace, guide_trace)
        model_trace.compute_log_prob(site_filter=lambda name, site: name not in paths)
        for name in paths:  # compute_score_parts skips sites that have them; the marker is removed at once
            guide_trace.nodes[name]["score_parts"] = None
        guide_trace.compute_score_parts()
        for name in paths:
            del guide_trace.nodes[name]["score_parts"]
        if validate:
            for trace in (model_trace, guide_trace):
                for name, site in trace.nodes.items():
                    if site["type"] != "sample":
                        continue
                    if name in paths:  # check_site_shape reads the shape of log_prob: the site's batch shape
                        value, fn = site["value"], site["fn"]
                        batch = value.shape[:value.dim() - len(fn.event_shape)]
                        site = {**site, "log_prob": value.new_empty(()).expand(batch)}
                    check_site_shape(site, self.max_plate_nesting)
            check_if_enumerated(guide_trace)
        return model_trace, guide_trace

    def _get_traces(self, model, guide, args, kwargs):
        # every loss / differentiable_loss / loss_and_grads call draws its particles from one _get_traces
        self._calls += 1
        yield from super()._get_traces(model, guide, args, kwargs)

    @staticmethod
    def _path_sites(model_trace, guide_trace) -> set[str]:
        for name, site in model_trace.nodes.items():
            if (site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
                    and name not in guide_trace.nodes):
                raise ValueError(f"TracePathKL_ELBO: latent model site {name!r} has no guide site "
                                 "(NeuralSDEGuide guides OUPath sites only; add a guide for it)")
        names = set()
        for name, site in guide_trace.nodes.items():
            if site["type"] == "sample" and isinstance(site["fn"], NeuralSDEPath):
                prior = model_trace.nodes.get(name, {}).get("fn")
                if not isinstance(prior, OUPath):
                    raise ValueError(f"TracePathKL_ELBO: guide site {name!r} is a NeuralSDEPath but the model's prior "
                                     f"is {type(prior).__name__}, expected OUPath")
                if is_validation_enabled():
                    q = site["fn"]
                    if prior.method != "euler" or prior.times.shape != q.times.shape or not torch.equal(
                            prior.times, q.times):
                        raise ValueError(f"TracePathKL_ELBO: site {name!r}: the OUPath prior must use method='euler' "
                                         "on the guide's time grid")
                    if not torch.equal(*torch.broadcast_tensors(prior.init.detach(), q.init.detach())):
                        raise ValueError(f"TracePathKL_ELBO: site {name!r}: the guide path does not start where the "
                                         "prior's path starts (init differs): the path KL would be that of two "
                                         "processes with different initial states")
                names.add(name)
        return names

    def _differentiable_loss_particle(self, model_trace, guide_trace):
        paths = self._path_sites(model_trace, guide_trace)
        surrogate = 0.0
        for name, site in model_trace.nodes.items():
            if site["type"] == "sample" and name not in paths:
                surrogate = surrogate + site["log_prob_sum"]
        for name, site in guide_trace.nodes.items():
            if site["type"] != "sample" or name in paths:
                continue
            _, score_function_term, entropy_term = site["score_parts"]
            if not is_identically_zero(score_function_term):
                raise NotImplementedError(f"TracePathKL_ELBO supports reparameterised guide sites only (site {name!r})")
            if not is_identically_zero(entropy_term):
                surrogate = surrogate - entropy_term.sum()
        kl_total = 0.0
        for name in paths:
            site = guide_trace.nodes[name]
            kl = site["fn"].path_kl(site["value"], self.estimator) * site["scale"]
            kl_total = kl_total + kl.sum()
        elbo_without_kl = surrogate
        surrogate = surrogate - self.kl_scale * kl_total
        loss = -torch_item(surrogate)
        if not math.isfinite(loss):  # checked per particle, before any backward pass
            raise ValueError(f"TracePathKL_ELBO: non-finite loss {loss} at call {self._calls} (log-likelihood and "
                             f"other sites {torch_item(elbo_without_kl)}, path KL {torch_item(kl_total)}): lower the "
                             "learning rate, dt or sigma")
        return loss, -surrogate

    # differentiable_loss and loss_and_grads are Trace_ELBO's, on top of _differentiable_loss_particle;
    # Trace_ELBO.loss sums log p - log q directly, so it is replaced by the mean particle loss
    def loss(self, model, guide, *args, **kwargs) -> float:
        loss = 0.0
        with torch.no_grad():
            for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
                loss += self._differentiable_loss_particle(model_trace, guide_trace)[0] / self.num_particles
        return loss
