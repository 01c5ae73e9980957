"""The episode index against a plain reference: a Python list of steps per stream.

A hypothesis state machine writes interleaved streams (batches, single steps, whole episodes,
episode ends, long runs of one stream that are deleted again), deletes, bumps the version
(staleness drops and refusals), samples with ``max_times_sampled``, clears, and round-trips the
table through a checkpoint, on a small table with a FIFO or a non-FIFO remover (``Lifo``,
``MinHeap``, ``Uniform``: old steps outlive many newer ones of their stream). After every step
the table's episode ids, positions and flags, ``episode_info`` of every live key, its set of valid
strict starts, its n-step transitions for every live start and its complete episodes must equal
the reference's; public sampling draws only valid starts and, uniform, reaches every one of them.
"""

import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import replaystore as rs
from replaystore.episodes.nstep import plan_checked, plan_gapless, plan_nstep, plan_runs
from replaystore.episodes.sequences import ends_valid, exact_valid_starts, gapless_ends_valid
from replaystore.episodes.whole import complete_episodes

CAP = 12
STREAMS = 3
GAMMA = 0.5


class Ref:
    """Steps as plain dicts, per stream, in position order."""

    def __init__(self):
        self.streams = {}  # s -> list of step dicts (index = t)
        self.open = {}  # s -> episode id of the open episode, or None
        self.next_ep = 0
        self.by_key = {}

    def write(self, rows, keys, new_episode=False):
        """rows: list of (stream, term, trunc, reward); keys: table keys (-1: refused)."""
        seen_first = set()
        for (s, term, trunc, reward), key in zip(rows, keys):
            lst = self.streams.setdefault(s, [])
            ep = self.open.get(s)
            if ep is None or (new_episode and s not in seen_first):
                ep = self.next_ep
                self.next_ep += 1
            seen_first.add(s)
            pos = 0 if not lst or lst[-1]["ep"] != ep else lst[-1]["pos"] + 1
            stp = {
                "key": key,
                "s": s,
                "t": len(lst),
                "ep": ep,
                "pos": pos,
                "term": term,
                "trunc": trunc,
                "r": reward,
                "live": key >= 0,
            }
            lst.append(stp)
            if key >= 0:
                self.by_key[key] = stp
            self.open[s] = None if (term or trunc) else ep

    def end(self, s, truncated):
        if self.open.get(s) is None:
            return 0
        last = self.streams[s][-1]
        if last["live"]:
            last["trunc" if truncated else "term"] = True
        self.open[s] = None
        return 1

    def sync_live(self, live_keys):
        live = set(live_keys)
        for k, stp in self.by_key.items():
            stp["live"] = k in live

    def step_at(self, s, t):
        lst = self.streams.get(s, [])
        return lst[t] if 0 <= t < len(lst) and lst[t]["live"] else None

    def valid_starts(self, width, burn_in):
        out = set()
        for stp in self.by_key.values():
            if not stp["live"]:
                continue
            w = [self.step_at(stp["s"], stp["t"] - burn_in + j) for j in range(width)]
            if all(x is not None and x["ep"] == stp["ep"] for x in w):
                out.add(stp["key"])
        return out

    def nstep(self, stp, n, has_next):
        """(k, return, done, boot_key, boot_field) or None when the start has no transition."""
        run = []
        for j in range(n + 1):
            x = self.step_at(stp["s"], stp["t"] + j)
            if x is None or x["ep"] != stp["ep"]:
                break
            run.append(x)
        if has_next:
            k = 0
            for x in run[:n]:
                k += 1
                if x["term"] or x["trunc"]:
                    break
            last = run[k - 1]
            done = last["term"]
            boot = (last["key"], "next_obs")
        else:
            k, done, boot = 0, False, None
            for j, x in enumerate(run[:n]):
                if x["term"]:
                    k, done, boot = j + 1, True, (x["key"], "obs")
                    break
                if x["trunc"]:
                    k, boot = j, (x["key"], "obs")
                    break
                if j + 1 < len(run):
                    k, boot = j + 1, (run[j + 1]["key"], "obs")
                else:
                    break
            if k == 0:
                return None
        ret = sum(GAMMA**i * run[i]["r"] for i in range(k))
        return k, ret, done, boot

    def info(self, key):
        """``episode_info`` of a live key: (stream, t, pos, length, closed, complete, term, trunc, is_last)."""
        x = self.by_key[key]
        steps = [y for y in self.streams[x["s"]] if y["ep"] == x["ep"]]
        last = steps[-1]
        closed = self.open.get(x["s"]) != x["ep"]
        if not closed:
            length = len(steps)
        else:
            length = last["pos"] + 1 if last["live"] else -1
        ended = closed and last["live"]
        return (
            x["s"],
            x["t"],
            x["pos"],
            length,
            closed,
            closed and all(y["live"] for y in steps),
            ended and last["term"],
            ended and last["trunc"] and not last["term"],
            x["term"] or x["trunc"],
        )

    def complete(self):
        eps = {}
        for lst in self.streams.values():
            for x in lst:
                eps.setdefault(x["ep"], []).append(x)
        out = set()
        for ep, xs in eps.items():
            if all(x["live"] for x in xs) and (xs[-1]["term"] or xs[-1]["trunc"]) and self.open.get(xs[-1]["s"]) != ep:
                out.add(tuple(x["key"] for x in xs))
        return out


