"""The prefix cache through `kestrel serve` and the real `openai` client: an 8-turn conversation gives the same
greedy tokens and bit-identical logprobs with the cache on and off, `usage.prompt_tokens_details.cached_tokens`
grows turn by turn, another `cache_salt` gets no hit, `/reset_prefix_cache` empties it, and afterwards no block
or snapshot is held beyond what /metrics says the cache keeps."""
import json
import urllib.request

import openai
import pytest

from conftest import Server

MODEL = "kimi-k3"
# A fine grid so the short prompts of the tiny default model reach several hit boundaries.
GRID = ["--page-tokens", "16", "--prefill-chunk", "32"]
SYSTEM = ("You are a careful assistant for a library. Answer in one sentence, cite the shelf, and never invent "
          "a title. The catalogue lists history, science, poetry, travel and cooking, each on its own floor.")


def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


def conversation(server, turns=8, salt=None):
    c = client(server)
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Question {t}: which floor holds book number {17 * t + 3}?"})
        extra = {"cache_salt": salt} if salt is not None else {}
        r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0, logprobs=True,
                                      top_logprobs=3, extra_body=extra)
        ch = r.choices[0]
        out.append({
            "content": ch.message.content or "",
            "reasoning": getattr(ch.message, "reasoning_content", None) or "",
            "logprobs": [(x.token, x.logprob, [(y.token, y.logprob) for y in x.top_logprobs])
                         for x in ch.logprobs.content],
            "prompt_tokens": r.usage.prompt_tokens,
            "cached": r.usage.prompt_tokens_details.cached_tokens,
        })
        assert len(out[-1]["logprobs"]) == r.usage.completion_tokens
        messages.append({"role": "assistant", "content": out[-1]["content"] or "ok"})
    return out


@pytest.fixture(scope="module")
def servers():
    on = Server(GRID)
    off = Server(GRID + ["--no-prefix-cache"])
    yield on, off
    on.stop()
    off.stop()


def test_multi_turn_identical_with_cache_on_and_off(servers):
    on, off = servers
    a, b = conversation(on), conversation(off)
    for t, (x, y) in enumerate(zip(a, b)):
        assert x["content"] == y["content"] and x["reasoning"] == y["reasoning"], f"turn {t}"
        assert x["logprobs"] == y["logprobs"], f"turn {t}: logprobs differ"  # floats compared exactly
        assert x["prompt_tokens"] == y["prompt_tokens"]
        assert y["cached"] == 0
    cached = [x["cached"] for x in a]
    assert cached[0] == 0
    assert all(c2 > c1 for c1, c2 in zip(cached[1:], cached[2:])), cached  # grows turn by turn
    assert cached[1] > 0 and all(c % 32 == 0 for c in cached), cached
    assert all(x["cached"] < x["prompt_tokens"] for x in a)
    m = on.metrics()
    assert m["kestrel_prefix_cache_hit_tokens_total"] >= sum(cached)
    assert m["kestrel_prefix_cache_snapshots"] > 0
    assert "kestrel_prefix_cache_hit_tokens_total" not in off.metrics()


def test_cache_salt_isolates(servers):
    on, _ = servers
    first = conversation(on, turns=2, salt="tenant-a")
    assert first[1]["cached"] > 0
    other = conversation(on, turns=2, salt="tenant-b")
    assert other[0]["cached"] == 0 and other[1]["cached"] == first[1]["cached"]  # its own history only
    again = conversation(on, turns=1, salt="tenant-a")
    assert again[0]["cached"] > 0  # the same salt shares


def test_reset_prefix_cache_releases_everything(servers):
    on, _ = servers
    conversation(on, turns=2, salt="reset")
    before = on.idle_metrics()
    assert before["kestrel_prefix_cache_blocks"] > 0
    assert before["kestrel_kv_blocks_used"] == before["kestrel_prefix_cache_blocks"]  # idle: only the cache holds
    req = urllib.request.Request(on.base + "/reset_prefix_cache", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}
    for _ in range(100):
        m = on.metrics()
        if m["kestrel_kv_blocks_used"] == 0:
            break
        import time
        time.sleep(0.05)
    assert m["kestrel_kv_blocks_used"] == 0
    assert m["kestrel_prefix_cache_blocks"] == 0 and m["kestrel_prefix_cache_snapshots"] == 0
    assert m["kestrel_prefix_cache_flushes_total"] == 1
    after = conversation(on, turns=1, salt="reset")
    assert after[0]["cached"] == 0


def test_fp8_cache_dtype_through_the_server():
    # --kv-cache-dtype fp8 on serve: warm turns equal a cache-off fp8 server bit for bit (the same decode of the same
    # rows), the prefix cache hits within the dtype, and the logprobs are not the fp32 server's (the flag took effect).
    on = Server(GRID + ["--kv-cache-dtype", "fp8"])
    off = Server(GRID + ["--kv-cache-dtype", "fp8", "--no-prefix-cache"])
    fp32 = Server(GRID + ["--no-prefix-cache"])
    try:
        a, b, c = conversation(on, turns=4), conversation(off, turns=4), conversation(fp32, turns=4)
    finally:
        on.stop()
        off.stop()
        fp32.stop()
    for t, (x, y) in enumerate(zip(a, b)):
        assert x["content"] == y["content"] and x["logprobs"] == y["logprobs"], f"turn {t}"
    assert a[0]["cached"] == 0 and a[-1]["cached"] > 0, [x["cached"] for x in a]
    assert any(x["logprobs"] != z["logprobs"] for x, z in zip(b, c)), "fp8 pages change the arithmetic"
