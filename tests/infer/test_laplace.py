# SPDX-License-Identifier: Apache-2.0
"""The Laplace approximation (``infer.laplace.Laplace``) on small problems."""

import math

import pytest
import torch

from pyro_sdebnn.infer import Laplace, MAPEstimate
from pyro_sdebnn.nn._mlp import make_mlp


@pytest.fixture(autouse=True)
def _one_thread():
    """These networks are tiny: one intra-op thread avoids oversubscribing the shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _blobs(n=64, spread=0.3):
    torch.manual_seed(0)
    y = torch.arange(n) % 2
    x = torch.randn(n, 2) * spread + (2.0 * y - 1.0).unsqueeze(-1)
    return x, y


def test_pyro_laplace_matches_own_exact_hessian_laplace():
    """Pyro's AutoLaplaceApproximation and Laplace(curvature="hessian") agree: N(w_map, (H_nll + I)^-1).

    A softmax regression (no hidden layer) has a positive semi-definite NLL Hessian, so our eigenvalue
    clipping at 0 is inactive and the two must agree to float32 round-off (~1e-4 relative, checked at 2e-3).
    """
    torch.manual_seed(0)
    y = torch.arange(48) % 3
    x = torch.randn(48, 2) + torch.stack([torch.cos(2.1 * y), torch.sin(2.1 * y)], -1)
    fit = MAPEstimate(make_mlp([2, 3]), "categorical").fit(x, y, num_epochs=300, lr=0.05, batch_size=None)
    posterior = fit.laplace_approximation(x, y).get_posterior()
    net = make_mlp([2, 3])
    net.load_state_dict({name.removeprefix("net."): value for name, value in fit.map_weights().items()})
    la = Laplace(net, "categorical", curvature="hessian", prior_precision=1.0)
    la.fit(x, y, num_epochs=0, tune_prior_precision=False)
    evals, evecs = la._eig
    ours = (evecs / (evals + 1.0)) @ evecs.T
    torch.testing.assert_close(posterior.covariance_matrix.double(), ours.double(), rtol=2e-3, atol=1e-5)


@pytest.mark.parametrize("subset", ["all", "last_layer"])
@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
def test_laplace_variance_grows_away_from_data(subset, structure):
    x, y = _blobs(spread=0.5)
    torch.manual_seed(0)
    la = Laplace(make_mlp([2, 16, 2]), "categorical", subset=subset, hessian_structure=structure)
    la.fit(x, y, num_epochs=60)
    near, far = torch.tensor([[1.0, 1.0], [-1.0, -1.0]]), torch.tensor([[12.0, -12.0], [-12.0, 12.0]])
    var_near = la.functional_covariance(near).diagonal(dim1=-2, dim2=-1).sum(-1)
    var_far = la.functional_covariance(far).diagonal(dim1=-2, dim2=-1).sum(-1)
    assert (var_far > 10 * var_near.max()).all()
    # The probit predictive keeps the MAP's decisions on the data and is a valid distribution.
    probs = la.predict(x).probs
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 64))
    assert (probs[0].argmax(-1) == y).float().mean() > 0.9


def _dense_categorical_ggn(net, x):
    """The flat weights, a function giving the output Jacobian at one input, and the categorical GGN
    sum_n J_n^T Lambda_n J_n assembled naively, one input at a time."""
    params = dict(net.named_parameters())
    names = list(params)
    flat = torch.cat([params[n].detach().reshape(-1) for n in names])

    def f(vec, xi):
        out, offset = {}, 0
        for n in names:
            out[n] = vec[offset : offset + params[n].numel()].reshape(params[n].shape)
            offset += params[n].numel()
        return torch.func.functional_call(net, out, (xi.unsqueeze(0),))[0]

    def jacobian(xi):
        return torch.autograd.functional.jacobian(lambda v: f(v, xi), flat)

    ggn = torch.zeros(len(flat), len(flat), dtype=flat.dtype)
    for xi in x:
        j = jacobian(xi)
        prob = f(flat, xi).softmax(-1).detach()
        ggn += j.T @ (torch.diag(prob) - torch.outer(prob, prob)) @ j
    return flat, jacobian, ggn


def test_laplace_full_ggn_matches_dense_construction():
    """The full GGN equals sum_n J_n^T Lambda_n J_n assembled naively (float64, exact)."""
    torch.manual_seed(0)
    x, y = torch.randn(7, 2, dtype=torch.float64), torch.randint(0, 3, (7,))
    net = make_mlp([2, 3, 3], "tanh", dtype=torch.float64)
    la = Laplace(net, "categorical", hessian_structure="full").fit(x, y, num_epochs=0, tune_prior_precision=False)
    evals, evecs = la._eig
    ggn = evecs @ torch.diag(evals) @ evecs.T
    flat, _, expected = _dense_categorical_ggn(net, x)
    torch.testing.assert_close(ggn, expected, atol=1e-10, rtol=1e-8)
    # The Laplace evidence, assembled directly: log p(D|w) - delta/2 |w|^2 + P/2 log delta - 1/2 log det(H + delta I).
    delta = 0.7
    log_lik = -torch.nn.functional.cross_entropy(net(x), y, reduction="sum")
    _, log_det = torch.linalg.slogdet(expected + delta * torch.eye(len(flat), dtype=torch.float64))
    evidence = log_lik - delta / 2 * flat.square().sum() + len(flat) / 2 * math.log(delta) - log_det / 2
    torch.testing.assert_close(la.log_marginal_likelihood(delta), evidence.detach())


def test_laplace_kron_equals_full_for_single_example_layer():
    """With one data point and one output, KFAC is exact for the last layer: G (x) A = J^T Lambda J."""
    torch.manual_seed(0)
    x, y = torch.randn(1, 3, dtype=torch.float64), torch.tensor([0.3], dtype=torch.float64)
    net = make_mlp([3, 4, 2], "tanh", dtype=torch.float64)
    kw = dict(subset="last_layer", likelihood="normal")
    full = Laplace(net, hessian_structure="full", **kw).fit(x, y, num_epochs=0, tune_prior_precision=False)
    kron = Laplace(net, hessian_structure="kron", **kw).fit(x, y, num_epochs=0, tune_prior_precision=False)
    x_test = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(full.functional_covariance(x_test), kron.functional_covariance(x_test))


def test_laplace_evidence_maximised_and_predictives_agree():
    x, y = _blobs(spread=0.6)
    torch.manual_seed(1)
    la = Laplace(make_mlp([2, 8, 2], "tanh"), "categorical", subset="last_layer").fit(x, y, num_epochs=80)
    best = la.log_marginal_likelihood()
    for factor in (0.5, 2.0):
        assert la.log_marginal_likelihood(la.prior_precision * factor) <= best
    # Linearised MC predictive agrees with the probit approximation: 4 MC standard errors of a mean of
    # S = 4000 probabilities (4 * 0.5 / sqrt(4000) = 0.032) plus the probit approximation's own error (<~0.02).
    probit = la.predict(x[:8]).mean_probs
    mc = la.predict(x[:8], link_approx="mc", num_samples=4000).mean_probs
    torch.testing.assert_close(mc, probit, atol=0.052, rtol=0)


def test_laplace_regression_and_hessian_curvature():
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 30).unsqueeze(-1)
    y = torch.sin(2 * x.squeeze(-1)) + 0.1 * torch.randn(30)
    la = Laplace(make_mlp([1, 8, 2], "tanh"), "normal", curvature="hessian").fit(x, y, num_epochs=100)
    pred = la.predict(torch.tensor([[0.0], [6.0]]))
    assert pred.loc.shape == (1, 2) and pred.scale[0, 1] > pred.scale[0, 0]
    sampled = la.predict(torch.tensor([[0.0], [6.0]]), pred_type="nn", num_samples=50)
    assert sampled.loc.shape == (50, 2)


def test_laplace_bad_arguments():
    with pytest.raises(ValueError, match="hessian_structure"):
        Laplace(make_mlp([2, 2]), hessian_structure="block")
    with pytest.raises(ValueError, match="curvature"):
        Laplace(make_mlp([2, 2]), hessian_structure="diag", curvature="hessian")
    with pytest.raises(ValueError, match="without bias"):
        Laplace(make_mlp([2, 2], bias=False), hessian_structure="kron")
    with pytest.raises(RuntimeError, match="fit"):
        Laplace(make_mlp([2, 2])).predict(torch.zeros(1, 2))


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
def test_laplace_linear_model_closed_form(structure):
    """For logits linear in the weights, f = W x + b, the Jacobian is known in closed form:
    d f_k / d W_kj = x_j, d f_k / d b_k = 1, so J Sigma J^T follows from Sigma exactly (float64)."""
    torch.manual_seed(0)
    x, y = torch.randn(30, 2, dtype=torch.float64), torch.randint(0, 3, (30,))
    net = make_mlp([2, 3], dtype=torch.float64)
    la = Laplace(net, "categorical", hessian_structure=structure).fit(x, y, num_epochs=20, tune_prior_precision=True)
    delta = la.prior_precision
    # Sigma over (W row-major, b) in the order of la._names = ["0.weight", "0.bias"].
    if structure == "full":
        evals, evecs = la._eig
        sigma = (evecs / (evals + delta)) @ evecs.T
    elif structure == "diag":
        sigma = torch.diag(1 / (la._eig[0] + delta))
    else:
        _, eg, qg, ea, qa = la._kron[0]
        q = torch.kron(qg, qa)  # row-major vec([W | b]) of shape (3, 3)
        sigma_aug = (q / (torch.outer(eg, ea).reshape(-1) + delta)) @ q.T
        perm = [o * 3 + i for o in range(3) for i in range(2)] + [o * 3 + 2 for o in range(3)]
        sigma = sigma_aug[perm][:, perm]
    x_test = torch.randn(4, 2, dtype=torch.float64)
    jac = torch.zeros(4, 3, 9, dtype=torch.float64)
    for k in range(3):
        jac[:, k, 2 * k : 2 * k + 2] = x_test
        jac[:, k, 6 + k] = 1.0
    expected = jac @ sigma @ jac.transpose(-1, -2)
    torch.testing.assert_close(la.functional_covariance(x_test), expected)
    # Linearised MC and weight sampling coincide for a linear model: same logit distribution. Two independent
    # means of S = 4000 probabilities differ by at most 4 standard errors: 4 * sqrt(2) * 0.5 / sqrt(4000) = 0.045.
    glm = la.predict(x_test, link_approx="mc", num_samples=4000).mean_probs
    sampled = la.predict(x_test, pred_type="nn", num_samples=4000).mean_probs
    torch.testing.assert_close(glm, sampled, atol=0.045, rtol=0)


def _linear_ggn_pieces(net, x):
    """Closed forms for the softmax regression f = W x + b, weights ordered (W row-major, b):
    per-example Jacobians J_n (d f_k / d W_kj = x_j, d f_k / d b_k = 1), Lambda_n = diag(p) - p p^T and the
    KFAC factors A = sum_n [x_n, 1][x_n, 1]^T, G = mean_n Lambda_n (B_n = I for a single layer)."""
    n, d = x.shape
    k = net[0].out_features
    jac = torch.zeros(n, k, k * d + k, dtype=x.dtype)
    for c in range(k):
        jac[:, c, d * c : d * (c + 1)] = x
        jac[:, c, k * d + c] = 1.0
    p = net(x).softmax(-1).detach()
    lam = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    ggn = torch.einsum("nkp,nkl,nlq->pq", jac, lam, jac)
    a_tilde = torch.cat([x, torch.ones(n, 1, dtype=x.dtype)], -1)
    # kron(G, A) is indexed by the row-major vec([W | b]); perm reorders it to (W row-major, b).
    perm = [o * (d + 1) + i for o in range(k) for i in range(d)] + [o * (d + 1) + d for o in range(k)]
    kfac = torch.kron(lam.mean(0), a_tilde.T @ a_tilde)[perm][:, perm]
    return ggn, kfac


def test_laplace_diag_and_kron_curvature_of_linear_model():
    """The diag curvature is the diagonal of the dense GGN; the KFAC factors equal their direct construction
    and, for a single example (where KFAC is exact), reproduce the dense GGN (float64, round-off only)."""
    torch.manual_seed(0)
    x, y = torch.randn(30, 2, dtype=torch.float64), torch.randint(0, 3, (30,))
    net = make_mlp([2, 3], dtype=torch.float64)
    kw = dict(num_epochs=0, tune_prior_precision=False)
    ggn, kfac = _linear_ggn_pieces(net, x)
    diag = Laplace(net, "categorical", hessian_structure="diag", prior_precision=1.0).fit(x, y, **kw)
    torch.testing.assert_close(diag._eig[0], ggn.diagonal(), atol=1e-10, rtol=1e-10)
    ggn_one, kfac_one = _linear_ggn_pieces(net, x[:1])
    torch.testing.assert_close(kfac_one, ggn_one)  # with one example, G (x) A = J^T Lambda J exactly
    for xs, ys, expected in [(x, y, kfac), (x[:1], y[:1], ggn_one)]:
        kron = Laplace(net, "categorical", hessian_structure="kron", prior_precision=1.0).fit(xs, ys, **kw)
        _, eg, qg, ea, qa = kron._kron[0]
        factors = torch.kron((qg * eg) @ qg.T, (qa * ea) @ qa.T)
        perm = [o * 3 + i for o in range(3) for i in range(2)] + [o * 3 + 2 for o in range(3)]
        torch.testing.assert_close(factors[perm][:, perm], expected, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
def test_laplace_sample_weights_have_the_posterior_covariance(structure):
    """Draws of sample_weights have mean w_map and covariance (H + delta I)^-1, with H the dense GGN ("full"),
    its diagonal ("diag") or G (x) A ("kron"), all built directly from the closed forms (float64)."""
    torch.manual_seed(0)
    x, y = torch.randn(30, 2, dtype=torch.float64), torch.randint(0, 3, (30,))
    net = make_mlp([2, 3], dtype=torch.float64)
    delta = 2.0
    la = Laplace(net, "categorical", hessian_structure=structure, prior_precision=delta)
    la.fit(x, y, num_epochs=0, tune_prior_precision=False)
    ggn, kfac = _linear_ggn_pieces(net, x)
    h_data = {"full": ggn, "diag": torch.diag(ggn.diagonal()), "kron": kfac}[structure]
    sigma = torch.linalg.inv(h_data + delta * torch.eye(9, dtype=torch.float64))
    n = 20_000
    torch.manual_seed(1)
    draws = la.sample_weights(n)
    w = torch.cat([draws["0.weight"].flatten(1), draws["0.bias"]], -1)
    w_map = torch.cat([net[0].weight.detach().flatten(), net[0].bias.detach()])
    # Gaussian sampling standard errors: sd(mean_i) = sqrt(Sigma_ii / n) and
    # sd(cov_ij) = sqrt((Sigma_ij^2 + Sigma_ii Sigma_jj) / n); 5 standard errors per entry
    # (45 distinct covariance entries: a false alarm has probability < 45 * 6e-7).
    var = sigma.diagonal()
    assert ((w.mean(0) - w_map).abs() <= 5 * (var / n).sqrt()).all()
    empirical = torch.cov(w.T, correction=0)
    se = ((sigma.square() + torch.outer(var, var)) / n).sqrt()
    assert ((empirical - sigma).abs() <= 5 * se).all(), ((empirical - sigma).abs() / se).max()


def test_laplace_kron_functional_covariance_of_deep_network():
    """The KFAC functional covariance (formed from layer inputs and pre-activation gradients, no weight Jacobian)
    equals J Sigma J^T with Sigma the block-diagonal inverse of G (x) A + delta I and J from autograd (float64)."""
    torch.manual_seed(0)
    x, y = torch.randn(20, 3, dtype=torch.float64), torch.randint(0, 3, (20,))
    net = make_mlp([3, 5, 4, 3], "tanh", dtype=torch.float64)
    la = Laplace(net, "categorical", hessian_structure="kron", prior_precision=0.5)
    la.fit(x, y, num_epochs=0, tune_prior_precision=False)
    blocks = []
    for _, eg, qg, ea, qa in la._kron:
        q = torch.kron(qg, qa)  # row-major vec([W | b])
        blocks.append((q / (torch.outer(eg, ea).reshape(-1) + 0.5)) @ q.T)
    sigma = torch.block_diag(*blocks)
    x_test = torch.randn(6, 3, dtype=torch.float64)
    rows = []
    for xi in x_test:
        jac = torch.autograd.functional.jacobian(
            lambda *ws: torch.func.functional_call(net, dict(zip([n for n, _ in net.named_parameters()], ws)),
                                                   (xi.unsqueeze(0),))[0],
            tuple(p.detach() for p in net.parameters()))
        per_layer = [torch.cat([jw, jb.unsqueeze(-1)], -1).flatten(1) for jw, jb in zip(jac[::2], jac[1::2])]
        rows.append(torch.cat(per_layer, -1))
    j = torch.stack(rows)
    torch.testing.assert_close(la.functional_covariance(x_test), j @ sigma @ j.transpose(-1, -2))


def test_laplace_full_refuses_what_does_not_fit(monkeypatch):
    """Full Laplace estimates P^2 (bytes + 32) before any work and refuses with the size and the alternatives."""
    import pyro_sdebnn.infer.laplace as laplace_module

    x, y = _blobs(16)
    net = make_mlp([2, 16, 2])
    before = {k: v.clone() for k, v in net.state_dict().items()}
    la = Laplace(net, "categorical", hessian_structure="full")
    p = la.num_params
    assert la.full_curvature_bytes() == p**2 * (4 + 32)
    monkeypatch.setattr(laplace_module, "_available_memory", lambda device: la.full_curvature_bytes() - 1)
    expected = rf"P = {p} weights needs about .* GiB.*'kron'.*subset='last_layer' \(P = 34\)"
    with pytest.raises(MemoryError, match=expected):
        la.fit(x, y, num_epochs=3)
    for k, v in net.state_dict().items():  # refused before the MAP training
        torch.testing.assert_close(v, before[k])
    Laplace(net, "categorical", hessian_structure="kron").fit(x, y, num_epochs=0)  # the alternative runs
    monkeypatch.setattr(laplace_module, "_available_memory", lambda device: la.full_curvature_bytes())
    la.fit(x, y, num_epochs=0)
    assert la.num_params == p


def test_laplace_online_marglik_segments_continue_the_same_training():
    """With a vanishing hyper-step the online schedule (training in segments between the evidence updates) is the
    plain MAP training with weight decay delta_0 / N: the optimiser's state goes on across the segments."""
    x, y = _blobs(32)
    torch.manual_seed(3)
    plain = Laplace(make_mlp([2, 8, 2], dtype=torch.float64), "categorical", hessian_structure="kron")
    online = Laplace(make_mlp([2, 8, 2], dtype=torch.float64), "categorical", hessian_structure="kron")
    online.net.load_state_dict(plain.net.state_dict())
    x = x.double()
    torch.manual_seed(4)
    plain.fit(x, y, num_epochs=12, batch_size=8, weight_decay=0.05, tune_prior_precision="posthoc")
    torch.manual_seed(4)
    online.fit(x, y, num_epochs=12, batch_size=8, weight_decay=0.05, tune_prior_precision="online",
               marglik_burnin=2, marglik_frequency=3, marglik_steps=2, marglik_lr=1e-12)
    assert [e for e, _ in online.online_prior_precisions] == [3, 6, 9]
    for name, value in plain.net.state_dict().items():
        torch.testing.assert_close(online.net.state_dict()[name], value, rtol=1e-9, atol=1e-12)
    assert online.losses == pytest.approx(plain.losses, rel=1e-9)


