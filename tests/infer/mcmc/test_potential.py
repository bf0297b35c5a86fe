# SPDX-License-Identifier: Apache-2.0
"""Likelihood terms beyond one data plate: several subsampled data plates (each scaled by its own N/b), factors and
observations outside the data plates (full-data terms), data validated at set-up, local latent variables."""

import pyro
import pyro.contrib.gp as gp
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.nn import PyroModule, PyroSample

from pyro_sdebnn.infer.mcmc import SGLD
from pyro_sdebnn.infer.mcmc.functional import FunctionalPotential
from pyro_sdebnn.infer.mcmc.potential import MinibatchPotential

N1, N2, NOISE, PRIOR = 200, 120, 0.5, 10.0


def two_plates(x1, y1, x2, y2):
    w = pyro.sample("w", dist.Normal(0.0, PRIOR))
    b = pyro.sample("b", dist.Normal(0.0, PRIOR))
    with pyro.plate("d1", x1.shape[0]) as i:
        pyro.sample("y1", dist.Normal(w * x1[i], NOISE), obs=y1[i])
    with pyro.plate("d2", x2.shape[0]) as j:
        pyro.sample("y2", dist.Normal(w * x2[j] + b, NOISE), obs=y2[j])


def with_factor(x, y):
    w = pyro.sample("w", dist.Normal(0.0, PRIOR))
    pyro.factor("penalty", -1.5 * w**2)
    with pyro.plate("data", x.shape[0]) as i:
        pyro.sample("y", dist.Normal(w * x[i], NOISE), obs=y[i])


def simple(x, y):
    w = pyro.sample("w", dist.Normal(0.0, PRIOR))
    with pyro.plate("data", x.shape[0]) as i:
        pyro.sample("y", dist.Normal(w * x[i], NOISE), obs=y[i])


def _data():
    g = torch.Generator().manual_seed(0)
    x1 = torch.randn(N1, generator=g, dtype=torch.float64)
    y1 = 2.0 * x1 + NOISE * torch.randn(N1, generator=g, dtype=torch.float64)
    x2 = torch.randn(N2, generator=g, dtype=torch.float64)
    # the second data set disagrees with the first about w: the posterior weighs them by their sizes
    y2 = -1.0 * x2 + 1.0 + NOISE * torch.randn(N2, generator=g, dtype=torch.float64)
    return x1, y1, x2, y2


def _normal_sum(value, loc, scale):
    return dist.Normal(loc, scale).log_prob(value).sum()


def _two_plate_potential(w, b, data, i1, i2):
    x1, y1, x2, y2 = data
    n1 = N1 / len(i1) if i1 is not None else 1.0
    n2 = N2 / len(i2) if i2 is not None else 1.0
    i1 = slice(None) if i1 is None else i1
    i2 = slice(None) if i2 is None else i2
    log_p = n1 * _normal_sum(y1[i1], w * x1[i1], NOISE) + n2 * _normal_sum(y2[i2], w * x2[i2] + b, NOISE)
    return -(log_p + _normal_sum(w, 0.0, PRIOR) + _normal_sum(b, 0.0, PRIOR))


# ----- several data plates ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("subsample_size, b1, b2", [(20, 20, 20), ({"d1": 40, "d2": 12}, 40, 12)])
def test_each_data_plate_is_scaled_by_its_own_n_over_b(subsample_size, b1, b2):
    data = _data()
    U = MinibatchPotential(two_plates, data, subsample_size=subsample_size)
    assert U.data_plates == ("d1", "d2")
    assert U.data_sizes == {"d1": N1, "d2": N2}
    assert U.subsample_sizes == {"d1": b1, "d2": b2}
    i1, i2 = torch.arange(5, 5 + b1), torch.arange(b2).flip(0)
    w, b = torch.tensor(1.3, dtype=torch.float64), torch.tensor(-0.4, dtype=torch.float64)
    flat = U.pack({"w": w, "b": b})
    idx = U.join_indices({"d1": i1, "d2": i2})
    torch.testing.assert_close(idx, torch.cat([i1, i2]))
    torch.testing.assert_close(U(flat, idx), _two_plate_potential(w, b, data, i1, i2))


