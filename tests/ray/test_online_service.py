"""Online rollout buffers in the Ray service: producers of different speeds and lengths, version
bumps mid-rollout, groups completed out of order, a producer killed mid-group, a service restart."""

import os
import time

import pytest
from ray_fixtures import start_ray, wait_restarted

import replaystore as rs
from replaystore.online import RolloutBufferConfig, VersionRange

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray()
    yield ray
    ray.shutdown()


def make_producer(ray):
    @ray.remote(num_cpus=0)
    class Producer:
        """Acquires two tickets at a time and interleaves their members so they complete out of order."""

        def __init__(self, oc, idx: int, lengths: list, step_s: float, keep_alive: float | None = None):
            self.oc, self.idx, self.lengths, self.step_s = oc, idx, lengths, step_s
            self.keep_alive = keep_alive  # renew each ticket this often (a live producer under a short TTL)

        def run(self, pairs: int) -> int:
            from replaystore.online import KeepAlive

            sent = 0
            for p in range(pairs):
                a, b = self.oc.acquire(2, timeout=60, holder=f"p{self.idx}")
                # one KeepAlive per ticket: renewal stops once its ticket's group completed
                alive = [KeepAlive(self.oc, [t], every=self.keep_alive) for t in (a, b) if self.keep_alive]
                try:
                    for gid, member in ((a, 0), (b, 0), (b, 1), (a, 1)):  # b completes before a
                        length = self.lengths[(p + member) % len(self.lengths)]
                        rng = VersionRange.start(self.oc.version)
                        time.sleep(length * self.step_s)  # the trainer may move on meanwhile
                        rng = rng.observe(self.oc.version)
                        self.oc.add({"g": gid, "p": self.idx, "m": member}, group=gid, versions=rng, length=length)
                        sent += 1
                finally:
                    for k in alive:
                        k.close()
            return sent

        def start_group_and_hang(self) -> int:
            [t] = self.oc.acquire(1, timeout=30, holder="doomed")
            self.oc.add({"g": t}, group=t, length=1)
            return t

    return Producer


def serve(name, housekeeping_period=0.2, **cfg):
    from replaystore import ray as rsr

    return rsr.serve(
        name=name, online={"rollouts": RolloutBufferConfig(**cfg)}, housekeeping_period=housekeeping_period
    )


def test_service_api_and_bad_input(ray_local):
    svc = serve("online-api", capacity=16, batch_size=2, max_staleness=1, group_size=2)
    oc = svc.online("rollouts")
    try:
        a, b = oc.acquire(2, timeout=5)
        assert oc.add("x", group=a) == "pending"
        before = oc.stats()
        for call, err in (
            (lambda: oc.add("y", group=a, versions=(2, 1)), rs.InvalidRequest),
            (lambda: oc.add("y", group=999), rs.UnknownTicket),
            (lambda: oc.add("y", group=a, group_size=17), rs.InvalidRequest),
            (lambda: oc.acquire(-1), rs.InvalidRequest),
            (lambda: oc.acquire(1.5), rs.InvalidRequest),
            (lambda: oc.finish([12345]), rs.UnknownTicket),
            (lambda: oc.finish([a]), rs.InvalidRequest),  # its group finishes it
            (lambda: oc.sample(0), rs.InvalidRequest),
            (lambda: oc.acquire(3, timeout=0.2), rs.Timeout),
        ):
            with pytest.raises(err):
                call()
        after = oc.stats()
        for k in ("rollouts_added", "pending_rollouts", "groups", "generated_by_length"):
            assert after[k] == before[k]
        assert after["budget"]["running"] == before["budget"]["running"] == 2
        assert oc.add("y", group=a) == "complete"
        oc.finish([b], accepted=False)  # budget-only use: rollout b stored elsewhere, rejected
        assert oc.sample(1, timeout=5).data == ["x", "y"]
        with pytest.raises(rs.Timeout):
            oc.sample(1, timeout=0.2)
        assert oc.set_version(1) == 0 and oc.version == 1
        assert "rollouts" in svc.stats()["online"]
        assert oc.report()["online/trained_staleness/0"] == 2.0
    finally:
        svc.shutdown()


