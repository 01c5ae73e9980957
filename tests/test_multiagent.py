"""Multi-agent tables (replaystore.multiagent) on an in-process Table and a SharedTable.

Statistical tests use fixed seeds; their bounds are chi-square quantiles at one-sided p = 1e-6
(Wilson-Hilferty), so a correct implementation fails about once in a million runs.
"""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore.multiagent import AgentLayout, MultiAgentTable

AGENTS = ("a", "b", "c")
FIELDS = {
    "obs": ((2,), np.float32),
    "action": ((), np.int64),
    "reward": ((), np.float64),
    "next_obs": ((2,), np.float32),
    "terminated": ((), bool),
    "truncated": ((), bool),
}
GLOBALS = {"state": ((4,), np.float32)}
_names = itertools.count()


def chi2_upper(df, z=4.7534):
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def agent_step(t, agent, reward=1.0, terminated=False, truncated=False):
    i = AGENTS.index(agent)
    return {
        "obs": np.array([t, i], np.float32),
        "action": t % 5,
        "reward": reward,
        "next_obs": np.array([t + 1, i], np.float32),
        "terminated": terminated,
        "truncated": truncated,
    }


@pytest.fixture(params=["local", "shared"])
def make_ma(request, tmp_path):
    """``make_ma(capacity, sampler, priorities=..., episodes=..., **ma_kw)`` -> MultiAgentTable."""
    from replaystore.shared import SharedTable

    opened = []

    def build(capacity=1000, sampler=None, episodes=None, **kw):
        kw.setdefault("seed", 1)
        episodes = episodes or rs.Episodes(max_streams=8)
        spec = AgentLayout(AGENTS, fields=FIELDS, global_fields=GLOBALS).spec(kw.get("priorities") == "agents")
        if request.param == "local":
            table = rs.Table(capacity, sampler=sampler, episodes=episodes, seed=0)
        else:
            table = SharedTable.create(
                f"ma{next(_names)}",
                capacity,
                spec,
                sampler=sampler,
                episodes=episodes,
                seed=0,
                directory=tmp_path,
            )
            opened.append(table)
        return MultiAgentTable(table, AGENTS, fields=FIELDS, global_fields=GLOBALS, **kw)

    yield build
    for t in opened:
        t.close()


def fill(ma, episodes=((0, 8),), alive=lambda t: AGENTS):
    keys = []
    for stream, length in episodes:
        for t in range(length):
            last = t == length - 1
            step = {a: agent_step(t, a, terminated=last) for a in alive(t)}
            keys.append(ma.add_step(step, stream=stream, state={"state": np.full(4, t, np.float32)}))
    return np.array(keys)


def test_rows_hold_every_agent_with_alive_and_state_once(make_ma):
    ma = make_ma()
    keys = fill(ma, alive=lambda t: ("a", "b") if t < 3 else ("a", "c"))
    data, found = ma.table.get(keys)
    assert found.all()
    assert data["obs"].shape == (8, 3, 2) and data["state"].shape == (8, 4)
    assert data["alive"][:3].tolist() == [[True, True, False]] * 3
    assert data["alive"][3:].tolist() == [[True, False, True]] * 5
    assert (data["obs"][:3, 2] == 0).all() and (data["obs"][3:, 1] == 0).all()  # absent agents: zeros
    assert data["obs"][5, 2].tolist() == [5, 2]
    info = ma.table.episode_info(keys)
    assert info.is_last.tolist() == [False] * 7 + [True] and info.terminated[-1]


def test_pettingzoo_parallel_step_output_is_accepted(make_ma):
    ma = make_ma()
    obs = {a: np.array([0, i], np.float32) for i, a in enumerate(AGENTS)}
    actions = {"a": 1, "c": 2}  # b is dead: it does not act
    out = (
        {a: obs[a] + 1 for a in actions},
        {"a": 0.5, "c": -1.0},
        {"a": False, "c": True},
        {"a": False, "c": False},
        {"a": {}, "c": {}},
    )
    key = ma.add_parallel_step(obs, actions, out, stream=3, state={"state": np.ones(4, np.float32)})
    data, _ = ma.table.get([key])
    assert data["alive"][0].tolist() == [True, False, True]
    assert data["reward"][0].tolist() == [0.5, 0.0, -1.0] and data["terminated"][0].tolist() == [False, False, True]
    assert data["action"][0].tolist() == [1, 0, 2]
    with pytest.raises(rs.MissingAgent):
        ma.add_parallel_step(obs, {"a": 1, "b": 0}, out, stream=3, state={"state": np.ones(4, np.float32)})