def test_a_data_plate_left_out_of_the_subsample_dict_is_full_batch():
    data = _data()
    U = MinibatchPotential(two_plates, data, subsample_size={"d1": 25})
    assert U.subsample_sizes == {"d1": 25}
    i1 = torch.arange(25)
    w, b = torch.tensor(0.3, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64)
    torch.testing.assert_close(U(U.pack({"w": w, "b": b}), i1), _two_plate_potential(w, b, data, i1, None))


@pytest.mark.parametrize("data_plate", ["d1", ("d1",)])
def test_named_data_plate_among_several_keeps_the_others_full(data_plate):
    # used to crash in the subsampling check with "RuntimeError: generator raised StopIteration"
    data = _data()
    U = MinibatchPotential(two_plates, data, subsample_size=20, data_plate=data_plate)
    assert U.data_plates == ("d1",) and U.data_plate == "d1"
    i1 = torch.arange(20)
    w, b = torch.tensor(0.3, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64)
    torch.testing.assert_close(U(U.pack({"w": w, "b": b}), i1), _two_plate_potential(w, b, data, i1, None))


@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_traced_step_over_two_plates_matches_the_potential(backend):
    data = _data()
    kernel = SGLD(two_plates, step_size=1e-4, subsample_size={"d1": 20, "d2": 10}, backend=backend)
    kernel.initial_params = {"w": torch.tensor(0.5, dtype=torch.float64), "b": torch.tensor(-0.5, dtype=torch.float64)}
    kernel.setup(0, *data)
    idx = kernel._next_indices()
    assert idx.shape == (30,)
    assert int(idx[:20].max()) < N1 and int(idx[20:].max()) < N2
    state = tuple(kernel._state)
    _, value = kernel.build_step_fn()(state, idx, torch.tensor(1e-4, dtype=torch.float64))
    torch.testing.assert_close(value, kernel.potential(state[0], idx))
    assert kernel.backend_used == backend


def test_two_plate_posterior_matches_the_conjugate_posterior():
    data = _data()
    x1, y1, x2, y2 = data
    design = torch.cat([torch.stack([x1, torch.zeros(N1, dtype=torch.float64)], -1),
                        torch.stack([x2, torch.ones(N2, dtype=torch.float64)], -1)])
    precision = design.T @ design / NOISE**2 + torch.eye(2, dtype=torch.float64) / PRIOR**2
    cov = torch.linalg.inv(precision)
    mean = cov @ design.T @ torch.cat([y1, y2]) / NOISE**2
    pyro.set_rng_seed(0)
    kernel = SGLD(two_plates, step_size=2e-4, num_steps=10, subsample_size={"d1": 50, "d2": 24}, backend="fx",
                  vectorized_chains=4)
    kernel.initial_params = {"w": mean[0].expand(4).clone(), "b": mean[1].expand(4).clone()}
    mcmc = MCMC(kernel, num_samples=150, warmup_steps=20, disable_progbar=True)
    mcmc.run(*data)
    samples = mcmc.get_samples()
    est = torch.stack([samples["w"].mean(), samples["b"].mean()])
    sd = cov.diagonal().sqrt()
    # 600 draws, 10 steps apart: the Monte Carlo error of the mean is about 0.05 sd (0.12 sd seen over seeds). The
    # two data sets disagree about w, so their relative weights matter: scaling the second by the first's N/b (4
    # instead of 5) moves the posterior mean of w by about 5 sd, dropping the N/b scales by far more
    assert ((est - mean).abs() < sd).all(), (est, mean, sd)


# ----- factors and observations outside the data plate ------------------------------------------------------------
@pytest.mark.parametrize("data_plate", [None, "data"])
def test_factor_outside_the_data_plate_is_a_full_data_term(data_plate):
    x1, y1, _, _ = _data()
    U = MinibatchPotential(with_factor, (x1, y1), subsample_size=20, data_plate=data_plate)
    assert U.data_plates == ("data",)
    idx = torch.arange(100, 120)
    w = torch.tensor(0.8, dtype=torch.float64)
    expected = -(N1 / 20 * _normal_sum(y1[idx], w * x1[idx], NOISE) - 1.5 * w**2 + _normal_sum(w, 0.0, PRIOR))
    torch.testing.assert_close(U(U.pack({"w": w}), idx), expected)


