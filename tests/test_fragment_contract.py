"""The fragment service's forwarded calls, derived from replaystore.fragments.contract (no Ray started)."""

import inspect
import pydoc

import pytest

pytest.importorskip("ray")
pytest.importorskip("lmdb")

from replaystore.fragments import FragmentBuffer  # noqa: E402
from replaystore.fragments.contract import CALLS, CLIENT  # noqa: E402
from replaystore.ray.fragments.client import FragmentClient  # noqa: E402
from replaystore.ray.fragments.service import FragmentService  # noqa: E402
from replaystore.ray.server import ReplayServer  # noqa: E402


def _signature(method):
    """The method's signature without the ``_ray_trace_ctx`` keyword Ray adds to an actor class's
    methods once any test has made it an actor (``ray.remote`` patches the class in place)."""
    sig = inspect.signature(method)
    return sig.replace(parameters=[p for p in sig.parameters.values() if p.name != "_ray_trace_ctx"])


@pytest.mark.parametrize("served", sorted(CALLS))
def test_a_served_call_is_the_buffer_method_under_its_declared_name(served):
    call = CALLS[served]
    want = inspect.signature(getattr(FragmentBuffer, call.name))
    for owner in (FragmentService, ReplayServer):  # the actor class inherits it
        method = getattr(owner, served)
        assert inspect.iscoroutinefunction(method)  # the async actor never blocks its loop on it
        assert _signature(method) == want and method.__doc__ == getattr(FragmentBuffer, call.name).__doc__
        assert method.__name__ == served
    if served in CLIENT:
        method = FragmentClient.__dict__[served]
        assert inspect.signature(method) == want and method.__qualname__ == f"FragmentClient.{served}"


def test_help_shows_the_generated_calls_with_the_buffers_docs():
    text = pydoc.render_doc(FragmentClient, renderer=pydoc.plaintext)
    assert "update_model_version(self, session: 'str', version: 'int', now: 'float | None' = None) -> 'int'" in text
    assert "drop every chunk and partial chunk that became stale" in text
    assert set(CLIENT) <= set(CALLS) and "fetch" not in CALLS  # fetches wait: written by hand


def test_a_call_of_the_wrong_shape_fails_on_the_client_before_any_ray_call():
    fc = FragmentClient(actor=None, name="nowhere")  # a TypeError, as the buffer would raise, not a Ray error
    with pytest.raises(TypeError):
        fc.update_model_version("s")
    with pytest.raises(TypeError):
        fc.drain(1)
