"""A shared table used from a Ray actor and a Ray task on the same node (handles attach by name)."""

import numpy as np
import pytest
from ray_fixtures import start_ray, transitions

import replaystore as rs
from replaystore.shared import SharedTable

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}


@pytest.fixture(scope="module")
def ray():
    ray = start_ray(namespace="shared-table-tests")
    yield ray
    ray.shutdown()


def test_ray_actor_writes_and_task_samples(ray, tmp_path):
    table = SharedTable.create("ray", 256, SPEC, sampler=rs.Prioritized(), directory=tmp_path)

    @ray.remote
    class Writer:
        def __init__(self, table):
            self.table = table  # unpickled: attached by name in the actor's process

        def write(self, start, n):
            return self.table.extend(transitions(n, start)).tolist()

        def close(self):
            self.table.close()

    @ray.remote
    def sample_ids(table, n):
        s = table.sample(n)
        assert (s.data["id"] == s.keys).all()
        table.update_priorities(s.keys[:1], [7.0])
        out = s.keys.tolist()
        table.close()
        return out

    writer = Writer.remote(table)
    assert ray.get(writer.write.remote(0, 50)) == list(range(50))
    keys = ray.get(sample_ids.remote(table, 32))
    assert len(keys) == 32 and set(keys) <= set(range(50))
    assert len(table) == 50 and table.stats()["samples"] == 32
    assert table.stats()["max_priority_seen"] == 7.0
    table.extend(transitions(2, 50))
    assert ray.get(writer.write.remote(52, 3)) == [52, 53, 54]
    ray.get(writer.close.remote())
    data, found = table.get(table.keys())
    assert found.all() and (data["obs"][:, 0] == data["id"]).all()
    table.close()
