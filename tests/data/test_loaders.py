# SPDX-License-Identifier: Apache-2.0
"""The shared DataLoader helpers: loader detection, the data-set size N, batch validation and device moves."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from pyro_sdebnn.data.loaders import dataset_size, is_loader, iter_batches


def _loader(n=10, batch_size=4):
    return DataLoader(TensorDataset(torch.randn(n, 3), torch.arange(n)), batch_size=batch_size)


def test_is_loader_tells_loaders_from_tensors():
    assert is_loader(_loader()) and not is_loader(torch.zeros(3, 2))
    for bad in (np.zeros((3, 2)), [torch.zeros(2)], (torch.zeros(2),), None, "x"):
        with pytest.raises(TypeError, match="data must be a torch.Tensor or a loader"):
            is_loader(bad)


def test_dataset_size_is_the_global_n():
    assert dataset_size(_loader(n=10)) == 10

    class Stream(IterableDataset):
        def __iter__(self):
            yield torch.zeros(2), torch.tensor(0)

    with pytest.raises(TypeError, match="must have a `dataset` with a length"):
        dataset_size(DataLoader(Stream(), batch_size=1))
    with pytest.raises(TypeError, match="must have a `dataset` with a length"):
        dataset_size(iter([(torch.zeros(1, 2), torch.zeros(1))]))
    with pytest.raises(ValueError, match="empty"):
        dataset_size(DataLoader(TensorDataset(torch.zeros(0, 2)), batch_size=1))


def test_iter_batches_moves_dtype_of_inputs_only_and_keeps_order():
    x, y = torch.randn(10, 3), torch.arange(10)
    batches = list(iter_batches(DataLoader(TensorDataset(x, y), batch_size=4), "cpu", torch.float64))
    assert [b[0].shape[0] for b in batches] == [4, 4, 2]
    assert all(b[0].dtype == torch.float64 and b[1].dtype == torch.int64 for b in batches)
    assert torch.equal(torch.cat([b[0] for b in batches]), x.double())
    assert torch.equal(torch.cat([b[1] for b in batches]), y)


def test_iter_batches_rejects_bad_batches():
    with pytest.raises(TypeError, match=r"batch 0 of the loader is a Tensor; every batch must be an \(x, y\) pair"):
        list(iter_batches([torch.zeros(2, 3)]))
    with pytest.raises(TypeError, match="of length 3"):
        list(iter_batches([(torch.zeros(2, 3), torch.zeros(2), torch.zeros(2))]))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        list(iter_batches([(np.zeros((2, 3)), torch.zeros(2))]))
    with pytest.raises(ValueError, match="same first"):
        list(iter_batches([(torch.zeros(2, 3), torch.zeros(3))]))
    with pytest.raises(ValueError, match="empty"):
        list(iter_batches([(torch.zeros(0, 3), torch.zeros(0))]))
    # prediction: x alone is fine
    (x, y), = iter_batches([torch.ones(2, 3)], with_targets=False)
    assert y is None and x.shape == (2, 3)


def test_check_finite_batch_names_the_argument_the_batch_and_the_first_bad_index():
    from pyro_sdebnn.data.loaders import check_finite_batch

    check_finite_batch(torch.randn(4, 2), torch.arange(4), what="x_train")  # finite: nothing raised
    x = torch.zeros(4, 2)
    x[3, 1], x[0, 0] = float("nan"), float("inf")
    with pytest.raises(ValueError, match=r"x_train contains Inf at index \(0, 0\) of batch 2 of the loader "
                                         r"\(2 non-finite values in all\)"):
        check_finite_batch(x, what="x_train", batch_index=2)
    y = torch.tensor([0.0, 1.0, float("nan")])
    with pytest.raises(ValueError, match=r"^y contains NaN at index \(2,\) \(1 non-finite value in all\)"):
        check_finite_batch(torch.zeros(3, 2), y)


def test_check_finite_batch_passes_finite_values_whose_sum_overflows():
    from pyro_sdebnn.data.loaders import check_finite_batch

    big = torch.full((4, 2), 3e38)  # finite, but the fast test's sum is inf: the exact check must let it through
    assert not torch.isfinite(big.sum())
    check_finite_batch(big, big.double() * 1e200, what="x_train")
    check_finite_batch(big, -big, what="x_train")  # sums of +inf and -inf: a NaN total, still finite values
    big[2, 0] = float("-inf")
    with pytest.raises(ValueError, match=r"x_train contains Inf at index \(2, 0\)"):
        check_finite_batch(big, what="x_train")


def test_read_batch_flattens_a_batch_once_and_arguments_rebuild_the_call():
    from pyro_sdebnn.data.loaders import arguments, read_batch

    x, t, y = torch.zeros(3, 2), torch.ones(3), torch.arange(3)
    leaves, spec, b = read_batch((x, y))
    assert leaves == [x, y] and b == 3  # the batch's own tensors, not copies
    assert read_batch([x, y])[1] == spec != read_batch({"x": x, "y": y})[1] != read_batch(((x, t), y))[1]
    args, kwargs = arguments(leaves, spec)
    assert args[0] is x and args[1] is y and kwargs == {}
    leaves, spec, _ = read_batch(({"x": x, "t": t}, y))  # nested: the pytree path
    assert leaves == [x, t, y]
    args, kwargs = arguments(leaves, spec)
    assert list(args[0]) == ["x", "t"] and args[0]["t"] is t and args[1] is y and kwargs == {}
    leaves, spec, _ = read_batch({"y": y, "x": x})
    assert leaves == [y, x] and arguments(leaves, spec) == ((), {"y": y, "x": x})


def test_check_finite_tensors_names_the_argument_and_tensor_and_builds_names_only_for_a_message():
    from pyro_sdebnn.data.loaders import check_finite_tensors, leaf_names, read_batch

    def model(xt, y=None):
        return xt

    x, t = torch.zeros(3, 2), torch.zeros(3)
    leaves, spec, _ = read_batch(([x, t], torch.arange(3)), 4)
    check_finite_tensors(leaves, lambda: pytest.fail("the names are built only for a message"), batch_index=4)
    t[1] = float("inf")
    with pytest.raises(ValueError, match=r"^xt \(its tensor 1\) contains Inf at index \(1,\) of batch 4 of the loader "
                                         r"\(1 non-finite value in all\); remove or impute the non-finite entries$"):
        check_finite_tensors(leaves, lambda: leaf_names(spec, len(leaves), model), batch_index=4)
    assert leaf_names(spec, len(leaves)) == ["batch[0] (its tensor 0)", "batch[0] (its tensor 1)", "batch[1]"]


def test_iter_batches_checks_every_batch_when_asked():
    x = torch.randn(10, 3)
    x[9, 2] = float("nan")  # batch 2 (size 4), row 1
    loader = DataLoader(TensorDataset(x, torch.arange(10)), batch_size=4)
    assert len(list(iter_batches(loader))) == 3  # unchecked by default
    with pytest.raises(ValueError, match=r"x contains NaN at index \(1, 2\) of batch 2 of the loader"):
        list(iter_batches(loader, check_finite="x"))


def test_batch_arguments_follow_the_one_rule_for_every_default_collate_structure():
    from torch.utils.data import default_collate

    from pyro_sdebnn.data.loaders import batch_arguments, batch_length

    x, t, y = torch.zeros(3, 2), torch.ones(3), torch.arange(3)
    args, kwargs = batch_arguments(default_collate([(x[i], t[i], y[i]) for i in range(3)]))  # a list: model(*batch)
    assert [a.shape for a in args] == [(3, 2), (3,), (3,)] and kwargs == {}
    args, kwargs = batch_arguments(default_collate([{"x": x[i], "y": y[i]} for i in range(3)]))  # model(**batch)
    assert args == () and list(kwargs) == ["x", "y"] and torch.equal(kwargs["y"], y)
    args, kwargs = batch_arguments(default_collate([x[i] for i in range(3)]))  # a tensor: model(batch)
    assert len(args) == 1 and torch.equal(args[0], x) and kwargs == {}
    nested = default_collate([((x[i], t[i]), y[i]) for i in range(3)])  # nested: model([x, t], y)
    args, _ = batch_arguments(nested)
    assert isinstance(args[0], list) and batch_length(args) == 3


def test_batch_arguments_name_what_cannot_reach_the_model():
    from pyro_sdebnn.data.loaders import batch_arguments

    def model(x, y=None):
        return x

    x = torch.zeros(3, 2)
    with pytest.raises(TypeError, match=r"batch 5 of the loader is a set; a batch must be a tuple or list"):
        batch_arguments({1, 2}, 5)
    with pytest.raises(TypeError, match=r"a dict with keys \[0\]: .*keys must be the model's argument names"):
        batch_arguments({0: x})
    with pytest.raises(TypeError, match=r"the batch: argument 'y' holds a int, not a tensor"):
        batch_arguments((x, [1, 2, 3]), model=model)
    with pytest.raises(ValueError, match=r"the batch is empty or has no batch dimension \(argument 'x'"):
        batch_arguments({"x": torch.zeros(0, 2)})
    with pytest.raises(ValueError, match=r"share their first \(batch\) dimension.*'x': 3, 'y': 2"):
        batch_arguments((x, torch.zeros(2)), model=model)
    with pytest.raises(TypeError, match=r"the batch is a tensor, passed as model\(batch\), which does not fit the "
                                        r"model's parameters \(a, b\): missing a required argument: 'b'"):
        batch_arguments(x, model=lambda a, b: a)
    assert batch_arguments({"x": x}, model=model)[1]["x"] is x  # y=None is optional