def _snapshot(ma):
    return len(ma.table), ma.table.stats()["inserts"]


@pytest.mark.parametrize(
    "bad, error",
    [
        (lambda: ({"z": agent_step(0, "a")}, {"state": np.zeros(4)}), rs.UnknownAgent),
        (lambda: ({"a": agent_step(0, "a"), "c": agent_step(0, "c")}, {"state": np.zeros(4)}), rs.MissingAgent),
        (lambda: ({"a": agent_step(0, "a"), "b": {**agent_step(0, "b"), "obs": np.zeros(3)}}, {"state": np.zeros(4)}),
         rs.AgentShapeMismatch),
        (lambda: ({"a": {**agent_step(0, "a"), "obs": np.zeros(3)}, "b": {**agent_step(0, "b"), "obs": np.zeros(3)}},
                  {"state": np.zeros(4)}), rs.AgentShapeMismatch),
        (lambda: ({"a": agent_step(0, "a"), "b": {k: v for k, v in agent_step(0, "b").items() if k != "action"}},
                  {"state": np.zeros(4)}), rs.MultiAgentError),
        (lambda: ({"a": {**agent_step(0, "a"), "alive": True}, "b": {**agent_step(0, "b"), "alive": True}},
                  {"state": np.zeros(4)}), rs.MultiAgentError),
        (lambda: ({}, {"state": np.zeros(4)}), rs.MultiAgentError),
        (lambda: ({"a": agent_step(0, "a"), "b": agent_step(0, "b")}, {"other": np.zeros(4)}), rs.MultiAgentError),
    ],
    ids=["unknown-agent", "missing-required", "shapes-differ", "shape-vs-table", "fields-differ", "reserved",
         "empty", "global-fields"],
)  # fmt: skip
def test_bad_steps_raise_named_errors_and_write_nothing(make_ma, bad, error):
    ma = make_ma(required=("a", "b"))
    fill(ma, episodes=((0, 3),), alive=lambda t: ("a", "b"))
    before = _snapshot(ma)
    step, state = bad()
    with pytest.raises(error):
        ma.add_step(step, stream=0, state=state)
    assert _snapshot(ma) == before


def test_bad_priority_writes_nothing(make_ma):
    ma = make_ma(sampler=rs.Prioritized(alpha=1.0, beta=0.0), priorities="agents")
    before = _snapshot(ma)
    with pytest.raises(rs.InvalidPriority):
        ma.add_step({"a": agent_step(0, "a")}, state={"state": np.zeros(4)}, priority=-1.0)
    with pytest.raises(rs.UnknownAgent):
        ma.add_step({"a": agent_step(0, "a")}, state={"state": np.zeros(4)}, priority={"q": 1.0})
    assert _snapshot(ma) == before


def test_agents_mode_needs_a_prioritized_alpha_one_sampler():
    t = rs.Table(10, sampler=rs.Prioritized(alpha=0.6), episodes=rs.Episodes())
    with pytest.raises(rs.MultiAgentError):
        MultiAgentTable(t, AGENTS, priorities="agents")
    with pytest.raises(rs.MultiAgentError):
        MultiAgentTable(rs.Table(10, episodes=rs.Episodes()), AGENTS).update_priorities([0], [1.0], agents=["a"])


def pairs_alive(t):
    return AGENTS[: 1 + t % 3]  # 1, 2 or 3 agents alive


def test_independent_draws_are_uniform_over_alive_pairs(make_ma):
    ma = make_ma(sampler=rs.Prioritized(alpha=1.0, beta=0.0), priorities="agents", alpha=0.0, beta=1.0)
    keys = fill(ma, episodes=((0, 12), (1, 9)), alive=pairs_alive)
    data, _ = ma.table.get(keys)
    n_pairs = int(data["alive"].sum())
    index = {
        (k, i): j for j, (k, i) in enumerate((k, i) for k, row in zip(keys, data["alive"]) for i in np.flatnonzero(row))
    }
    counts = np.zeros(n_pairs)
    for _ in range(40):
        b = ma.sample(256)
        assert np.allclose(b.probabilities, 1.0 / n_pairs) and np.allclose(b.weights, 1.0)
        got, _ = ma.table.get(b.keys)
        assert got["alive"][np.arange(256), b.agents].all()  # only alive agents are drawn
        assert np.array_equal(b.data["obs"][:, 1], b.agents)  # the drawn agent's own data
        for k, i in zip(b.keys.tolist(), b.agents.tolist()):
            counts[index[(k, i)]] += 1
    expected = counts.sum() / n_pairs
    assert ((counts - expected) ** 2 / expected).sum() < chi2_upper(n_pairs - 1)