def test_laplace_online_marglik_reaches_the_joint_optimum():
    """Online training (Immer et al. 2021) ends where the weights are the MAP under the learned prior precision
    delta (weight decay delta / N) and delta maximises the Laplace evidence of those weights: checked on a softmax
    regression (convex), against L-BFGS at that delta and the evidence's maximiser on a fine grid."""
    torch.manual_seed(0)
    y = torch.arange(40) % 3
    x = (torch.randn(40, 2) + 1.5 * torch.stack([torch.cos(2.1 * y), torch.sin(2.1 * y)], -1)).double()
    la = Laplace(make_mlp([2, 3], dtype=torch.float64), "categorical", hessian_structure="kron")
    la.fit(x, y, num_epochs=300, lr=0.05, batch_size=None, weight_decay=1e-3, tune_prior_precision="online",
           marglik_burnin=0, marglik_frequency=15, marglik_steps=50)
    epoch, delta = la.online_prior_precisions[-1]
    assert epoch == 285 and delta != pytest.approx(40 * 1e-3, rel=0.5)  # delta moved from its start
    assert la._train_state["trainer"]["optimizer"]["param_groups"][0]["weight_decay"] == pytest.approx(delta / 40)
    # the weights minimise sum NLL + delta / 2 |w|^2 (to Adam's tolerance, as in test_map_recovers_...)
    w = torch.zeros(3, 2, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, tolerance_grad=1e-10, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w.T + b, y, reduction="sum")
        loss = loss + delta / 2 * (w.square().sum() + b.square().sum())
        loss.backward()
        return loss

    opt.step(closure)
    torch.testing.assert_close(la.net[0].weight.detach(), w.detach(), atol=2e-2, rtol=1e-2)
    # delta maximises the evidence of the final network (the last update was 15 epochs before the end)
    grid = torch.logspace(math.log10(delta) - 1, math.log10(delta) + 1, 2001, dtype=torch.float64)
    best = float(grid[la.log_marginal_likelihood(grid).argmax()])
    assert best == pytest.approx(delta, rel=0.05)
    # the final post-hoc maximisation, on the default grid (201 points over 10 decades: half a step is 10^0.025)
    assert abs(math.log10(la.prior_precision / best)) <= 0.025 + 1e-9