def test_factor_outside_the_data_plate_with_the_functional_potential():
    x1, y1, _, _ = _data()
    x = x1.unsqueeze(-1)

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=x.dtype), 1.0).to_event(1))
        pyro.factor("penalty", -1.5 * (w**2).sum())
        with pyro.plate("data", x.shape[0]) as idx:
            f = pyro.deterministic("f", w[0] * x[idx, 0] + w[1])
            pyro.sample("y", dist.Normal(f, NOISE), obs=None if y is None else y[idx])

    rbf = gp.kernels.RBF(1, variance=torch.tensor(1.0, dtype=torch.float64),
                         lengthscale=torch.tensor(1.0, dtype=torch.float64))
    points = torch.linspace(-2, 2, 5, dtype=torch.float64).unsqueeze(-1)
    kw = dict(gp_kernel=rbf, example_points=points, subsample_size=20, prior_sites=())
    concatenated = FunctionalPotential(model, (x, y1), concatenate_inputs=True, **kw)
    two_traces = FunctionalPotential(model, (x, y1), concatenate_inputs=False, **kw)
    assert concatenated.concatenated
    flat, idx = torch.tensor([0.4, -0.2], dtype=torch.float64), torch.arange(20)
    torch.testing.assert_close(concatenated(flat, idx, points), two_traces(flat, idx, points))


# ----- what is not supported, and data problems ------------------------------------------------------------------
def test_subsample_size_larger_than_one_of_the_plates_names_it():
    with pytest.raises(ValueError, match="exceeds the data size 120 of plate 'd2'"):
        MinibatchPotential(two_plates, _data(), subsample_size=150)


@pytest.mark.parametrize("subsample_size, match", [
    ({"batch": 10}, "not a plate of the model"),
    ({"d1": 0}, "positive int"),
    ({"d1": 10}, "not among the data plates"),
])
def test_bad_subsample_dict(subsample_size, match):
    kwargs = {"data_plate": "d2"} if match == "not among the data plates" else {}
    with pytest.raises(ValueError, match=match):
        MinibatchPotential(two_plates, _data(), subsample_size=subsample_size, **kwargs)


def test_nested_plates_without_a_data_plate_name_are_explained():
    def model(y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("rows", y.shape[0], dim=-2) as i, pyro.plate("cols", y.shape[1], dim=-1) as j:
            pyro.sample("y", dist.Normal(w, 1.0), obs=y[i][:, j])

    with pytest.raises(ValueError, match="several plates.*pass data_plate="):
        MinibatchPotential(model, (torch.zeros(6, 4),), subsample_size=2)
    U = MinibatchPotential(model, (torch.zeros(6, 4),), subsample_size={"rows": 3, "cols": 2})
    assert U.data_plates == ("rows", "cols")
    value = U(torch.zeros(1), torch.tensor([0, 1, 2, 0, 1]))
    torch.testing.assert_close(value, -(6 / 3 * 4 / 2 * 6 * dist.Normal(0.0, 1.0).log_prob(torch.tensor(0.0))
                                        + dist.Normal(0.0, 1.0).log_prob(torch.tensor(0.0))))


@pytest.mark.parametrize("subsample_size", [None, 20])
@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_nan_in_an_observed_value_is_a_data_problem(subsample_size, backend):
    x1, y1, _, _ = _data()
    y1 = y1.clone()
    y1[7] = float("nan")
    kernel = SGLD(simple, step_size=1e-4, subsample_size=subsample_size, backend=backend)
    with pytest.raises(ValueError, match=r"data problem.*'y'.*1 non-finite"):
        kernel.setup(0, x1, y1)


@pytest.mark.parametrize("subsample_size", [None, 20])
def test_inf_in_a_model_argument_is_a_data_problem(subsample_size):
    x1, y1, _, _ = _data()
    x1 = x1.clone()
    x1[3] = float("inf")
    with pytest.raises(ValueError, match=r"data problem.*argument 'x'"):
        SGLD(simple, step_size=1e-4, subsample_size=subsample_size).setup(0, x1, y1)
    with pytest.raises(ValueError, match=r"data problem.*argument 'x'"):
        MCMC(SGLD(simple, step_size=1e-4), num_samples=2, disable_progbar=True).run(x=x1, y=y1)


def test_a_non_finite_datum_names_its_kind_index_and_the_tensor_of_a_nested_argument():
    def model(xt, y=None):
        x, t = xt
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(x)):
            pyro.sample("y", dist.Normal(w * x + t, 1.0), obs=y)

    x, t = torch.zeros(6), torch.zeros(6)
    t[2] = float("nan")
    with pytest.raises(ValueError, match=r"^data problem: model argument 'xt' \(its tensor 1\) contains NaN at index "
                                         r"\(2,\) \(1 non-finite value in all\); remove or impute the non-finite "
                                         r"entries: SG-MCMC needs finite data"):
        MinibatchPotential(model, ([x, t], torch.zeros(6)))


