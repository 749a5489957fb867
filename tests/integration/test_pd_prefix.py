"""The prefill role with its prefix cache on, behind `sglang-router --pd-disaggregation`: a second request that
shares a long prefix with earlier ones hits on the prefill instance (its prompt is computed from the cached pages
and KDA state snapshot on), the hand-off moves the whole prompt's state (cached pages included), and the decode
output still equals a colocated server without a prefix cache, bit for bit (text, float32 logprobs)."""
import pytest

from conftest import Server
from test_pd_router import GRID, Router, chat, same_logprobs

NO_CACHE = GRID
CACHE = [a for a in GRID if a != "--no-prefix-cache"]
PREFIX = "You are a careful assistant for the harbour office. " * 12
# KDA state is restorable at snapshots (prompt ends, chunk-grid branch points): the second request makes the
# branch point of the shared prefix, the third hits on it, the fourth repeats the first (its prompt end).
ASKS = [PREFIX + "How many ships came in today?", PREFIX + "Which ship left first?",
        PREFIX + "Which flags did they fly?", PREFIX + "How many ships came in today?"]


@pytest.fixture(scope="module", params=["tcp", "shm"])
def pd(request):
    env = {"UCX_TLS": request.param}
    servers = []
    try:
        for args, e in ((CACHE + ["--role", "prefill"], env), (NO_CACHE + ["--role", "decode"], env), (NO_CACHE, None)):
            servers.append(Server(args, env=e))
        router = Router(servers[0], servers[1])
        try:
            yield (*servers[:2], router, servers[2])
        finally:
            router.stop()
    finally:
        for s in servers:
            s.stop()


def test_prefix_hit_on_the_prefill_keeps_parity(pd):
    prefill, decode, router, colocated = pd
    hits = []
    for prompt in ASKS:
        status, got = chat(router.base, prompt, max_tokens=10)
        assert status == 200, got
        _, want = chat(colocated.base, prompt, max_tokens=10)
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        assert same_logprobs(got, want), prompt
        hits.append(prefill.idle_metrics()["kestrel_prefix_cache_hit_tokens_total"])
    shared = len(PREFIX) - 64  # bytes are tokens here (k3-default); the chat template adds to both sides
    assert hits[0] == 0 and hits[2] - hits[1] >= shared and hits[3] - hits[2] > hits[2] - hits[1], hits
    assert colocated.metrics().get("kestrel_prefix_cache_hit_tokens_total", 0) == 0
    p, d = prefill.idle_metrics(), decode.idle_metrics()
    assert p["kestrel_state_slots_used"] == 0 and p["kestrel_pd_handoffs_in_flight"] == 0, p
    assert d["kestrel_kv_blocks_used"] == 0 and d["kestrel_state_slots_used"] == 0, d
    assert p["kestrel_pd_handoffs_completed_total"] == d["kestrel_pd_handoffs_completed_total"] == len(ASKS)