def test_laplace_online_marglik_bad_arguments():
    x, y = _blobs(16)
    la = Laplace(make_mlp([2, 4, 2]), "categorical")
    with pytest.raises(ValueError, match="tune_prior_precision"):
        la.fit(x, y, num_epochs=1, tune_prior_precision="grid")
    with pytest.raises(ValueError, match="marglik_frequency"):
        la.fit(x, y, num_epochs=1, tune_prior_precision="online", marglik_frequency=0)
    with pytest.raises(ValueError, match="marglik_lr"):
        la.fit(x, y, num_epochs=1, tune_prior_precision="online", marglik_lr=0.0)
    la.fit(x, y, num_epochs=1, tune_prior_precision="posthoc")
    with pytest.raises(ValueError, match="continues a run fitted online"):
        la.fit(x, y, num_epochs=1, tune_prior_precision="online", resume=True)


def test_laplace_rejects_non_finite_data():
    """A NaN or an infinity in the data is named (argument, index, batch) before it reaches the training."""
    from torch.utils.data import DataLoader, TensorDataset

    x, y = _blobs(16)
    bad = x.clone()
    bad[5, 1] = float("nan")
    with pytest.raises(ValueError, match=r"x contains NaN at index \(5, 1\) \(1 non-finite"):
        Laplace(make_mlp([2, 4, 2]), "categorical").fit(bad, y, num_epochs=3)
    targets = torch.randn(16, dtype=torch.float64)
    targets[2] = float("inf")
    with pytest.raises(ValueError, match=r"y contains Inf at index \(2,\)"):
        Laplace(make_mlp([2, 4, 2], dtype=torch.float64), "normal").fit(x.double(), targets, num_epochs=3)
    loader = DataLoader(TensorDataset(bad, y), batch_size=4)  # row 5 is row 1 of batch 1
    with pytest.raises(ValueError, match=r"x contains NaN at index \(1, 1\) of batch 1 of the loader"):
        Laplace(make_mlp([2, 4, 2]), "categorical", hessian_structure="kron").fit(loader, num_epochs=0)
    la = Laplace(make_mlp([2, 4, 2]), "categorical", hessian_structure="diag").fit(x, y, num_epochs=2)
    inf = x[:3].clone()
    inf[1, 0] = float("-inf")
    for call in (lambda: la.predict(inf), lambda: la.predict(inf, pred_type="nn"),
                 lambda: la.functional_covariance(inf)):
        with pytest.raises(ValueError, match=r"x contains Inf at index \(1, 0\)"):
            call()
    with pytest.raises(ValueError, match=r"x contains Inf at index \(1, 0\) of batch 2 of the loader"):
        la.predict(DataLoader(TensorDataset(torch.cat([x[:6], inf]), y[:9]), batch_size=3))