def test_per_agent_priorities_give_exact_probabilities_and_weights(make_ma):
    alpha, beta = 0.7, 0.5
    ma = make_ma(sampler=rs.Prioritized(alpha=1.0, beta=0.0), priorities="agents", alpha=alpha, beta=beta)
    keys = fill(ma, episodes=((0, 10),), alive=pairs_alive)
    data, _ = ma.table.get(keys)
    p = np.where(data["alive"], 1.0, np.nan)
    rng = np.random.default_rng(0)
    uk = np.repeat(keys, 3)
    ua = np.tile(np.arange(3), len(keys))
    ok = data["alive"].reshape(-1)
    vals = rng.uniform(0.1, 5.0, ok.sum())
    assert ma.update_priorities(uk[ok], vals, agents=ua[ok]) == len(keys)
    p[data["alive"]] = vals
    ma.update_priorities([keys[0]], [9.0])  # joint update: every alive agent of the step
    p[0, data["alive"][0]] = 9.0
    assert_exact_pairs(ma, keys, p, alpha, beta)


def assert_exact_pairs(ma, keys, p, alpha, beta, rounds=40):
    """Every draw's probability and weight are exact, and the counts fit them (chi-square, p = 1e-6)."""
    pa = np.where(np.isnan(p), 0, p) ** alpha
    exact = pa / pa.sum()
    pos = {k: j for j, k in enumerate(keys.tolist())}
    counts = np.zeros_like(exact)
    for _ in range(rounds):
        b = ma.sample(256)
        rows = np.array([pos[k] for k in b.keys.tolist()])
        want = exact[rows, b.agents]
        assert np.allclose(b.probabilities, want, rtol=1e-9)
        assert np.allclose(b.weights, (want / want.min()) ** -beta)
        np.add.at(counts, (rows, b.agents), 1)
    m = exact > 0
    e = exact[m] * counts.sum()
    assert ((counts[m] - e) ** 2 / e).sum() < chi2_upper(m.sum() - 1)
    assert counts[~m].sum() == 0


def test_per_agent_priorities_survive_a_checkpoint_and_a_new_wrapper(make_ma, tmp_path):
    """The per-agent values live in the row (update_fields): a restored table under a fresh
    MultiAgentTable (or another handle of a shared table) draws the same (step, agent) pairs."""
    alpha, beta = 0.7, 0.5
    ma = make_ma(sampler=rs.Prioritized(alpha=1.0, beta=0.0), priorities="agents", alpha=alpha, beta=beta)
    keys = fill(ma, episodes=((0, 6), (1, 6)), alive=pairs_alive)
    data, _ = ma.table.get(keys)
    p = np.where(data["alive"], 1.0, np.nan)
    k, a = np.nonzero(data["alive"])
    vals = np.random.default_rng(3).uniform(0.1, 5.0, len(k))
    ma.update_priorities(keys[k[::2]], vals[::2], agents=a[::2])  # (positions)
    p[k[::2], a[::2]] = vals[::2]
    ma.update_priorities(keys[k[1::2]], vals[1::2], agents=[AGENTS[i] for i in a[1::2]])  # (ids)
    p[k[1::2], a[1::2]] = vals[1::2]
    ma.table.save(tmp_path / "ckpt")
    restored = rs.Table.load(tmp_path / "ckpt")
    fresh = MultiAgentTable(restored, AGENTS, priorities="agents", alpha=alpha, beta=beta, seed=5)
    assert_exact_pairs(fresh, keys, p, alpha, beta, rounds=30)
    again = MultiAgentTable(ma.table, AGENTS, priorities="agents", alpha=alpha, beta=beta, seed=6)
    again.update_priorities(keys[:1], [2.0], agents=["a"])  # a step the fresh object never sampled: read from the row
    p[0, 0] = 2.0
    assert_exact_pairs(ma, keys, p, alpha, beta, rounds=10)  # the first object sees the other's update