def test_observed_value_outside_the_support_is_a_data_problem():
    def model(y):
        p = pyro.sample("p", dist.Beta(1.0, 1.0))
        with pyro.plate("data", y.shape[0]) as i:
            pyro.sample("y", dist.Bernoulli(p), obs=y[i])

    y = torch.tensor([0.0, 1.0, 2.0, 1.0])
    with pytest.raises(ValueError, match=r"data problem.*'y'.*support"):
        MinibatchPotential(model, (y,), subsample_size=2)


def test_local_latent_inside_the_data_plate_is_explained():
    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]) as i:
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            pyro.sample("y", dist.Normal(w * x[i] + z, 1.0), obs=y[i])

    x1, y1, _, _ = _data()
    with pytest.raises(ValueError, match=r"local latent variable.*not supported.*marginalise.*SVI"):
        MinibatchPotential(model, (x1, y1), subsample_size=20)
    assert MinibatchPotential(model, (x1, y1)).dim == 1 + N1  # full batch: sampled jointly with w


def test_obs_mask_under_subsampling_points_to_poutine_mask():
    # Pyro's obs_mask imputes the masked entries as a latent site 'y_unobserved' inside the data plate: the error
    # names the observed site and its obs_mask (not an unknown local latent) and says how to leave them out instead
    def model(x, y, mask):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(w * x, 1.0), obs=y, obs_mask=mask)

    def masked_likelihood(x, y, mask):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]), pyro.poutine.mask(mask=mask):
            pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)

    x1, y1, _, _ = _data()
    mask = torch.arange(N1) % 4 != 0
    with pytest.raises(ValueError, match=r"'y_unobserved' holds the entries of 'y' that its obs_mask hides.*"
                                         r"poutine.mask\(mask=\.\.\.\) in place of obs_mask="):
        MinibatchPotential(model, (x1, y1, mask), subsample_size=20)
    # the advice runs, and equals the likelihood of the unmasked points alone, scaled by N/b
    U = MinibatchPotential(masked_likelihood, (x1, y1, mask), subsample_size=20)
    idx = torch.arange(20)
    w = torch.tensor([0.7], dtype=x1.dtype)
    keep = mask[idx]
    expected = -(dist.Normal(0.0, 1.0).log_prob(w).sum()
                 + N1 / 20 * dist.Normal(w * x1[idx][keep], 1.0).log_prob(y1[idx][keep]).sum())
    torch.testing.assert_close(U(w, idx), expected)


def test_data_of_another_dtype_than_the_priors_is_named():
    # a PyroModule whose weights are all PyroSample has no parameter to give its dtype: float64 data met float32
    # weights in nn.Linear, and the error was torch's "mat1 and mat2 must have the same dtype" from deep inside
    class Net(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = PyroModule[torch.nn.Linear](1, 1)
            self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 1]).to_event(2))
            self.fc.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

        def forward(self, x, y=None):
            mean = self.fc(x).squeeze(-1)  # the weights drawn outside the data plate
            with pyro.plate("data", x.shape[0]):
                pyro.sample("y", dist.Normal(mean, 1.0), obs=y)

    x1, y1, _, _ = _data()  # float64
    with pytest.raises(TypeError, match=r"argument 'x' is torch.float64, latent site 'fc.weight' is torch.float32.*"
                                        r"\.to\(torch.float32\)"):
        MinibatchPotential(Net(), (x1.unsqueeze(-1), y1), subsample_size=20)
    assert MinibatchPotential(Net(), (x1.unsqueeze(-1).float(), y1.float()), subsample_size=20).dim == 2