@pytest.mark.parametrize("pick,staleness", [("fifo", 1), ("in_order", 2)])
def test_async_producers_with_pacing_train_nothing_stale_and_drop_nothing(ray_local, pick, staleness):
    batch, steps = 4, 8
    svc = serve(
        f"online-pace-{pick}",
        capacity=64,
        batch_size=batch,
        max_staleness=staleness,
        group_size=2,
        pick=pick,
        length_buckets=(8, 32),
    )
    oc = svc.online("rollouts")
    Producer = make_producer(ray_local)
    # different speeds and lengths; 16 pairs = 32 groups = steps * batch
    producers = [
        Producer.remote(oc, 0, [2, 3], 0.002),
        Producer.remote(oc, 1, [40, 4], 0.002),
        Producer.remote(oc, 2, [60], 0.001),
    ]
    runs = [p.run.remote(n) for p, n in zip(producers, (6, 6, 4))]
    try:
        for v in range(steps):
            b = oc.sample(batch, timeout=60)
            assert len(b) == batch and (b.staleness("min") <= staleness).all(), b.staleness()
            for g in b.groups:  # whole groups of one ticket
                assert len(g.members) == 2 and {m.data["g"] for m in g.members} == {g.group_id}
                assert sorted(m.data["m"] for m in g.members) == [0, 1]
            bs = oc.stats()["budget"]
            assert bs["running"] + bs["accepted"] <= bs["limit"]  # the budget is never exceeded
            time.sleep(0.01)
            oc.set_version(v + 1)
        assert sum(ray_local.get(runs, timeout=60)) == 4 * 16
        s = oc.stats()
        assert s["rollouts_dropped"] == 0 and s["groups_sampled"] == steps * batch
        assert max(int(k) for k in s["trained_staleness"]) <= staleness
        assert s["generated_by_length"] == s["trained_by_length"]  # nothing lost, no length bias
    finally:
        svc.shutdown()


def test_drop_only_drops_long_rollouts(ray_local):
    """Without pacing, a rollout that spans a weight update is stale at ``max_staleness=0`` and
    dropped: long rollouts (which span updates) go, short ones mostly stay, and the buckets show it."""
    batch, steps = 4, 8
    svc = serve(
        "online-drop", capacity=64, batch_size=batch, max_staleness=0, pacing=False, group_size=1, length_buckets=(8,)
    )
    oc = svc.online("rollouts")

    @ray_local.remote(num_cpus=0)
    def produce(oc, length, n, spans_update):
        for _ in range(n):
            v0 = oc.version
            deadline = time.time() + 20
            if spans_update:  # a long rollout: the trainer moves on while it is generated
                while oc.version == v0 and time.time() < deadline:
                    time.sleep(0.01)
            else:
                time.sleep(length * 0.002)
            oc.add(length, versions=(v0, oc.version), length=length)

    runs = [produce.remote(oc, 2, 50, False), produce.remote(oc, 50, 4, True)]
    try:
        for v in range(steps):
            b = oc.sample(batch, timeout=60)
            assert (b.staleness() == 0).all()
            oc.set_version(v + 1)
        deadline = time.time() + 60
        while ray_local.wait(runs, num_returns=2, timeout=0.2)[1]:  # a slow machine: keep the versions
            assert time.time() < deadline  # moving until the long producer is done (its rollouts all span one)
            v += 1
            oc.set_version(v + 1)
        s = oc.stats()
        dropped, made, trained = s["dropped_by_length"], s["generated_by_length"], s["trained_by_length"]
        assert made[">=8"] == 4 and dropped[">=8"] == 4 and ">=8" not in trained  # every long one dropped
        assert dropped.get("0-7", 0) < made["0-7"] and trained["0-7"] == batch * steps
        assert s["dropped"]["stale"] == sum(dropped.values())
    finally:
        svc.shutdown()


def test_producer_killed_mid_group_gives_its_ticket_back(ray_local):
    # the TTL is the only way the dead producer's ticket comes back: short, but long enough for its
    # acquire-then-add on a loaded machine; the healthy producer renews its tickets meanwhile
    svc = serve("online-kill", capacity=32, batch_size=2, max_staleness=1, group_size=2, ticket_ttl=3.0)
    oc = svc.online("rollouts")
    Producer = make_producer(ray_local)
    doomed = Producer.remote(oc, 9, [1], 0.0)
    t = ray_local.get(doomed.start_group_and_hang.remote(), timeout=30)
    ray_local.kill(doomed)
    try:
        healthy = Producer.remote(oc, 0, [1, 2], 0.001, keep_alive=0.2)
        run = healthy.run.remote(3)  # needs the dead producer's capacity back after 2 pairs
        got = []
        for v in range(3):
            b = oc.sample(2, timeout=30)
            assert all(len(g.members) == 2 for g in b.groups) and t not in b.group_ids
            got += b.group_ids
            oc.set_version(v + 1)
        assert ray_local.get(run, timeout=60) == 12
        s = oc.stats()
        assert s["groups_dropped_expired"] == 1 and s["budget"]["expired"] == 1
        with pytest.raises(rs.UnknownTicket):
            oc.add({"late": True}, group=t)
    finally:
        svc.shutdown()


