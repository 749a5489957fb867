"""bench/load_gen.py's server-sent event reader: JSON payloads in order across read boundaries, `[DONE]` and SSE
comment events (a `:` line, the keep-alive a server may send while a request waits) skipped, any other
non-JSON payload a one-line error naming the event."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("load_gen", os.path.join(ROOT, "bench", "load_gen.py"))
load_gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(load_gen)


class Chunks:
    """A response whose read1() hands out the given byte strings, then b""."""

    def __init__(self, chunks):
        self.chunks = list(chunks)

    def read1(self, n):
        return self.chunks.pop(0) if self.chunks else b""


def test_comments_and_done_skipped_payloads_in_order_across_reads():
    stream = b':\n\ndata: {"a": 1}\n\n: keep-alive\n\ndata: {"b": [2, 3]}\n\ndata: [DONE]\n\n'
    cuts = [0, 1, 9, 17, 30, 44, len(stream)]  # splits inside a comment, a payload and the separators
    events = list(load_gen.sse_events(Chunks(stream[a:b] for a, b in zip(cuts, cuts[1:]))))
    assert events == [{"a": 1}, {"b": [2, 3]}]


def test_non_json_payload_is_an_error_naming_the_event():
    with pytest.raises(SystemExit, match="not JSON.*oops"):
        list(load_gen.sse_events(Chunks([b'data: {"a": 1}\n\ndata: oops\n\n'])))