def test_joint_priorities_mode_draws_steps_then_alive_agents(make_ma):
    ma = make_ma()  # Uniform table, priorities="joint"
    keys = fill(ma, episodes=((0, 9),), alive=pairs_alive)
    data, _ = ma.table.get(keys)
    n_alive = dict(zip(keys.tolist(), data["alive"].sum(1)))
    b = ma.sample(512)
    assert np.allclose(b.probabilities, [1 / 9 / n_alive[k] for k in b.keys.tolist()])
    j = ma.sample_joint(64)
    got, _ = ma.table.get(j.keys)
    assert np.array_equal(j.mask, got["alive"]) and j.data["obs"].shape == (64, 3, 2)
    assert np.allclose(j.probabilities, 1 / 9)
    ma.update_priorities(keys[:2], [1.0, 2.0])  # passes through to the table


def model_nstep(rows, start, agent, n, gamma):
    """Plain loop: rows is the list of step dicts of one episode."""
    ret, k, done, nxt = 0.0, 0, False, None
    for j in range(n):
        t = start + j
        if t >= len(rows) or agent not in rows[t]:
            break
        s = rows[t][agent]
        ret += gamma**j * s["reward"]
        k += 1
        nxt = s["next_obs"]
        if s["terminated"]:
            done = True
            break
        if s["truncated"]:
            break
    return ret, k, done, nxt


def test_nstep_per_agent_stops_at_its_own_end(make_ma):
    ma = make_ma()
    rng = np.random.default_rng(3)
    rows = []
    for t in range(12):  # b dies at 4 (terminated), c joins at 3 and is truncated at 9, a lives on
        step = {"a": agent_step(t, "a", reward=float(rng.normal()), truncated=t == 11)}
        if t <= 4:
            step["b"] = agent_step(t, "b", reward=float(rng.normal()), terminated=t == 4)
        if 3 <= t <= 9:
            step["c"] = agent_step(t, "c", reward=float(rng.normal()), truncated=t == 9)
        rows.append(step)
        ma.add_step(step, stream=2, state={"state": np.full(4, t, np.float32)})
    for n in (1, 3, 5):
        b = ma.sample_nstep(200, n, 0.9)
        j = ma.sample_joint(50, n=n, gamma=0.9)
        for i in range(200):
            t, agent = int(b.data["obs"][i, 0]), AGENTS[b.agents[i]]
            ret, k, done, nxt = model_nstep(rows, t, agent, n, 0.9)
            assert b.returns[i] == pytest.approx(ret) and b.steps[i] == k and b.done[i] == done
            assert np.array_equal(b.next_obs[i], nxt)
            assert b.discount[i] == pytest.approx(0.0 if done else 0.9**k)
        for i in range(50):
            t = int(j.data["state"][i, 0])
            for ai, agent in enumerate(AGENTS):
                if j.mask[i, ai]:
                    ret, k, done, _ = model_nstep(rows, t, agent, n, 0.9)
                    assert j.returns[i, ai] == pytest.approx(ret) and j.steps[i, ai] == k and j.done[i, ai] == done
                else:
                    assert j.steps[i, ai] == 0 and j.returns[i, ai] == 0
    with pytest.raises(rs.MultiAgentError):
        ma.sample_nstep(4, 0, 0.9)


def test_joint_sequences_with_burn_in_and_too_short_episodes(make_ma):
    ma = make_ma()
    fill(ma, episodes=((0, 6), (1, 6)), alive=lambda t: ("a", "b") if t < 4 else ("a",))
    s = ma.sample_joint_sequences(16, 3, burn_in=2)
    assert s.data["obs"].shape == (16, 5, 3, 2) and s.mask.shape == (16, 5, 3)
    t = s.data["obs"][:, :, 0, 0]
    assert (np.diff(t, axis=1) == 1).all()  # consecutive steps of one episode
    assert np.array_equal(s.mask[:, :, 1], t < 4) and not s.mask[:, :, 2].any()
    one = ma.sample_sequences(16, 3, burn_in=2)
    assert one.data["obs"].shape == (16, 5, 2) and one.mask.shape == (16, 5)
    assert one.mask[:, 2].all()  # alive at the start after the burn-in
    reader = MultiAgentTable(ma.table, AGENTS, seed=0)  # a reader that never wrote: fields found by shape
    r = reader.sample_sequences(4, 3, burn_in=2)
    assert r.data["obs"].shape == (4, 5, 2) and r.data["state"].shape == (4, 5, 4)
    assert reader.sample(4).data["state"].shape == (4, 4)
    samples = ma.table.stats()["samples"]
    with pytest.raises(rs.NoValidSequence):
        ma.sample_joint_sequences(4, 5, burn_in=2)
    assert ma.table.stats()["samples"] == samples


