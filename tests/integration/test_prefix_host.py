"""The prefix cache's host-memory tier (L2) through `kestrel serve` and the real `openai` client: a conversation on a
server with `--prefix-cache-host-mib`, its live cache emptied (`/reset_prefix_cache`) before every turn, still
reports `cached_tokens` on every later turn, all of them restored from host memory (`/metrics`), with the same text
and bit-identical logprobs as a server with the cache off."""
import json
import urllib.request

import openai
import pytest

from conftest import Server

MODEL = "kimi-k3"
GRID = ["--page-tokens", "16", "--prefill-chunk", "32"]
SYSTEM = ("You are a careful assistant for a library. Answer in one sentence, cite the shelf, and never invent "
          "a title. The catalogue lists history, science, poetry, travel and cooking, each on its own floor.")
TURNS = 4


def reset(server):
    req = urllib.request.Request(server.base + "/reset_prefix_cache", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}


def conversation(server, flush):
    c = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for t in range(TURNS):
        if flush:
            server.idle_metrics()  # the previous turn retired, and stored what it stores
            reset(server)  # the live pools forget everything; host memory keeps it
        messages.append({"role": "user", "content": f"Question {t}: which floor holds book number {17 * t + 3}?"})
        r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0, logprobs=True,
                                      top_logprobs=3)
        ch = r.choices[0]
        out.append({"content": ch.message.content or "",
                    "reasoning": getattr(ch.message, "reasoning_content", None) or "",
                    "logprobs": [(x.token, x.logprob, [(y.token, y.logprob) for y in x.top_logprobs])
                                 for x in ch.logprobs.content],
                    "cached": r.usage.prompt_tokens_details.cached_tokens})
        messages.append({"role": "assistant", "content": out[-1]["content"] or "ok"})
    return out


@pytest.fixture(scope="module")
def servers():
    on = Server(GRID + ["--prefix-cache-host-mib", "64"])
    off = Server(GRID + ["--no-prefix-cache"])
    yield on, off
    on.stop()
    off.stop()


def test_turns_restore_from_host_memory_after_the_live_cache_is_emptied(servers):
    on, off = servers
    a, b = conversation(on, flush=True), conversation(off, flush=False)
    for t, (x, y) in enumerate(zip(a, b)):
        assert x["content"] == y["content"] and x["reasoning"] == y["reasoning"], f"turn {t}"
        assert x["logprobs"] == y["logprobs"], f"turn {t}: logprobs differ with host memory on"
    assert a[0]["cached"] == 0
    assert all(x["cached"] > 0 for x in a[1:]), [x["cached"] for x in a]
    m = on.idle_metrics()
    assert m["kestrel_prefix_cache_host_hits_total"] == TURNS - 1
    assert m["kestrel_prefix_cache_host_hit_tokens_total"] == sum(x["cached"] for x in a)
    assert m["kestrel_prefix_cache_hit_tokens_total"] == sum(x["cached"] for x in a)  # none from the live pools
    assert m["kestrel_prefix_cache_host_objects"] > 0 and m["kestrel_prefix_cache_host_bytes"] > 0
    assert m["kestrel_prefix_cache_host_corrupt_total"] == 0
    assert m["kestrel_prefix_cache_flushes_total"] == TURNS
    assert m["kestrel_kv_blocks_used"] == m["kestrel_prefix_cache_blocks"]
    assert "kestrel_prefix_cache_disk_hits_total" not in m  # no disk tier configured