def test_laplace_online_marglik_resumes_exactly(tmp_path):
    """fit(k) + save + load + fit(K - k, resume=True) equals fit(K) with online tuning, an update falling on k."""
    x, y = _blobs(32)
    x = x.double()
    kw = dict(batch_size=8, tune_prior_precision="online", marglik_burnin=2, marglik_frequency=3, marglik_steps=5)
    torch.manual_seed(7)
    net = make_mlp([2, 8, 2], dtype=torch.float64)
    start = {k: v.clone() for k, v in net.state_dict().items()}
    whole = Laplace(net, "categorical", hessian_structure="kron").fit(x, y, num_epochs=10, **kw)
    torch.manual_seed(7)
    net = make_mlp([2, 8, 2], dtype=torch.float64)
    net.load_state_dict(start)
    Laplace(net, "categorical", hessian_structure="kron").fit(x, y, num_epochs=6, **kw).save(tmp_path / "la.pt")
    resumed = Laplace(make_mlp([2, 8, 2], dtype=torch.float64), "categorical", hessian_structure="kron")
    resumed.load(tmp_path / "la.pt").fit(x, y, num_epochs=4, resume=True, **kw)
    assert [e for e, _ in resumed.online_prior_precisions] == [6, 9]
    assert [e for e, _ in whole.online_prior_precisions] == [3, 6, 9]
    assert resumed.online_prior_precisions[-1][1] == pytest.approx(whole.online_prior_precisions[-1][1], rel=1e-12)
    for name, value in whole.net.state_dict().items():
        torch.testing.assert_close(resumed.net.state_dict()[name], value, rtol=1e-12, atol=1e-14)
    assert resumed.prior_precision == whole.prior_precision