class PlainModel:
    """Per-agent priorities as plain dicts over the live steps (FIFO eviction)."""

    def __init__(self, capacity):
        self.capacity, self.steps = capacity, {}

    def add(self, key, alive, p0):
        self.steps[key] = {a: p0 for a in alive}
        while len(self.steps) > self.capacity:
            self.steps.pop(min(self.steps))

    def probabilities(self, alpha):
        mass = {(k, a): p**alpha for k, d in self.steps.items() for a, p in d.items()}
        total = sum(mass.values())
        return {pair: m / total for pair, m in mass.items()}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.sets(st.integers(0, 2), min_size=1)),
            st.tuples(st.just("update"), st.floats(0.1, 10.0), st.booleans()),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_per_agent_priorities_match_a_plain_model(ops):
    alpha = 0.5
    table = rs.Table(6, sampler=rs.Prioritized(alpha=1.0, beta=0.0), episodes=rs.Episodes(), seed=0)
    ma = MultiAgentTable(table, AGENTS, priorities="agents", alpha=alpha, beta=1.0, seed=0)
    model = PlainModel(6)
    max_p, t = 1.0, 0
    for op in ops:
        if op[0] == "add":
            alive = sorted(op[1])
            key = ma.add_step({AGENTS[i]: agent_step(t, AGENTS[i]) for i in alive}, stream=0)
            model.add(key, alive, max_p)
            t += 1
        elif model.steps:
            b = ma.sample(4)
            exact = model.probabilities(alpha)
            for k, a, p in zip(b.keys.tolist(), b.agents.tolist(), b.probabilities):
                assert p == pytest.approx(exact[(k, a)], rel=1e-9)
            value, joint = op[1], op[2]
            if joint:
                ma.update_priorities(b.keys[:1], [value])
                for a in model.steps[int(b.keys[0])]:
                    model.steps[int(b.keys[0])][a] = value
            else:
                ma.update_priorities(b.keys[:2], [value, value / 2], agents=b.agents[:2])
                for k, a, v in zip(b.keys[:2].tolist(), b.agents[:2].tolist(), [value, value / 2]):
                    model.steps[k][a] = v
            max_p = max(max_p, value)
    if model.steps:
        b = ma.sample(64)
        exact = model.probabilities(alpha)
        assert set(zip(b.keys.tolist(), b.agents.tolist())) <= set(exact)
        for k, a, p in zip(b.keys.tolist(), b.agents.tolist(), b.probabilities):
            assert p == pytest.approx(exact[(k, a)], rel=1e-9)


def test_an_empty_table_times_out():
    ma = MultiAgentTable(rs.Table(10, episodes=rs.Episodes()), AGENTS)
    for sample in (ma.sample, ma.sample_joint, lambda b, timeout: ma.sample_joint_sequences(b, 2, timeout=timeout)):
        with pytest.raises(rs.Timeout):
            sample(2, timeout=0.05)
    assert ma.table.stats()["samples"] == 0


def test_checkpoint_keeps_rows_and_streams(tmp_path):
    table = rs.Table(100, sampler=rs.Prioritized(alpha=1.0, beta=0.0), episodes=rs.Episodes(), seed=0)
    ma = MultiAgentTable(table, AGENTS, priorities="agents", alpha=1.0, global_fields=["state"], seed=0)
    keys = fill(ma, episodes=((0, 5),), alive=pairs_alive)
    ma.update_priorities(keys[:2], [3.0, 5.0], agents=["a", "a"])
    table.save(tmp_path / "ckpt")
    loaded = rs.Table.load(tmp_path / "ckpt")
    again = MultiAgentTable(loaded, AGENTS, priorities="agents", alpha=1.0, global_fields=["state"], seed=0)
    a, _ = table.get(keys)
    b, _ = loaded.get(keys)
    for f in a:
        np.testing.assert_equal(a[f], b[f])  # agent_priority holds NaN for absent agents
    assert np.allclose(loaded.info(keys)["priorities"], table.info(keys)["priorities"])
    key = again.add_step({"a": agent_step(5, "a")}, stream=0, state={"state": np.zeros(4, np.float32)})
    assert loaded.episode_info([key]).positions[0] == 0  # a new episode after the terminated step 4
    j = again.sample_joint(8)
    assert j.data["obs"].shape == (8, 3, 2)


