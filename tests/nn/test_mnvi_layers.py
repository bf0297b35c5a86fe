# SPDX-License-Identifier: Apache-2.0
"""MNVI layers: parameter counts, gradient flow, dtype handling, input validation and the converter."""

import subprocess
import sys

import pyro
import pytest
import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

from pyro_sdebnn.infer import SamplingFreeBNN
from pyro_sdebnn.nn.mnvi import (
    MFConv2d,
    MFLinear,
    MNConv2d,
    MNLinear,
    MNReLU,
    MNResidualBlock,
    MNSequential,
    to_mean_field,
    to_mnvi,
)
from pyro_sdebnn.nn.mnvi.normalization import MNBatchNorm1d
from pyro_sdebnn.ops import Moments


def lenet(dropout: float = 0.1) -> nn.Sequential:
    """LeNet-5 style network for 28x28 inputs, with batch norm and dropout to exercise the converter."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(120, 84), nn.Tanh(), nn.Linear(84, 10),
    )


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("factory,deterministic,extra", [
    (lambda: MNLinear(7, 3), lambda: nn.Linear(7, 3), 7),
    (lambda: MNConv2d(4, 6, 3), lambda: nn.Conv2d(4, 6, 3), 4),
    (lambda: MFLinear(7, 3), lambda: nn.Linear(7, 3), 21),
    (lambda: MFConv2d(4, 6, 3), lambda: nn.Conv2d(4, 6, 3), 6 * 4 * 9),
])
def test_parameter_count(factory, deterministic, extra):
    layer = factory()
    assert _count(layer) == _count(deterministic()) + extra
    assert layer.num_noise_parameters == extra


def test_converted_lenet_parameter_count_and_outputs():
    net = lenet().eval()
    twin = to_mnvi(net).eval()
    inputs = 1 + 6 + 400 + 120 + 84  # one alpha per input channel / unit of every Bayesian layer
    assert _count(twin) == _count(net) + inputs
    assert _count(to_mean_field(net)) == _count(net) + sum(m.weight.numel() for m in net if hasattr(m, "weight")
                                                            and not isinstance(m, nn.BatchNorm2d))
    x = torch.randn(3, 1, 28, 28)
    assert torch.allclose(twin(x), net(x), atol=1e-6)  # deterministic mode = the original network
    out = twin(Moments(x, None))
    assert out.mean.shape == (3, 10) and bool((out.var > 0).all())


def test_converted_resnet_runs_both_modes():
    net = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=5).eval()
    twin = to_mnvi(net).eval()
    assert sum(isinstance(m, MNResidualBlock) for m in twin.modules()) == 4
    x = torch.randn(2, 3, 16, 16)
    assert torch.allclose(twin(x), net(x), atol=1e-5)
    out = twin(Moments(x, None))
    assert out.mean.shape == (2, 5) and torch.isfinite(out.var).all()


def test_converter_rejects_unknown_module():
    with pytest.raises(TypeError, match="cannot convert LSTM"):
        to_mnvi(nn.Sequential(nn.LSTM(2, 2)))


def test_converter_keeps_dtype_and_does_not_modify_source():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 1)).double()
    before = [p.clone() for p in net.parameters()]
    twin = to_mnvi(net)
    assert isinstance(twin[1], MNBatchNorm1d)
    assert all(p.dtype == torch.float64 for p in twin.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))


def test_gradients_flow_to_every_parameter():
    net = to_mnvi(nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(48, 16), nn.Tanh(), nn.Linear(16, 4)))
    bnn = SamplingFreeBNN(net, "categorical", num_data=100)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 4, (8,))
    loss = -bnn.expected_log_likelihood(x, y).sum() + bnn.kl_divergence()
    loss.backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_moment_forward_follows_dtype():
    layer = MNLinear(3, 2, dtype=torch.float64)
    out = MNSequential(layer, MNReLU())(Moments(torch.randn(4, 3, dtype=torch.float64), None))
    assert out.mean.dtype == out.var.dtype == torch.float64


@pytest.mark.parametrize("make_input,error,match", [
    (lambda: Moments(torch.zeros(2, 3), -torch.ones(2, 3)), ValueError, "non-negative"),
    (lambda: Moments(torch.zeros(2, 3), torch.ones(2, 4)), ValueError, "must have the shape"),
    (lambda: Moments(torch.zeros(2, 3), torch.full((2, 3), float("nan"))), ValueError, "non-negative.*got NaN"),
    (lambda: Moments(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.float64)), TypeError,
     r"input.var must have the dtype and device of input.mean \(torch.float32"),
    (lambda: Moments(torch.zeros(2, 5), None), ValueError, "3 features"),
    (lambda: Moments([0.0, 1.0], None), TypeError, "torch.Tensor"),
    (lambda: [0.0, 1.0, 2.0], TypeError, "Moments"),
])
def test_bad_inputs_raise(make_input, error, match):
    with pytest.raises(error, match=match):
        MNLinear(3, 2)(make_input())


def test_negative_variance_check_only_under_validation():
    pyro.enable_validation(False)
    try:
        MNLinear(3, 2)(Moments(torch.zeros(2, 3), -torch.ones(2, 3)))  # skipped: costs a device sync
    finally:
        pyro.enable_validation(True)


@pytest.mark.parametrize("cls", [MNLinear, MFLinear])
@pytest.mark.parametrize("kwargs,match", [
    ({"in_features": 0, "out_features": 2}, "in_features"),
    ({"in_features": 2, "out_features": 2.5}, "out_features"),
])
def test_bad_constructor_arguments(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


@pytest.mark.parametrize("cls", [MNConv2d, MFConv2d])
@pytest.mark.parametrize("kwargs,match", [
    ({"in_channels": 0, "out_channels": 2}, "in_channels"),
    ({"in_channels": 2, "out_channels": 2, "groups": 0}, "groups"),
    ({"in_channels": 3, "out_channels": 2, "groups": 2}, "divisible by groups"),
    ({"in_channels": 2, "out_channels": 2, "padding_mode": "reflect"}, "padding_mode must be 'zeros'"),
])
def test_bad_conv_constructor_arguments(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(kernel_size=3, **kwargs)


@pytest.mark.parametrize("factory,deterministic,noise_name", [
    (lambda: MNLinear(5, 3), lambda: nn.Linear(5, 3), "rho"),
    (lambda: MFLinear(5, 3), lambda: nn.Linear(5, 3), "weight_rho"),
    (lambda: MNConv2d(4, 6, 3, 2, 1, groups=2), lambda: nn.Conv2d(4, 6, 3, 2, 1, groups=2), "rho"),
    (lambda: MFConv2d(4, 6, 3, padding=1, bias=False), lambda: nn.Conv2d(4, 6, 3, padding=1, bias=False),
     "weight_rho"),
])
def test_layer_is_its_torch_twin(factory, deterministic, noise_name):
    # same seed -> same weight and bias as the torch layer (init and RNG order), state_dict = torch's + noise
    torch.manual_seed(0)
    layer = factory()
    torch.manual_seed(0)
    plain = deterministic()
    assert isinstance(layer, type(plain))
    assert list(layer.state_dict()) == [*plain.state_dict(), noise_name]
    for key, value in plain.state_dict().items():
        assert torch.equal(layer.state_dict()[key], value), key
    x = torch.randn(2, 4, 7, 7) if isinstance(plain, nn.Conv2d) else torch.randn(2, 5)
    assert torch.equal(layer(x), plain(x))
    assert torch.equal(layer(Moments(x, None)).mean, plain(x))


def test_conv_channel_mismatch_raises():
    with pytest.raises(ValueError, match="3 channels"):
        MNConv2d(3, 2, 3)(Moments(torch.zeros(1, 2, 5, 5), None))


def test_relu_min_var_validated():
    with pytest.raises(ValueError, match="min_var"):
        MNReLU(min_var=0.0)


@pytest.mark.parametrize("factory, noise_name, shape, default", [
    (lambda **kw: MNLinear(3, 2, **kw), "rho", (3,), -3.0),
    (lambda **kw: MNConv2d(4, 6, 3, groups=2, **kw), "rho", (4,), -3.0),  # one per input channel, groups or not
    (lambda **kw: MFLinear(3, 2, **kw), "weight_rho", (2, 3), -10.0),
    (lambda **kw: MFConv2d(4, 6, 3, groups=2, **kw), "weight_rho", (6, 2, 3, 3), -10.0),
])
def test_noise_parameter_initialisation(factory, noise_name, shape, default):
    # the published initial values (Schmitt & Roth 2021, App. A: rho = -3; Table 4, mean-field LeNet: -10),
    # overridable with rho_init, in the layer's dtype
    noise = getattr(factory(), noise_name)
    assert noise.shape == shape and torch.equal(noise, torch.full(shape, default))
    noise = getattr(factory(rho_init=-1.5, dtype=torch.float64), noise_name)
    assert noise.dtype == torch.float64 and torch.equal(noise, torch.full(shape, -1.5, dtype=torch.float64))


def test_importing_the_package_does_not_import_torchvision():
    # torchvision takes seconds to import; its converters are registered when a torchvision module is converted
    code = ("import sys, pyro_sdebnn.nn.mnvi, pyro_sdebnn.infer, pyro_sdebnn.infer.mcmc, pyro_sdebnn.data\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torchvision'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_a_plain_torch_layer_given_moments_is_named():
    # torch's own errors ("relu(): argument 'input' must be Tensor, not Moments", "'Moments' object has no attribute
    # 'flatten'") named neither the layer nor the fix
    net = MNSequential(MNLinear(3, 4), nn.ReLU(), MNLinear(4, 2))
    with pytest.raises(TypeError, match=r"MNSequential: module 1 is torch.nn.ReLU, .*MNReLU.*to_mnvi"):
        net(Moments(torch.zeros(2, 3), None))
    assert net(torch.zeros(2, 3)).shape == (2, 2)  # the deterministic pass takes plain layers
    block = MNResidualBlock(MNLinear(3, 3), activation=nn.Tanh())
    with pytest.raises(TypeError, match="MNResidualBlock: the activation is torch.nn.Tanh"):
        block(Moments(torch.zeros(2, 3), None))
    # torch modules that pass moments through are kept, and so are torch-made subclasses of ours (parametrisations)
    out = MNSequential(nn.Identity(), nn.Sequential(MNLinear(3, 2), MNReLU()))(Moments(torch.zeros(2, 3), None))
    assert out.var.shape == (2, 2)
    normed = torch.nn.utils.parametrizations.weight_norm(MNLinear(3, 2))
    assert type(normed).__module__.startswith("torch.")
    assert MNSequential(normed, MNReLU())(Moments(torch.ones(2, 3), None)).var.shape == (2, 2)


@pytest.mark.parametrize("make", [
    lambda **kw: MNLinear(3, 2, **kw), lambda **kw: MFLinear(3, 2, **kw), lambda **kw: MNConv2d(2, 2, 3, **kw),
    lambda **kw: to_mnvi(nn.Linear(3, 2), **kw), lambda **kw: to_mean_field(nn.Linear(3, 2), **kw),
])
def test_bad_rho_init_is_named(make):
    # a string failed as "could not convert string to float: 'a'"; NaN / inf gave NaN / inf noise variances
    with pytest.raises(TypeError, match="rho_init must be a real number"):
        make(rho_init="a")
    for value in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="rho_init must be finite"):
            make(rho_init=value)
    assert make(rho_init=torch.tensor(-2.0)) is not None


@pytest.mark.parametrize(
    "min_var, error", [("1e-5", TypeError), (float("inf"), ValueError), (float("nan"), ValueError)]
)
def test_relu_min_var_type_and_finiteness(min_var, error):
    with pytest.raises(error, match="min_var must be"):
        MNReLU(min_var=min_var)


def test_moment_network_runs_under_cpu_autocast():
    # autocast mixes the dtypes of a moment pair (batch norm in float32, convolutions in bfloat16): the dtype check of
    # a Moments input must not refuse what autocast produces
    net = to_mnvi(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU(), nn.MaxPool2d(2),
                                nn.Flatten(), nn.Linear(2 * 3 * 3, 3)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(Moments(torch.randn(2, 1, 6, 6), None))
    assert out.mean.shape == out.var.shape == (2, 3) and torch.isfinite(out.var).all()
