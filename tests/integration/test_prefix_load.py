"""The prefix cache under load, on the shipped hybrid default model: 64 concurrent streams over four shared system prompts, on a KV pool small enough
that cached blocks must be evicted while requests run. No request fails, every answer (text and logprobs, floats
compared exactly) equals the same request's answer alone on a server with the cache off, and afterwards nothing
is held beyond what the cache keeps: a reset leaves zero blocks, snapshots and slots in use."""
import concurrent.futures as cf
import json
import time
import urllib.request

import openai
import pytest

from conftest import Server

MODEL = "kimi-k3"
GRID = ["--page-tokens", "16", "--prefill-chunk", "32"]
# The shipped trained default model (hybrid KDA + MLA). Each prompt's last ~6 pages of 16 tokens are its own,
# the rest is shared with the other requests of its topic. 293 pages hold the 16 running sequences and about
# 180 cached ones: fewer than the ~400 that all 64 prompts leave behind. 24 snapshots of 0.65 MB against one
# prompt-end snapshot per request. Both pools evict while later requests still hit the shared prefixes.
SMALL_POOL = ["--cache-mib", "16", "--max-context", "1024", "--prefix-cache-snapshot-mib", "16"]
DEFAULT_MODEL = ()
TOPICS = ["astronomy", "gardening", "railway timetables", "medieval poetry"]


def system_prompt(topic):
    return (f"You are the help desk of a public library, specialised in {topic}. Answer in one short sentence, "
            f"name the shelf and the floor, and never invent a title.")


def request(i):
    return [{"role": "system", "content": system_prompt(TOPICS[i % len(TOPICS)])},
            {"role": "user", "content": f"Reader {i} asks where items " + ", ".join(str(31 * i + k) for k in range(12))
             + " are shelved."}]


def ask(server, i):
    c = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=300)
    # ignore_eos: every answer is 4 tokens long (the random-weight model could end early).
    r = c.chat.completions.create(model=MODEL, messages=request(i), max_tokens=4, temperature=0, logprobs=True,
                                  top_logprobs=2, extra_body={"ignore_eos": True})
    ch = r.choices[0]
    lp = [(x.token, x.logprob, [(y.token, y.logprob) for y in x.top_logprobs]) for x in ch.logprobs.content]
    assert r.usage.completion_tokens == 4 and lp  # (XTML control tokens the output parser consumes carry none)
    return {"content": ch.message.content or "", "reasoning": getattr(ch.message, "reasoning_content", None) or "",
            "logprobs": lp, "cached": r.usage.prompt_tokens_details.cached_tokens}


@pytest.fixture(scope="module")
def servers():
    on = Server(GRID + SMALL_POOL, model_args=DEFAULT_MODEL)
    off = Server(GRID + ["--no-prefix-cache"], model_args=DEFAULT_MODEL)
    yield on, off
    on.stop()
    off.stop()


def test_64_streams_shared_prefixes_under_eviction(servers):
    on, off = servers
    n = 64
    solo = [ask(off, i) for i in range(n)]  # cold, one at a time
    with cf.ThreadPoolExecutor(max_workers=n) as ex:
        loaded = list(ex.map(lambda i: ask(on, i), range(n)))
    for i, (a, b) in enumerate(zip(loaded, solo)):
        assert (a["content"], a["reasoning"]) == (b["content"], b["reasoning"]), f"request {i}"
        assert a["logprobs"] == b["logprobs"], f"request {i}: logprobs differ from its cold solo run"
    m = on.idle_metrics()
    assert sum(x["cached"] for x in loaded) > 0  # the shared system prompts were reused ...
    assert m["kestrel_prefix_cache_hit_tokens_total"] > 0
    assert m["kestrel_prefix_cache_evicted_blocks_total"] > 0  # ... while the pools were under pressure
    assert m["kestrel_prefix_cache_evicted_snapshots_total"] > 0
    assert m["kestrel_requests_running"] == 0 and m["kestrel_requests_waiting"] == 0
    assert m["kestrel_state_slots_used"] == 0
    assert m["kestrel_kv_blocks_used"] == m["kestrel_prefix_cache_blocks"]  # only the cache holds pages
    assert m["kestrel_requests_finished_total"] >= n

    req = urllib.request.Request(on.base + "/reset_prefix_cache", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}
    deadline = time.time() + 10
    while time.time() < deadline and on.metrics()["kestrel_kv_blocks_used"] != 0:
        time.sleep(0.05)
    m = on.metrics()
    assert m["kestrel_kv_blocks_used"] == 0 and m["kestrel_state_slots_used"] == 0
    assert m["kestrel_prefix_cache_blocks"] == 0 and m["kestrel_prefix_cache_snapshots"] == 0
