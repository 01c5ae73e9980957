"""Shared helpers of the MineStudio compat tests (no tests here): realistic fragments, a producer actor."""

import os
import sys
import uuid

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ray"))

from ray_fixtures import start_ray  # noqa: E402

from replaystore.compat.minestudio import FragmentMetadata, SampleFragment  # noqa: E402

T = 64  # steps per fragment
IMG = (128, 128, 3)


def make_fragment(worker_uuid: str, fid: int, version: int, t: int = T, img=IMG) -> SampleFragment:
    """A fragment of MineStudio's shape; ``reward`` holds the version, ``first[0]`` is True."""
    rng = np.random.default_rng(fid)
    first = np.zeros(t, bool)
    first[0] = True
    return SampleFragment(
        obs={"image": rng.integers(0, 255, (t, *img), dtype=np.uint8)},
        action={"buttons": np.zeros((t, 1), np.int64), "camera": np.full((t, 1), fid, np.int64)},
        next_done=np.zeros(t, bool),
        reward=np.full(t, version, np.float32),
        first=first,
        in_state=[np.zeros((1, 1, 32), bool), np.ones((1, 32, 256), np.float32), np.ones((1, 32, 256), np.float32)],
        worker_uuid=worker_uuid,
        fid_in_worker=fid,
        next_obs={"image": np.zeros(img, np.uint8)},
        episode_uuids=[str(uuid.uuid4())] * t,
    )


class Producer:
    """A rollout worker stand-in: ``num_envs`` streams, each numbering its fragments from 0."""

    def __init__(self, num_envs: int, name: str = "replay_buffer", t: int = T, img=IMG):
        from replaystore.compat.minestudio import ReplayBufferInterface

        self.buffer = ReplayBufferInterface(name=name)
        self.uuids = [str(uuid.uuid4()) for _ in range(num_envs)]
        self.next_fid = dict.fromkeys(self.uuids, 0)
        self.t, self.img = t, img

    def produce(self, per_env: int, version: int, session: str) -> list:
        out = []
        for _ in range(per_env):
            for w in self.uuids:
                fid = self.next_fid[w]
                self.next_fid[w] += 1
                out.append(
                    self.buffer.add_fragment(
                        make_fragment(w, fid, version, self.t, self.img), FragmentMetadata(version, session, w, fid)
                    )
                )
        return out

    def store_is_local(self) -> bool:
        return self.buffer.store.local


def config(path, **kw):
    c = {
        "max_chunks": 12,
        "max_staleness": 1,
        "max_reuse": 2,
        "fragments_per_chunk": 2,
        "fragments_per_report": 8,
        "database_config": {"path": str(path), "num_shards": 2},
        "seed": 0,
        "orphan_grace": 0.0,
    }
    c.update(kw)
    return c


__all__ = ["Producer", "config", "make_fragment", "start_ray"]