def test_laplace_kron_factors_from_one_batched_backward_pass(monkeypatch):
    """KFAC's factors and predictive come from one forward and K backward passes per batch, not from per-example
    Jacobians, and equal the factors built from per-example autograd Jacobians (a 3-layer MLP, a loader of three
    batches, float64): A = sum_n [a_n, 1][a_n, 1]^T and G = sum_n B_n^T Lambda_n B_n, B_n = d f / d bias."""
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x, y = torch.randn(25, 3, dtype=torch.float64), torch.randint(0, 3, (25,))
    net = make_mlp([3, 5, 4, 3], "tanh", dtype=torch.float64)
    loader = DataLoader(TensorDataset(x, y), batch_size=10)

    def no_per_example_jacobian(self, *args, **kwargs):
        raise AssertionError("per-example Jacobians taken")

    monkeypatch.setattr(Laplace, "_jacobian", no_per_example_jacobian)
    la = Laplace(net, "categorical", hessian_structure="kron", prior_precision=0.5)
    la.fit(loader, num_epochs=0, tune_prior_precision=False)
    assert la.predict(x[:4]).probs.shape == (1, 4, 3)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    a_factors = [torch.zeros(m.in_features + 1, m.in_features + 1, dtype=torch.float64) for m in linears]
    g_factors = [torch.zeros(m.out_features, m.out_features, dtype=torch.float64) for m in linears]
    for xi in x:
        h, inputs = xi.unsqueeze(0), []
        for m in net:
            if isinstance(m, torch.nn.Linear):
                inputs.append(torch.cat([h[0], torch.ones(1, dtype=h.dtype)]))
            h = m(h)
        p = h[0].softmax(-1).detach()
        lam = torch.diag(p) - torch.outer(p, p)
        biases = tuple(m.bias.detach() for m in linears)
        names = [f"{i}.bias" for i, m in enumerate(net) if isinstance(m, torch.nn.Linear)]
        jac = torch.autograd.functional.jacobian(
            lambda *bs: torch.func.functional_call(net, dict(zip(names, bs)), (xi.unsqueeze(0),))[0], biases)
        for i, (a, b) in enumerate(zip(inputs, jac)):
            a_factors[i] += torch.outer(a, a).detach()
            g_factors[i] += b.T @ lam @ b
    for (_, eg, qg, ea, qa), a_factor, g_factor in zip(la._kron, a_factors, g_factors):
        torch.testing.assert_close((qa * ea) @ qa.T, a_factor)
        torch.testing.assert_close((qg * eg) @ qg.T, g_factor / len(x))


