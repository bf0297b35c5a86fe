# SPDX-License-Identifier: Apache-2.0
"""Every public object follows the device and dtype of its inputs / module.

Runs on every available device (CUDA cases skip cleanly on machines without a GPU) and in float64, so a
hard-coded ``torch.float32`` or CPU tensor inside the library fails here.
"""

import traceback

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.contrib.gp.kernels import RBF
from pyro.infer import MCMC, SVI
from torch.utils._python_dispatch import TorchDispatchMode

from pyro_sdebnn.distributions import GPFunctionalPrior, MultiplicativeNormal, OUPath
from pyro_sdebnn.infer import NeuralSDEGuide, SamplingFree_ELBO, SamplingFreeBNN, TracePathKL_ELBO
from pyro_sdebnn.infer._svi_baseline import PyroBNN
from pyro_sdebnn.infer.mcmc import SGHMC, SGLD, BayesianMLP
from pyro_sdebnn.nn import SDEBNN
from pyro_sdebnn.nn._mlp import make_mlp
from pyro_sdebnn.nn.mnvi import to_mnvi

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")),
]
DTYPE = torch.float64


def _check(tensor, device):
    assert tensor.dtype == DTYPE, tensor.dtype
    assert tensor.device.type == torch.device(device).type


@pytest.mark.parametrize("device", DEVICES)
def test_distributions_follow_inputs(device):
    init = torch.zeros(3, 4, dtype=DTYPE, device=device)
    times = torch.linspace(0, 1, 6, dtype=DTYPE, device=device)
    path = OUPath(init, 0.5, times).rsample()
    _check(path, device)
    _check(OUPath(init, 0.5, times, method="euler").log_prob(path), device)
    mn = MultiplicativeNormal(torch.ones(2, 3, dtype=DTYPE, device=device), torch.full((3,), 0.1, dtype=DTYPE,
                                                                                         device=device))
    _check(mn.rsample(), device)
    kernel = RBF(1).to(device=device, dtype=DTYPE)
    prior = GPFunctionalPrior(kernel, torch.linspace(-1, 1, 5, dtype=DTYPE, device=device).unsqueeze(-1))
    f = prior.sample()
    _check(f, device)
    _check(prior.score(f), device)


@pytest.mark.parametrize("device", DEVICES)
def test_sdebnn_svi_step_and_prediction_follow_module(device):
    x = torch.linspace(-1, 1, 8, dtype=DTYPE, device=device).unsqueeze(-1)
    y = torch.sin(3 * x).squeeze(-1)
    net = SDEBNN(in_dim=1, out_dim=1, hidden=8, augment=1, sigma=0.2, dt=0.25).to(device=device, dtype=DTYPE)
    guide = NeuralSDEGuide(net, drift_hidden=8).to(device=device, dtype=DTYPE)
    svi = SVI(net.model, guide, pyro.optim.Adam({"lr": 1e-3}), loss=TracePathKL_ELBO(estimator="stl"))
    svi.step(x, y)
    pred = net.predict(x, guide, num_samples=3)
    _check(pred.loc, device)
    _check(pred.scale, device)


@pytest.mark.parametrize("device", DEVICES)
def test_mnvi_sampling_free_step_and_prediction_follow_module(device):
    x = torch.randn(16, 3, dtype=DTYPE, device=device)
    y = x.sum(-1)
    net = to_mnvi(make_mlp([3, 8, 2])).to(device=device, dtype=DTYPE)
    bnn = SamplingFreeBNN(net, "normal", num_data=16)
    svi = SVI(bnn.model, bnn.guide, pyro.optim.Adam({"lr": 1e-3}), SamplingFree_ELBO())
    svi.step(x, y)
    pred = bnn.predict(x)
    _check(pred.loc, device)


