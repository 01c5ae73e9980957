import numpy as np
import pytest

import replaystore as rs
from conftest import transitions

torch = pytest.importorskip("torch")


def test_as_tensor_dtypes_and_no_copy_on_cpu():
    t = rs.Table(50, sampler=rs.Prioritized(), seed=0)
    t.extend(
        {
            "obs": np.zeros((10, 3), np.float32),
            "act": np.arange(10),
            "done": np.zeros(10, bool),
            "img": {"px": np.ones((10, 2, 2), np.uint8)},
        }
    )
    s = t.sample(6, as_tensor=True)
    assert s.data["obs"].dtype == torch.float32
    assert s.data["act"].dtype == torch.int64
    assert s.data["done"].dtype == torch.bool
    assert s.data["img"]["px"].dtype == torch.uint8 and s.data["img"]["px"].shape == (6, 2, 2)
    assert s.keys.dtype == torch.int64 and s.weights.dtype == torch.float64
    assert s.data["obs"].device.type == "cpu"


def test_to_tensor_shares_memory_with_numpy():
    from replaystore.integrations.torch import sample_to_tensors

    t = rs.Table(50, seed=0)
    t.extend(transitions(10))
    s = t.sample(4)
    ts = sample_to_tensors(s)
    # a view: writing through the tensor changes the array (no copy was made)
    ts.data["obs"][0, 0] = 123.0
    assert s.data["obs"][0, 0] == 123.0
    assert ts.keys.data_ptr() == s.keys.ctypes.data


def test_device_argument_and_pin_memory_without_accelerator():
    t = rs.Table(50, seed=0)
    t.extend(transitions(10))
    s = t.sample(4, as_tensor=True, device="cpu")
    assert s.data["obs"].device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.warns(RuntimeWarning, match="pin_memory"):
            s = t.sample(4, as_tensor=True, pin_memory=True)
        assert isinstance(s.data["obs"], torch.Tensor)


def test_object_storage_data_stays_a_list():
    t = rs.Table(5, storage="objects", seed=0)
    t.extend(["a", "b"])
    s = t.sample(2, as_tensor=True)
    assert isinstance(s.data, list) and isinstance(s.keys, torch.Tensor)


def test_tensordict_output_when_installed():
    pytest.importorskip("tensordict")
    from replaystore.integrations.torch import sample_to_tensordict

    t = rs.Table(50, seed=0)
    t.extend(transitions(10))
    td = sample_to_tensordict(t.sample(4))
    assert td.batch_size == torch.Size([4]) and "obs" in td.keys() and "weights" in td.keys()
