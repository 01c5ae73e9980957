"""MineStudio compat: data types and helpers (no Ray needed)."""

import dataclasses

import numpy as np
import pytest

from replaystore.compat.minestudio import (
    FragmentDataDict,
    FragmentIndex,
    FragmentMetadata,
    SampleFragment,
    auto_stack,
    auto_to_numpy,
    auto_to_torch,
    batchify_next_obs,
    buffer_config,
    prepare_batch,
)


def frag(i, t=4):
    return SampleFragment(
        obs={"image": np.full((t, 2, 2, 3), i, np.uint8)},
        action={"camera": np.full((t, 1), i)},
        next_done=np.zeros(t, bool),
        reward=np.zeros(t, np.float32),
        first=np.eye(1, t, dtype=bool)[0],
        in_state=[np.full((1, 3), i, np.float32)],
        worker_uuid="w",
        fid_in_worker=i,
        next_obs={"image": np.zeros((2, 2, 3), np.uint8)},
        episode_uuids=["e"] * t,
    )


def test_datatypes():
    f = frag(3)
    assert f.index == FragmentIndex("w", 3) and hash(f.index) == hash(FragmentIndex("w", 3))
    m = FragmentMetadata(model_version=1, session_id="s", worker_uuid="w", fid_in_worker=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.model_version = 2
    f.print()


def test_auto_stack_rules():
    out = auto_stack([{"a": np.ones(2), "b": [1, "x"], "c": 1.5}, {"a": np.zeros(2), "b": [2, "y"], "c": 2.5}])
    assert out["a"].shape == (2, 2)
    assert list(out["b"][0]) == [1, 2] and out["b"][1] == ["x", "y"]
    assert out["c"].dtype == np.float64
    fs = [frag(0), frag(1)]
    assert auto_stack(fs) == fs  # dataclasses stay a list
    assert auto_stack([]) == []


def test_torch_helpers():
    torch = pytest.importorskip("torch")
    t = auto_to_torch({"a": np.ones((2, 2)), "b": [np.zeros(1)], "c": "s"})
    assert isinstance(t["a"], torch.Tensor) and isinstance(t["b"][0], torch.Tensor) and t["c"] == "s"
    ro = np.ones(3)
    ro.flags.writeable = False
    assert auto_to_torch(ro).sum() == 3  # copied, no warning about read-only memory
    back = auto_to_numpy({"a": torch.ones(2), "b": [torch.zeros(1)]})
    assert isinstance(back["a"], np.ndarray) and isinstance(back["b"][0], np.ndarray)
    assert torch.stack([torch.ones(2)] * 3).shape == auto_stack([torch.ones(2)] * 3).shape

    class Model:
        device = torch.device("cpu")

        def merge_state(self, states):
            return [torch.cat([s[i] for s in states], 0) for i in range(len(states[0]))]

    fs = [frag(0), frag(1), frag(2)]
    b = prepare_batch(Model(), fs)
    assert b["obs"]["image"].shape == (3, 4, 2, 2, 3) and b["action"]["camera"].shape == (3, 4, 1)
    assert b["first"].shape == (3, 4) and b["state"][0].shape == (3, 3)
    assert batchify_next_obs(fs[0].next_obs, torch.device("cpu"))["image"].shape == (1, 1, 2, 2, 3)
    d = FragmentDataDict({f.index: np.full(2, f.fid_in_worker) for f in fs})
    assert d.format_batch(fs, "cpu").shape == (3, 2)


def test_config_mapping(tmp_path):
    c = buffer_config(
        {
            "max_chunks": 10,
            "max_staleness": 2,
            "max_reuse": 3,
            "fragments_per_chunk": 2,
            "fragments_per_report": 5,
            "database_config": {"path": "rel/dir", "num_shards": 3},
            "seed": 4,
        }
    )
    assert c.max_chunks == 10 and c.fragments_per_chunk == 2 and c.num_shards == 3 and c.seed == 4
    assert c.path.endswith("rel/dir") and c.path.startswith("/")  # absolute, whoever opens it
    with pytest.raises(ValueError):
        buffer_config({"max_chunks": 0, "max_staleness": 1, "max_reuse": 1})