@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC])
@pytest.mark.parametrize("device", DEVICES)
def test_sgmcmc_samples_follow_the_data(device, kernel_cls):
    x = torch.linspace(-1, 1, 20, dtype=DTYPE, device=device)
    y = 2 * x

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros((), dtype=x.dtype, device=x.device), 1.0))
        with pyro.plate("data", len(x)) as idx:
            pyro.sample("y", dist.Normal(w * x[idx], 1.0), obs=None if y is None else y[idx])

    options = {"friction": 1.0} if kernel_cls is SGHMC else {}
    kernel = kernel_cls(model, step_size=1e-2, num_steps=2, subsample_size=10, **options)
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=5, disable_progbar=True)
    mcmc.run(x, y)
    _check(mcmc.get_samples()["w"], device)


@pytest.mark.parametrize("device", DEVICES)
def test_example_bnns_moved_after_construction_draw_on_their_device(device):
    # built on the CPU in float32, then moved: the weight priors must follow (.to(device, dtype))
    x = torch.randn(12, 3, dtype=DTYPE, device=device)
    y = (x[:, 0] > 0).to(DTYPE)
    model = BayesianMLP([3, 8, 1], likelihood="bernoulli").to(device=device, dtype=DTYPE)
    trace = pyro.poutine.trace(model).get_trace(x, y)
    for name in ("layers.0.weight", "layers.1.bias", "f"):
        _check(trace.nodes[name]["value"], device)
    assert model.state_dict() == {}  # the priors' zero buffers stay out of the state dict
    mcmc = MCMC(SGLD(model, step_size=1e-3, num_steps=2, subsample_size=6, map_steps=0), num_samples=3,
                warmup_steps=2, disable_progbar=True)
    mcmc.run(x, y)
    _check(mcmc.get_samples()["layers.0.weight"], device)
    bnn = PyroBNN(make_mlp([3, 8, 2]), "categorical").to(device=device, dtype=DTYPE)
    trace = pyro.poutine.trace(bnn).get_trace(x, y.long())
    for name in ("net.0.weight", "net.2.bias", "outputs"):
        _check(trace.nodes[name]["value"], device)


class _TensorsFromPython(TorchDispatchMode):
    """Records where package code turns a Python number into a tensor (``torch.tensor``, ``as_tensor``,
    ``new_tensor``): on a GPU each is a host-to-device copy that waits for the device."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default):
            caller = next((f for f in reversed(traceback.extract_stack()[:-1]) if "/torch/" not in f.filename), None)
            if caller is not None and "/pyro_sdebnn/" in caller.filename:
                self.sites.append(f"{caller.filename.rsplit('/pyro_sdebnn/', 1)[1]}:{caller.lineno}")
        return func(*args, **(kwargs or {}))


def test_training_steps_make_no_tensor_from_a_python_number():
    # one SVI step of the SDE-BNN (OU prior, neural-SDE guide) and of MNVI, and one SG-MCMC potential evaluation of
    # BayesianMLP with a learned noise scale: none may copy a Python number to the model's device
    pyro.set_rng_seed(0)
    x, y = torch.randn(8, 2), torch.randn(8)
    net = SDEBNN(in_dim=2, out_dim=1, hidden=4, augment=1, sigma=0.2, dt=0.5)
    guide = NeuralSDEGuide(net, drift_hidden=4)
    sde = SVI(net.model, guide, pyro.optim.Adam({"lr": 1e-3}), loss=TracePathKL_ELBO(estimator="stl"))
    bnn = SamplingFreeBNN(to_mnvi(make_mlp([2, 4, 2])), "normal", num_data=8)
    mnvi = SVI(bnn.model, bnn.guide, pyro.optim.Adam({"lr": 1e-3}), SamplingFree_ELBO())
    mlp = BayesianMLP([2, 4, 1], noise_scale=None)
    studentt = SDEBNN(in_dim=2, out_dim=1, hidden=4, dt=0.5, likelihood="studentt", name="studentt")  # a second net
    sde.step(x, y), mnvi.step(x, y)  # parameters created outside the recorded steps
    mode = _TensorsFromPython()
    with mode:
        sde.step(x, y)
        mnvi.step(x, y)
        pyro.poutine.trace(mlp).get_trace(x, y)
        pyro.poutine.trace(studentt.model).get_trace(x, y)
    assert mode.sites == []