class EpisodeMachine(RuleBasedStateMachine):
    @initialize(
        has_next=st.booleans(),
        mts=st.sampled_from([0, 0, 3]),
        prio=st.booleans(),
        remover=st.sampled_from(["fifo", "fifo", "lifo", "minheap", "uniform"]),
    )
    def setup(self, has_next, mts, prio, remover):
        self.has_next = has_next
        self.prio = prio
        self.dir = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
        self.saves = 0
        # with prio: prioritized sequences of a fixed window (3 steps, 1 of burn-in)
        sampler = rs.Prioritized(alpha=1.0) if prio else None
        ep = rs.Episodes(
            next_obs_field="next_obs" if has_next else None,
            sequence_length=3 if prio else None,
            burn_in=1 if prio else 0,
        )
        rem = {"fifo": rs.Fifo, "lifo": rs.Lifo, "minheap": rs.MinHeap, "uniform": rs.Uniform}[remover]()
        self.t = rs.Table(
            CAP, sampler=sampler, remover=rem, episodes=ep, max_staleness=1, max_times_sampled=mts, seed=0
        )
        self.ref = Ref()
        self.next_id = 0

    def _data(self, n, rewards):
        ids = np.arange(self.next_id, self.next_id + n)
        self.next_id += n
        return {"obs": ids.astype(np.float64), "next_obs": ids + 0.5, "reward": np.asarray(rewards, float)}

    @rule(
        rows=st.lists(
            st.tuples(st.integers(0, STREAMS - 1), st.booleans(), st.booleans(), st.integers(-3, 3), st.booleans()),
            min_size=1,
            max_size=5,
        )
    )
    def extend(self, rows):
        stale = [r[4] for r in rows]
        versions = [self.t.version - 2 if s else self.t.version for s in stale]
        term = [r[1] and r[3] % 2 == 0 for r in rows]
        trunc = [r[2] and r[3] % 3 == 0 for r in rows]
        data = self._data(len(rows), [r[3] for r in rows])
        keys = self.t.extend_steps(
            data,
            streams=[r[0] for r in rows],
            terminated=term,
            truncated=trunc,
            version=versions,
            priorities=[1.0 + abs(r[3]) for r in rows],
        )
        assert ((keys == -1) == np.asarray(stale)).all()
        self.ref.write([(r[0], a, b, r[3]) for r, a, b in zip(rows, term, trunc)], keys.tolist())

    @rule(s=st.integers(0, STREAMS - 1), reward=st.integers(-2, 2), term=st.booleans())
    def add_one(self, s, reward, term):
        key = self.t.add_step({k: v[0] for k, v in self._data(1, [reward]).items()}, stream=s, terminated=term)
        self.ref.write([(s, term, False, reward)], [key])

    @rule(s=st.integers(0, STREAMS + 1), n=st.integers(1, 6), trunc=st.booleans())
    def add_episode(self, s, n, trunc):
        if self.ref.open.get(s) is not None:
            return
        keys = self.t.add_episode(self._data(n, np.arange(n) % 3), stream=s, terminated=not trunc, truncated=trunc)
        self.ref.write(
            [(s, False, False, i % 3) for i in range(n - 1)] + [(s, not trunc, trunc, (n - 1) % 3)],
            keys.tolist(),
            new_episode=True,
        )

    @rule(s=st.integers(0, STREAMS + 2), trunc=st.booleans())
    def end(self, s, trunc):
        if s not in self.ref.streams:
            try:
                self.t.end_episode(s, truncated=trunc)
            except rs.UnknownStream:
                return
            raise AssertionError("end_episode of an unknown stream did not raise")
        assert self.t.end_episode(s, truncated=trunc) == self.ref.end(s, trunc)

    @rule(frac=st.floats(0, 1), seed=st.integers(0, 1000))
    def delete(self, frac, seed):
        keys = self.t.keys()
        if len(keys):
            pick = np.random.default_rng(seed).random(len(keys)) < frac * 0.5
            self.t.delete(keys[pick])

    @rule(s=st.integers(0, STREAMS - 1), n=st.integers(1, 80), keep=st.integers(0, 2))
    def long_run(self, s, n, keep):
        """``n`` steps of stream ``s``, all but the first ``keep`` deleted: old steps fall far behind."""
        for i in range(0, n, 8):  # batches a non-FIFO table accepts (<= capacity)
            m = min(8, n - i)
            keys = self.t.extend_steps(self._data(m, np.arange(m) % 2), streams=s, priorities=np.full(m, 0.5))
            self.ref.write([(s, False, False, j % 2) for j in range(m)], keys.tolist())
            drop = keys[keep:] if i == 0 else keys
            self.t.delete(drop[drop >= 0])

    @rule()
    def checkpoint(self):
        self.saves += 1
        path = self.dir / f"ck{self.saves}"
        self.t.save(path)
        self.t = rs.Table.load(path)
        shutil.rmtree(path)

    @rule()
    def clear(self):
        self.t.clear()

    @rule(n=st.integers(1, 3))
    def sample_public(self, n):
        """Public sampling draws only valid starts; uniform strict starts reach every valid one."""
        t, ref = self.t, self.ref
        ref.sync_live(t.keys().tolist())
        width, burn_in = (3, 1) if self.prio else (n, 0)
        valid = ref.valid_starts(width, burn_in)
        if t.max_times_sampled:
            return  # a draw retires starts: covered by the sample rule
        try:
            got = t.sample_sequences(400, width - burn_in, burn_in=burn_in, timeout=0)
        except (rs.NoValidSequence, rs.Timeout):  # Timeout: an empty table
            assert not valid
        else:
            drawn = set(got.keys.tolist())
            assert drawn <= valid
            if not self.prio:  # uniform over <= 12 starts, 400 draws: a miss has probability < 1e-13
                assert drawn == valid
        live = [k for k in t.keys().tolist() if ref.nstep(ref.by_key[k], n, self.has_next) is not None]
        try:
            got = t.sample_nstep(400, n, GAMMA, timeout=0)
        except (rs.NoValidSequence, rs.Timeout):  # (without next_obs the redraws may give up)
            assert not live or not self.has_next
        else:
            assert set(got.keys.tolist()) <= set(live)
            for key, k, ret in zip(got.keys.tolist(), got.steps.tolist(), got.returns.tolist()):
                r = ref.nstep(ref.by_key[key], n, self.has_next)
                assert k == r[0] and abs(ret - r[1]) < 1e-9

    def teardown(self):
        shutil.rmtree(getattr(self, "dir", "/nonexistent"), ignore_errors=True)

    @rule()
    def bump_version(self):
        self.t.set_version(self.t.version + 1)

    @rule(seed=st.integers(0, 100))
    def reprioritize(self, seed):
        keys = self.t.keys()
        if len(keys):
            self.t.update_priorities(keys, np.random.default_rng(seed).uniform(0.5, 2.0, len(keys)))

    @rule(length=st.integers(1, 3))
    def sample(self, length):
        if self.prio:
            length = 2  # the table's window: 1 burn-in + 2
        try:
            self.t.sample_sequences(2, length, burn_in=1 if self.prio else 0, timeout=0)
        except (rs.NoValidSequence, rs.Timeout):
            pass

    @invariant()
    def matches_reference(self):
        t, ref = self.t, self.ref
        ref.sync_live(t.keys().tolist())
        idx = t._episodes
        live_keys = t.keys()
        slots = t._index.lookup(live_keys)
        # per-step structure (episode ids up to renaming)
        ren = {}
        for k, sl in zip(live_keys.tolist(), slots.tolist()):
            x = ref.by_key[k]
            assert (idx.streams(sl), idx.positions(sl), idx.pos_of[sl]) == (x["s"], x["t"], x["pos"])
            assert ren.setdefault(int(idx.episode_of[sl]), x["ep"]) == x["ep"]
            assert bool(idx.flags[sl] & 1) == x["term"] and bool(idx.flags[sl] & 2) == x["trunc"]
        assert len(set(ren.values())) == len(ren)
        # episode_info of every live key
        info = t.episode_info(live_keys)
        assert info.found.all()
        got = list(
            zip(
                *(
                    getattr(info, f).tolist()
                    for f in (
                        "streams",
                        "stream_positions",
                        "positions",
                        "lengths",
                        "closed",
                        "complete",
                        "terminated",
                        "truncated",
                        "is_last",
                    )
                )
            )
        )
        assert got == [ref.info(k) for k in live_keys.tolist()]
        # valid strict starts
        for width, burn_in in ((1, 0), (2, 0), (3, 1), (4, 2)):
            got = set(t._index.key_of_slot[exact_valid_starts(idx, width, burn_in)].tolist())
            assert got == ref.valid_starts(width, burn_in), (width, burn_in)
        # n-step of every live start
        if len(slots):
            n = 3
            win, k, done, boot = plan_nstep(idx, slots, n, self.has_next)
            obs_or_next = t.storage.columns["next_obs" if self.has_next else "obs"]
            rew = t.storage.columns["reward"]
            for i, key in enumerate(live_keys.tolist()):
                r = ref.nstep(ref.by_key[key], n, self.has_next)
                if r is None:
                    assert k[i] == 0
                    continue
                kk, ret, dn, (bkey, _) = r
                assert (k[i], bool(done[i])) == (kk, dn), key
                got_ret = sum(GAMMA**j * rew[win[i, j]] for j in range(k[i]))
                assert abs(got_ret - ret) < 1e-9
                assert t._index.key_of_slot[boot[i]] == bkey
                assert obs_or_next[boot[i]] == obs_or_next[t._index.lookup([bkey])[0]]
            # the fast planners (consecutive slots, gapless rings) give exactly the verified result
            ref_plan = plan_checked(idx, slots, n, self.has_next)
            used = np.arange(n) < ref_plan[1][:, None]
            for plan in (plan_runs, plan_gapless):
                got = plan(idx, slots, n, self.has_next)
                if got is None:  # plan_gapless: some stream has a gap
                    assert not idx.gapless(idx.streams(slots)).all()
                    continue
                np.testing.assert_array_equal(np.where(used, got[0], -1), np.where(used, ref_plan[0], -1))
                for a, b in zip(got[1:], ref_plan[1:]):
                    np.testing.assert_array_equal(a, b)
        # tracked window (prioritized): valid set, and tree mass = priority exactly on valid starts
        if self.prio:
            val = idx.validity
            got = set(t._index.key_of_slot[val.valid.contents()].tolist())
            assert got == ref.valid_starts(3, 1)
            leaves = t.sampler._sum[slots + len(t.sampler._sum) // 2]
            want = np.where(np.isin(live_keys, list(got)), t._priority[slots], 0.0)
            np.testing.assert_allclose(leaves, want)
        # gapless streams (the sequence sampler's fast path): every position from the oldest live
        # step on is live, and the unverified ring entries are those steps
        for s in range(STREAMS + 3):
            if s >= idx.n_streams:
                continue
            lst = ref.streams.get(s, [])
            n_live = sum(x["live"] for x in lst)
            assert idx.n_live[s] == n_live, s
            if n_live:  # gapless exactly when no hole follows the oldest live step (oldest_t is exact then)
                first = min(tt for tt, x in enumerate(lst) if x["live"])
                assert idx.gapless(np.array([s]))[0] == all(x["live"] for x in lst[first:]), (
                    s,
                    [x["live"] for x in lst],
                    idx.n_live[s],
                    idx.oldest_t[s],
                    idx.next_t[s],
                )
            if n_live and idx.gapless(np.array([s]))[0]:
                lo, hi = int(idx.oldest_t[s]), len(lst)
                assert all(lst[tt]["live"] for tt in range(lo, hi)), s
                got = idx.ring_window(np.array([s]), np.array([lo]), hi - lo)[0]
                want = [t._index.lookup([lst[tt]["key"]])[0] for tt in range(lo, hi)]
                assert got.tolist() == want, s
        # the gapless end test agrees with the verified one for every live step of a gapless stream
        if len(slots):
            on = slots[idx.gapless(idx.streams(slots))]
            for width, burn_in in ((1, 0), (2, 0), (3, 1), (4, 2)):
                fast = gapless_ends_valid(idx, on, idx.streams(on), idx.positions(on) - burn_in, width)
                np.testing.assert_array_equal(fast, ends_valid(idx, on, width, burn_in))
        # complete episodes
        ids, bounds, eslots = complete_episodes(idx)
        got = {tuple(t._index.key_of_slot[eslots[bounds[i] : bounds[i + 1]]].tolist()) for i in range(len(ids))}
        assert got == ref.complete()


EpisodeMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
TestEpisodes = EpisodeMachine.TestCase