def test_add_steps_writes_a_vectorised_env_in_one_call(make_ma):
    ma = make_ma()
    for t in range(4):
        steps = [{a: agent_step(t, a, terminated=t == 3) for a in AGENTS[: e + 1]} for e in range(3)]
        keys = ma.add_steps(steps, streams=[0, 1, 2], states=[{"state": np.full(4, t, np.float32)}] * 3)
        assert len(keys) == 3
    info = ma.table.episode_info(keys)
    assert info.streams.tolist() == [0, 1, 2] and info.terminated.all() and (info.positions == 3).all()
    data, _ = ma.table.get(keys)
    assert data["alive"].sum(1).tolist() == [1, 2, 3]
    before = _snapshot(ma)
    bad = [{"a": agent_step(4, "a")}, {"zz": agent_step(4, "a")}]
    with pytest.raises(rs.UnknownAgent):
        ma.add_steps(bad, streams=[0, 1], states=[{"state": np.zeros(4)}] * 2)
    with pytest.raises(rs.MultiAgentError):
        ma.add_steps(bad[:1], streams=[0, 1])
    assert _snapshot(ma) == before


def test_joint_priorities_give_the_tables_exact_probabilities(make_ma):
    alpha, beta = 0.6, 0.4
    ma = make_ma(sampler=rs.Prioritized(alpha=alpha, beta=beta))
    keys = fill(ma, episodes=((0, 9),), alive=pairs_alive)
    td = np.linspace(0.5, 4.0, len(keys))
    assert ma.update_priorities(keys, td) == len(keys)  # e.g. VDN's joint TD errors
    exact = td**alpha / (td**alpha).sum()
    weights = (len(keys) * exact) ** -beta
    pos = {k: j for j, k in enumerate(keys.tolist())}
    data, _ = ma.table.get(keys)
    n_alive = data["alive"].sum(1)
    counts = np.zeros(len(keys))
    for _ in range(40):
        j = ma.sample_joint(256)
        rows = np.array([pos[k] for k in j.keys.tolist()])
        assert np.allclose(j.probabilities, exact[rows])
        assert np.allclose(j.weights, weights[rows] / weights.max())
        np.add.at(counts, rows, 1)
        b = ma.sample(64)  # independent draws from the same table: P(step) / n_alive
        brows = np.array([pos[k] for k in b.keys.tolist()])
        assert np.allclose(b.probabilities, exact[brows] / n_alive[brows])
    e = exact * counts.sum()
    assert ((counts - e) ** 2 / e).sum() < chi2_upper(len(keys) - 1)


def test_independent_prioritized_sequences_have_exact_pair_probabilities(make_ma):
    alpha = 0.5
    ma = make_ma(
        sampler=rs.Prioritized(alpha=1.0, beta=0.0),
        episodes=rs.Episodes(max_streams=8, sequence_length=3, burn_in=1),
        priorities="agents",
        alpha=alpha,
    )
    keys = fill(ma, episodes=((0, 10),), alive=pairs_alive)  # one closed episode of 10 steps
    data, _ = ma.table.get(keys)
    p = np.where(data["alive"], np.random.default_rng(1).uniform(0.5, 3.0, data["alive"].shape), np.nan)
    k, a = np.nonzero(data["alive"])
    ma.update_priorities(keys[k], p[k, a], agents=a)
    mass = np.where(np.isnan(p), 0.0, np.where(np.isnan(p), 1.0, p) ** alpha)
    valid = np.zeros(10, bool)
    valid[1:9] = True  # windows of 3 with 1 burn-in step: the step after the burn-in at positions 1..8
    step_p = np.where(valid, mass.sum(1), 0.0) / mass.sum(1)[valid].sum()
    pos = {key: j for j, key in enumerate(keys.tolist())}
    for _ in range(10):
        s = ma.sample_sequences(64, 2, burn_in=1)
        rows = np.array([pos[key] for key in s.keys.tolist()])
        assert valid[rows].all() and s.mask[:, 1].all()
        want = step_p[rows] * mass[rows, s.agents] / mass[rows].sum(1)
        np.testing.assert_allclose(s.probabilities, want, rtol=1e-9)
        assert np.array_equal(s.data["obs"][:, 1, 0], rows)  # the window's step after the burn-in