def test_service_restart_keeps_tickets_groups_and_counters(ray_local, tmp_path):
    from replaystore import ray as rsr

    cfg = RolloutBufferConfig(
        capacity=32,
        batch_size=2,
        max_staleness=1,
        group_size=2,
        ticket_ttl=120,
        path=str(tmp_path / "rl"),
        clear_on_start=True,
    )
    svc = rsr.serve(name="online-restart", online={"rollouts": cfg}, max_restarts=1)
    oc = svc.online("rollouts")
    try:
        a, b, c = oc.acquire(3, timeout=5)
        oc.add("a0", group=a)
        assert oc.add_group(b, ["b0", "b1"]) == "complete"  # one call, one transaction
        oc.set_version(1)
        oc.add("c0", group=c, versions=(0, 1), index=0)
        before = oc.stats()
        ray_local.kill(svc.actor, no_restart=False)
        wait_restarted(svc)
        after = oc.stats()
        assert after["restarts"] == 1
        for k in ("version", "groups", "pending_groups", "pending_rollouts", "rollouts_added"):
            assert after[k] == before[k], k
        assert after["budget"]["running"] == 2
        # the producers retry the calls whose answers they may have missed: nothing is duplicated
        assert oc.add_group(b, ["b0", "b1"]) == "complete"
        assert oc.add("c0", group=c, versions=(0, 1), index=0) == "pending"
        assert oc.stats()["rollouts_added"] == before["rollouts_added"]
        assert oc.add("a1", group=a) == "complete"
        assert oc.add_group(c, ["c0", "c1"], member_versions=[(0, 1), 1]) == "complete"
        assert sorted(oc.sample(3, timeout=5).group_ids) == [a, b, c]
        assert os.path.isdir(cfg.path)
    finally:
        svc.shutdown()


def test_workflow_calls_on_the_service(ray_local):
    """add_group, admission versions, version signals, reject, over-provisioning, pause, bare tickets."""
    import asyncio
    import threading

    svc = serve("online-workflow", capacity=64, batch_size=2, max_staleness=1, group_size=2)
    oc = svc.online("rollouts")
    try:
        oc.set_version(2)
        a, b = oc.acquire(2, timeout=5, holder="p")
        assert a.version == b.version == 2 and oc.version_of(int(a)) == 2 and oc.held(a)
        assert oc.add_group(a, ["a0", "a1"], versions=(a.version, 2)) == "complete"
        assert oc.add_group(a, ["a0", "a1"]) == "complete"  # retried: nothing twice
        oc.reject(a, "zero_variance")  # scored: every reward equal
        oc.renew(b)  # a bare ticket
        oc.add_group(b, ["b0", "b1"])
        assert oc.sample(1, timeout=5).group_ids == [b]
        with pytest.raises(rs.AlreadySampled):
            oc.reject(b, "late")
        with pytest.raises(rs.InvalidRequest):
            oc.add_group(99, ["x"])  # wrong number of members
        s = oc.stats()
        assert s["rejected"] == {"zero_variance": 1} and s["rollouts_added"] == 4 and s["groups_rejected"] == 1
        # over-provisioning: 1 needed + 2 extra; once 1 completes, the others are cancelled
        x, y, z = oc.acquire(1, timeout=5, overprovision=2)
        oc.add_group(y, ["y0", "y1"])
        with pytest.raises(rs.TicketCancelled):
            oc.add("late", group=x)
        assert not oc.held(z) and oc.stats()["budget"]["cancelled"] == 2
        oc.pause()
        with pytest.raises(rs.InvalidRequest):
            oc.pause()
        assert oc.try_acquire(1) == []
        oc.resume()
        # version signals: a blocking wait and the async iterator, both answered by set_version
        got = []
        th = threading.Thread(target=lambda: got.append(oc.wait_for_version(4, timeout=30)))
        th.start()

        saw_3 = threading.Event()

        async def follow():
            seen = []
            async for v in oc.versions(after=2, poll=1.0):
                seen.append(v)
                if v == 3:
                    saw_3.set()
                if v >= 4:
                    return seen

        def bump():  # 4 only once 3 was seen (two changes between two reads would yield the newest only)
            oc.set_version(3)
            if saw_3.wait(60):
                oc.set_version(4)

        bumper = threading.Thread(target=bump)
        bumper.start()
        assert asyncio.run(follow()) == [3, 4]
        th.join(30)
        bumper.join(30)
        assert got == [4]
        assert oc.wait_for_version(1, timeout=0) == 4  # reached long ago: at once
        with pytest.raises(rs.Timeout):
            oc.wait_for_version(9, timeout=0.2)
    finally:
        svc.shutdown()


