"""Multi-agent tables through the Ray service and a sharded table: the same MultiAgentTable code
over a ReplayClient and a ShardedClient (real local Ray, one instance for the module)."""

import uuid

import numpy as np
import pytest
from ray_fixtures import start_ray

import replaystore as rs
from replaystore import ray as rsr
from replaystore.multiagent import MultiAgentTable

pytestmark = pytest.mark.timeout(240)

AGENTS = ("a", "b", "c")


def agent_steps(t, alive, last):
    return {
        a: {
            "obs": np.array([t, i], np.float32),
            "action": t % 3,
            "reward": float(t + i),
            "next_obs": np.array([t + 1, i], np.float32),
            "terminated": last,
            "truncated": False,
        }
        for i, a in enumerate(AGENTS)
        if a in alive
    }


def alive_at(t):
    return AGENTS[: 1 + t % 3]


def prioritized_table():
    return rs.Table(1000, sampler=rs.Prioritized(alpha=1.0, beta=0.0), episodes=rs.Episodes(), seed=0)


@pytest.fixture(scope="module")
def ray_mod():
    try:
        yield start_ray(namespace=f"ma-{uuid.uuid4().hex[:8]}")
    finally:  # also when start_ray failed half-way
        import ray

        ray.shutdown()


def fill(ma, streams=(0, 1, 2, 3), length=7):
    keys = []
    for s in streams:
        for t in range(length):
            keys.append(ma.add_step(agent_steps(t, alive_at(t), t == length - 1), stream=s, timeout=10))
    return np.array(keys)


def check_exact(ma, keys, p, alpha, rounds=5):
    pa = np.where(np.isnan(p), 0.0, np.where(np.isnan(p), 1.0, p) ** alpha)
    exact = pa / pa.sum()
    pos = {k: j for j, k in enumerate(keys.tolist())}
    for _ in range(rounds):
        b = ma.sample(64, timeout=10)
        rows = np.array([pos[k] for k in b.keys.tolist()])
        np.testing.assert_allclose(b.probabilities, exact[rows, b.agents], rtol=1e-9)
        assert np.array_equal(b.data["obs"][:, 1], b.agents)


def per_agent_updates(ma, keys):
    data, found = ma.table.get(keys)
    assert found.all()
    p = np.where(data["alive"], 1.0, np.nan)
    rng = np.random.default_rng(0)
    k, a = np.nonzero(data["alive"])
    vals = rng.uniform(0.5, 4.0, len(k))
    ma.update_priorities(keys[k], vals, agents=a)
    p[k, a] = vals
    return p


def test_served_table_every_sampling_mode(ray_mod):
    client = rsr.serve({"ma": prioritized_table}, name=f"ma-{uuid.uuid4().hex[:6]}")
    try:
        ma = MultiAgentTable(client.table("ma"), AGENTS, priorities="agents", alpha=0.5, seed=0)
        keys = fill(ma)
        p = per_agent_updates(ma, keys)
        check_exact(ma, keys, p, 0.5)
        n = ma.sample_nstep(32, 3, 0.5, timeout=10)
        assert (n.steps >= 1).all() and (n.steps <= 3).all()
        j = ma.sample_joint(16, timeout=10)
        got, _ = ma.table.get(j.keys)
        assert np.array_equal(j.mask, got["alive"]) and j.data["obs"].shape == (16, 3, 2)
        with pytest.raises(rs.UnknownAgent):
            ma.add_step({"zz": agent_steps(0, "a", False)["a"]}, stream=0, timeout=10)
        assert len(ma.table) == len(keys)
    finally:
        client.shutdown()


def uniform_table():
    return rs.Table(1000, episodes=rs.Episodes(), seed=0)