def test_laplace_kron_of_a_shared_layer_takes_per_example_jacobians(monkeypatch):
    """A linear layer applied twice per forward pass has no single pre-activation per example: the KFAC fit and
    predictive then take per-example Jacobians, exactly as when the batched pass is switched off."""

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(3, 3)
            self.head = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.head(torch.tanh(self.inner(torch.tanh(self.inner(x)))))

    torch.manual_seed(0)
    x, y = torch.randn(12, 3, dtype=torch.float64), torch.randint(0, 2, (12,))
    net = Twice().double()
    fits, covariances = [], []
    for batched in (True, False):
        if not batched:
            monkeypatch.setattr(Laplace, "_bias_jacobians", lambda self, x: None)
        la = Laplace(net, "categorical", hessian_structure="kron", prior_precision=1.0)
        fits.append(la.fit(x, y, num_epochs=0, tune_prior_precision=False))
        covariances.append(la.functional_covariance(x))
    for first, second in zip(fits[0]._kron, fits[1]._kron):
        for t, u in zip(first[1:], second[1:]):
            torch.testing.assert_close(t, u, rtol=0, atol=0)
    torch.testing.assert_close(covariances[0], covariances[1], rtol=0, atol=0)


def test_laplace_full_ggn_of_few_points_skips_the_full_eigendecomposition(monkeypatch):
    """With n K <= P / 2 the full GGN (rank <= n K) is decomposed on its range, without a P x P ``eigh``: the
    eigenvectors stay orthonormal, reconstruct the GGN assembled naively, and the evidence and the linearised
    covariance equal those of (H + delta I)^-1 formed directly (float64)."""
    torch.manual_seed(0)
    x, y = torch.randn(7, 2, dtype=torch.float64), torch.randint(0, 3, (7,))
    net = make_mlp([2, 8, 3], "tanh", dtype=torch.float64)  # P = 51 >= 2 * 7 * 3
    sizes = []
    eigh = torch.linalg.eigh

    def spy(a, *args, **kwargs):
        sizes.append(a.shape[-1])
        return eigh(a, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "eigh", spy)
    delta = 0.3
    la = Laplace(net, "categorical", hessian_structure="full", prior_precision=delta)
    la.fit(x, y, num_epochs=0, tune_prior_precision=False)
    p = la.num_params
    assert p == 51 and p not in sizes
    flat, jacobian, expected = _dense_categorical_ggn(net, x)
    evals, evecs = la._eig
    torch.testing.assert_close(evecs.T @ evecs, torch.eye(p, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(evecs @ torch.diag(evals) @ evecs.T, expected, atol=1e-10, rtol=1e-8)
    sigma = torch.linalg.inv(expected + delta * torch.eye(p, dtype=torch.float64))
    x_test = torch.randn(4, 2, dtype=torch.float64)
    j_test = torch.stack([jacobian(xi) for xi in x_test])
    torch.testing.assert_close(la.functional_covariance(x_test), j_test @ sigma @ j_test.transpose(-1, -2))
    log_lik = -torch.nn.functional.cross_entropy(net(x), y, reduction="sum")
    _, log_det = torch.linalg.slogdet(expected + delta * torch.eye(p, dtype=torch.float64))
    evidence = log_lik - delta / 2 * flat.square().sum() + p / 2 * math.log(delta) - log_det / 2
    torch.testing.assert_close(la.log_marginal_likelihood(delta), evidence.detach())