def test_a_plain_model_failing_on_the_sliced_data_reports_that_error():
    # a plain model (no plate indices) whose likelihood refuses the data's dtype: the kernel tries the model as an
    # indexing one, then on the sliced data; only the first error (a shape mismatch) was reported, hiding the cause
    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Bernoulli(logits=w * x), obs=y)

    x1, y1, _, _ = _data()
    with pytest.raises(ValueError, match=r"indexing the data with the plate's indices: ValueError: Shape mismatch.*"
                                         r"on the data sliced by the minibatch indices: RuntimeError: result type"):
        MinibatchPotential(model, (x1, (y1 > 0).long()), subsample_size=20)
    assert MinibatchPotential(model, (x1, (y1 > 0).double()), subsample_size=20).minibatch_mode == "slice"


def test_subsampling_a_model_run_without_its_observations_is_explained():
    # mcmc.run(x) with y left out: the plate is there but nothing in it is observed; the error said the model had
    # "no plate over the data"
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)

    x1, _, _, _ = _data()
    with pytest.raises(ValueError, match=r"observes no data: it has the plate\(s\) \['data'\] but no site with obs=.*"
                                         r"mcmc.run\(x, y\)"):
        MinibatchPotential(model, (x1,), subsample_size=20)


@pytest.mark.parametrize("bias", [True, False])  # torch's two wordings: "Byte and Float", "unsigned char != float"
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64])
def test_integer_data_is_named_with_the_conversion(dtype, bias):
    # images stored as bytes reach nn.Linear as integers: torch's "mat1 and mat2 must have the same dtype, but got
    # Byte and Float" named neither the argument nor the fix; the integer labels y are not blamed
    class Net(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = PyroModule[torch.nn.Linear](2, 3, bias=bias)
            self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 2]).to_event(2))
            if bias:
                self.fc.bias = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))

        def forward(self, x, y=None):
            logits = self.fc(x)
            with pyro.plate("data", x.shape[0]):
                pyro.sample("y", dist.Categorical(logits=logits), obs=y)

    x, y = torch.randint(0, 256, (30, 2)).to(dtype), torch.arange(30) % 3
    with pytest.raises(TypeError, match=rf"integer data: the model's argument 'x' is {dtype}, latent site "
                                        r"'fc.weight' is torch.float32 .*\.to\(torch.float32\)\); pixels"):
        MinibatchPotential(Net(), (x, y), subsample_size=10)
    assert MinibatchPotential(Net(), (x.float() / 255, y), subsample_size=10).dim == 6 + 3 * bias


@pytest.mark.parametrize("bias", [True, False])  # "Input type (unsigned char) and bias type (float) should be the
def test_integer_images_into_a_convolution_are_named(bias):  # same"; "expected scalar type Byte but found Float"
    class Net(PyroModule):
        def __init__(self):
            super().__init__()
            self.conv = PyroModule[torch.nn.Conv2d](1, 2, 3, bias=bias)
            self.conv.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 1, 3, 3]).to_event(4))
            if bias:
                self.conv.bias = PyroSample(dist.Normal(0.0, 1.0).expand([2]).to_event(1))

        def forward(self, x, y=None):
            logits = self.conv(x).mean((-2, -1))
            with pyro.plate("data", x.shape[0]):
                pyro.sample("y", dist.Categorical(logits=logits), obs=y)

    x, y = torch.randint(0, 256, (30, 1, 5, 5), dtype=torch.uint8), torch.arange(30) % 2
    with pytest.raises(TypeError, match=r"integer data: the model's argument 'x' is torch.uint8, latent site "
                                        r"'conv.weight' is torch.float32"):
        MinibatchPotential(Net(), (x, y), subsample_size=10)


def test_an_error_that_names_an_integer_dtype_without_a_mismatch_is_not_blamed_on_integer_data():
    # torch's "expected target dtype to be Long or Byte, but got Float" (float labels) is the model's own error: the
    # integer argument that happens to be there is not blamed
    def model(x, y, idx):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, 3), 1.0).to_event(2))
        with pyro.plate("data", x.shape[0]):
            pyro.factor("nll", -torch.nn.functional.cross_entropy(x @ w, y, reduction="none"))

    x, y, idx = torch.randn(30, 2), torch.zeros(30), torch.arange(30)
    with pytest.raises(RuntimeError, match="expected target dtype to be Long or Byte, but got Float"):
        MinibatchPotential(model, (x, y, idx), subsample_size=10)