def test_expiry_is_judged_at_the_call_without_other_traffic(ray_local):
    svc = serve(
        "online-ttl-clock",
        housekeeping_period=3600,
        capacity=16,
        batch_size=2,
        max_staleness=0,
        group_size=2,
        ticket_ttl=2.0,  # (the add below comes within it, even on a loaded machine)
    )
    oc = svc.online("rollouts")
    try:
        [t] = oc.acquire(1, timeout=5)
        oc.add("first", group=t)
        time.sleep(2.5)  # past the TTL (a duration to let pass, not a synchronisation): no call meanwhile
        with pytest.raises(rs.UnknownTicket):
            oc.renew([t])
        with pytest.raises(rs.UnknownTicket):
            oc.add("second", group=t)
        s = oc.stats()
        assert s["groups_dropped_expired"] == 1 and s["budget"]["expired"] == 1 and s["budget"]["accepted"] == 0
    finally:
        svc.shutdown()


def test_producer_killed_while_waiting_for_a_version_gives_its_tickets_back(ray_local):
    # a TTL the holder's acquire-then-add and the check below fit in, even on a loaded machine
    svc = serve("online-kill-wait", capacity=32, batch_size=2, max_staleness=0, group_size=2, ticket_ttl=4.0)
    oc = svc.online("rollouts")

    @ray_local.remote(num_cpus=0)
    class Waiter:
        def __init__(self, oc):
            self.oc = oc

        def hold(self):
            tickets = self.oc.acquire(1, timeout=10, holder="doomed", overprovision=1)
            self.oc.add("partial", group=tickets[0])
            return [int(t) for t in tickets]

        def wait(self):
            return self.oc.wait_for_version(99, timeout=60)

    w = Waiter.remote(oc)
    try:
        held = ray_local.get(w.hold.remote(), timeout=30)
        assert oc.try_acquire(1) == []  # the budget (2) is spent by the over-provisioned pair
        w.wait.remote()
        time.sleep(0.2)
        ray_local.kill(w)
        got = oc.acquire(2, timeout=60)  # back after their TTL
        assert len(got) == 2
        s = oc.stats()
        assert s["budget"]["expired"] == 2 and s["groups_dropped_expired"] == 1
        with pytest.raises(rs.UnknownTicket):
            oc.add("late", group=held[1])
    finally:
        svc.shutdown()


def test_grpo_dapo_overprovision_example_smoke(ray_local):
    """examples/grpo_dapo_overprovision.py --smoke on the running Ray: every mode trains, DAPO rejects
    count, over-provisioned tickets are cancelled (and they are the long ones more often)."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "grpo_dapo_overprovision.py")
    spec = importlib.util.spec_from_file_location("grpo_dapo_overprovision", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    results = ex.main(["--smoke"])
    assert set(results) == {"base", "dapo", "dapo+over"}
    for mode, r in results.items():
        s, p = r["stats"], r["producers"]
        assert s["groups_sampled"] == 4 * 4 and s["rollouts_dropped"] == sum(s["dropped_by_length"].values())
        assert max(int(k) for k in s["trained_staleness"]) <= 1
        assert s["groups_rejected"] == p["rejected"] and (mode != "base" or p["rejected"] == 0)
        # (a producer counts every ticket it stops decoding once its batch is full, the service the
        # ones it cancelled: equal in every run but one seen, where the producers counted 8 and the
        # service 7 under CI load; a ticket can also end by its TTL or be finished elsewhere)
        assert (p["cancelled"] > 0) == (mode == "dapo+over") == (s["tickets_cancelled"] > 0)
        assert s["tickets_cancelled"] <= p["cancelled"]
        assert r["zero_adv_trained"] == 0 or mode == "base"
