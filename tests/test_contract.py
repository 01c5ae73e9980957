"""The declared contract of the Table's API, and every mode derived from it (issue 32, item 1).

No Ray is started here: these are checks of the classes (what is generated, with which
signatures); tests/conformance/ runs the calls in every mode.
"""

import asyncio
import inspect
import pydoc

import pytest

import replaystore as rs
from replaystore.table import contract

pytest.importorskip("ray")

from replaystore.ray import ReplayClient, ShardedClient  # noqa: E402
from replaystore.ray.server import ReplayServer  # noqa: E402
from replaystore.ray.sharded.server import SHARD_METHODS  # noqa: E402
from replaystore.shared import SharedTable  # noqa: E402
from replaystore.wal.logged import LoggedTable  # noqa: E402

#: public Table attributes that are not calls of the contract, and why
NOT_IN_CONTRACT = {
    # (the hooks of shared memory and the write-ahead log are not here: they are behind the Table's
    # host, replaystore.table.host.TableHost, and the log's view, replaystore.table.journal.Journal)
    # per mode by nature: a handle's own life, files, iteration, construction
    "close", "closed", "save", "load", "from_snapshot", "queue", "stack", "stats", "iterate",
    # configuration and gauges read as attributes
    "blocking_warning_s", "version", "max_priority", "episodic", "episodes",
}  # fmt: skip


def test_every_public_table_callable_is_in_the_contract_or_listed():
    public = {n for n in dir(rs.Table) if not n.startswith("_")}
    assert public - NOT_IN_CONTRACT == set(contract.CALLS), "a new Table method needs a contract.Call"
    assert set(contract.CALLS) <= public


#: issue 32 item 2: the Table's public surface is what users call (43 callables before the host)
MAX_PUBLIC_CALLABLES = 30


def test_the_tables_public_callables_are_what_users_call():
    public = [n for n in dir(rs.Table) if not n.startswith("_")]
    callables = [n for n in public if callable(getattr(rs.Table, n))]  # (properties and gauges are not)
    assert len(callables) <= MAX_PUBLIC_CALLABLES, sorted(callables)
    per_mode = {"close", "save", "load", "from_snapshot", "queue", "stack", "stats", "iterate"}
    assert set(callables) == set(contract.CALLS) | per_mode
    shared = {n for n in dir(SharedTable) if not n.startswith("_")}  # a shared table adds no state hooks
    hooks = {"guard_with", "state_scalars", "load_state_scalars", "scalar_parts", "before_publish"}
    assert not shared & (hooks | {"setup_outside_reads", "setup_reservations"})


@pytest.mark.parametrize("owner", [ReplayClient, ShardedClient, LoggedTable, SharedTable])
def test_every_mode_has_every_call_with_the_tables_parameters(owner):
    mode = getattr(owner, "MODE", "shared")
    for call in contract.CALLS.values():
        method = getattr(owner, call.name)
        want = list(call.signature().parameters)
        if owner is LoggedTable:  # it returns NumPy samples to the service (as_tensor is the client's)
            want = [p for p in want if p not in call.local]
        got = list(inspect.signature(method).parameters)
        assert got[: len(want)] == want, (owner.__name__, call.name, got)  # a mode may add options after
        if mode in call.refused:
            err, _ = call.refused[mode]
            with pytest.raises(err, match=call.name):
                method(None)


def test_generated_methods_show_the_tables_docstring_and_signature():
    for owner in (ReplayClient, LoggedTable):
        m = owner.info
        assert m.__doc__ == rs.Table.info.__doc__ and m.__qualname__ == f"{owner.__name__}.info"
    text = pydoc.render_doc(ReplayClient.sample_nstep, renderer=pydoc.plaintext)
    assert "sample_nstep(self, batch_size: 'int', n: 'int', gamma: 'float'" in text
    assert rs.Table.sample_nstep.__doc__.splitlines()[0] in text
    server = inspect.signature(ReplayServer.extend_steps)
    assert list(server.parameters)[:3] == ["self", "table", "steps"]
    assert inspect.iscoroutinefunction(ReplayServer.sample)


def test_logged_calls_are_logged_by_hand_and_reads_forwarded():
    for call in contract.CALLS.values():
        if call.logged:
            assert call.name in LoggedTable.__dict__ and LoggedTable.__dict__[call.name].__doc__ != call.method.__doc__
        else:
            assert not call.mutating, f"{call.name}: a mutating call the log does not record"


def test_shards_run_every_call_the_sharded_client_sends():
    sent = {c.name for c in contract.CALLS.values() if c.sharding != "client" and "sharded" not in c.refused}
    assert sent <= SHARD_METHODS
    assert all(c.sharding in contract.SHARDING for c in contract.CALLS.values())
    # no call of the contract falls to the placeholder of a missing sharded merge
    for call in contract.CALLS.values():
        if "sharded" not in call.refused:
            assert "no sharded dispatch" not in (getattr(ShardedClient, call.name).__doc__ or "")


def test_refusals_are_named_errors():
    for name, mode, err, why in contract.refusals():
        assert mode in contract.MODES and name in contract.CALLS and why
        assert issubclass(getattr(rs, err), rs.ReplayError)


def test_forward_builds_a_client_and_a_service_from_the_calls():
    sent, served = [], []

    class Client:
        MODE = "served"

        def keys(self):  # written by hand: left alone
            return "own"

    def send(client, name, call, args):
        sent.append((name, dict(args)))
        return call.name

    contract.forward(Client, send=send, prefix="p_")
    c = Client()
    assert c.sample(4, 1.5, as_tensor=False) == "sample" and c.keys() == "own"
    assert sent == [("p_sample", {"batch_size": 4, "timeout": 1.5})]  # local arguments stay on the client
    with pytest.raises(TypeError):
        c.sample()  # as the Table raises, and nothing sent
    with pytest.raises(rs.Unsupported, match="snapshot"):
        c.snapshot()
    assert len(sent) == 1 and inspect.signature(Client.sample) == inspect.signature(rs.Table.sample)
    assert Client.sample.__doc__ == rs.Table.sample.__doc__ and Client.sample.__qualname__.endswith("Client.sample")

    class Service:
        pass

    async def serve(service, call, which, args):
        served.append((call.name, which, dict(args)))
        return len(served)

    contract.forward(Service, {"peek": contract.CALLS["get"]}, serve=serve, prefix="t_", first="table")
    assert list(inspect.signature(Service.t_peek).parameters) == ["self", "table", "keys"]
    assert Service.t_peek.__name__ == "t_peek" and inspect.iscoroutinefunction(Service.t_peek)
    s = Service()
    assert asyncio.run(s.t_peek("a", [1])) == 1 and asyncio.run(s.t_peek(keys=[2], table="b")) == 2
    assert served == [("get", "a", {"keys": [1]}), ("get", "b", {"keys": [2]})]