def test_served_joint_sequences(ray_mod):
    client = rsr.serve({"ma": uniform_table}, name=f"mas-{uuid.uuid4().hex[:6]}")
    try:
        ma = MultiAgentTable(client.table("ma"), AGENTS, seed=0)
        fill(ma)
        s = ma.sample_joint_sequences(8, 3, burn_in=1, timeout=10)
        assert s.data["obs"].shape == (8, 4, 3, 2) and s.mask.shape == (8, 4, 3)
        assert (np.diff(s.data["obs"][:, :, 0, 0], axis=1) == 1).all()
        with pytest.raises(rs.NoValidSequence):
            ma.sample_joint_sequences(8, 9, timeout=10)
    finally:
        client.shutdown()


@pytest.fixture(scope="module")
def sharded(ray_mod):
    c = None
    try:
        c = rsr.serve_sharded(
            prioritized_table, 2, name=f"mash-{uuid.uuid4().hex[:6]}", seed=0, consistency="exact", defer_updates=False
        )
        yield c
    finally:
        if c is not None:
            c.shutdown()


def test_sharded_episodes_stay_on_one_shard_and_probabilities_are_exact(sharded):
    ma = MultiAgentTable(sharded, AGENTS, priorities="agents", alpha=0.7, seed=0)
    keys = fill(ma, length=5)
    shards = (keys >> 40) & 0xFF
    assert np.array_equal(shards, np.repeat(np.arange(4) % 2, 5))  # a stream's rows (all agents) on one shard
    p = per_agent_updates(ma, keys)
    check_exact(ma, keys, p, 0.7)
    j = ma.sample_joint(16, timeout=10)
    assert j.mask.shape == (16, 3) and j.data["obs"][:, 0, 1].tolist() == [0] * 16


def test_sharded_nstep_reads_the_episode_on_its_shard(sharded):
    ma = MultiAgentTable(sharded, AGENTS, priorities="agents", seed=0)
    fill(ma, streams=(10, 11, 12, 13), length=5)
    n = ma.sample_nstep(8, 3, 0.9, timeout=10)
    assert (n.steps >= 1).all() and (n.steps <= 3).all()


def test_wal_served_table_logs_multiagent_steps_and_replays_them(ray_mod, tmp_path):
    from replaystore.ray import WalConfig

    cfg = WalConfig(dir=str(tmp_path / "wal"), fsync="never")
    name = f"maw-{uuid.uuid4().hex[:6]}"
    client = rsr.serve({"ma": uniform_table}, name=name, wal=cfg)
    try:
        keys = fill(MultiAgentTable(client.table("ma"), AGENTS, seed=0), length=4)
    finally:
        client.shutdown()
    client = rsr.serve({"ma": uniform_table}, name=name, wal=cfg)  # replays the log
    try:
        ma = MultiAgentTable(client.table("ma"), AGENTS, seed=0)
        assert sorted(ma.table.keys().tolist()) == sorted(keys.tolist())
        j = ma.sample_joint(8, timeout=10)
        got, _ = ma.table.get(j.keys)
        assert np.array_equal(j.mask, got["alive"])
        s = ma.sample_joint_sequences(4, 3, timeout=10)
        assert (np.diff(s.data["obs"][:, :, 0, 0], axis=1) == 1).all()
    finally:
        client.shutdown()


def test_wal_served_per_agent_priorities_are_replayed(ray_mod, tmp_path):
    """Per-agent priorities are rows rewritten through the log (update_fields): a restarted service
    under a fresh MultiAgentTable draws every (step, agent) pair with the probability set before."""
    from replaystore.ray import WalConfig

    cfg = WalConfig(dir=str(tmp_path / "wal"), fsync="never")
    name = f"mawp-{uuid.uuid4().hex[:6]}"
    client = rsr.serve({"ma": prioritized_table}, name=name, wal=cfg)
    try:
        ma = MultiAgentTable(client.table("ma"), AGENTS, priorities="agents", alpha=0.6, seed=0)
        keys = fill(ma, length=4)
        p = per_agent_updates(ma, keys)
    finally:
        client.shutdown()
    client = rsr.serve({"ma": prioritized_table}, name=name, wal=cfg)  # replays the log
    try:
        fresh = MultiAgentTable(client.table("ma"), AGENTS, priorities="agents", alpha=0.6, seed=1)
        check_exact(fresh, keys, p, 0.6)
    finally:
        client.shutdown()
