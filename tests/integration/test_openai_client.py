"""The real `openai` Python client against `kestrel serve`: streaming and non-streaming chat,
tools round trip, stop sequences, n > 1, logprobs, seed reproducibility, and the error statuses."""
import json
import threading
import urllib.error
import urllib.request

import openai
import pytest

from conftest import Server

MODEL = "kimi-k3"


def client(server, key="unused"):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=key, max_retries=0, timeout=120)


def test_models(server):
    ids = [m.id for m in client(server).models.list().data]
    assert ids == [MODEL]


def test_chat_non_streaming(server):
    r = client(server).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                                                max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_matches_non_streaming(server):
    c = client(server)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Stream please"}]
    full = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0)
    chunks = list(c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join((ch.choices[0].delta.content or "") for ch in chunks if ch.choices)
    reasoning = "".join((getattr(ch.choices[0].delta, "reasoning_content", None) or "")
                        for ch in chunks if ch.choices)
    want_reasoning = getattr(full.choices[0].message, "reasoning_content", None) or ""
    assert text == (full.choices[0].message.content or "")
    assert reasoning == want_reasoning
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]


def test_ignore_eos_runs_to_max_tokens_past_the_end_of_the_message(server):
    # Greedy on the random-weight preset, this conversation's reply ends its message (the output parser sees the end
    # of the message in the text, not only the stop token) after fewer than 1200 tokens. ignore_eos goes on to
    # max_tokens (fixed-length benchmarks rely on it) and streams the text after the end as content.
    msgs = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "x"},
            {"role": "user", "content": "Tell me a very long story"}]
    c = client(server)
    plain = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=1200, temperature=0)
    assert plain.choices[0].finish_reason == "stop" and plain.usage.completion_tokens < 1200, "the message must end"
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=1200, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 1200
    assert r.choices[0].message.content, "the text after the end of the message is content"
    chunks = list(c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=1200, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 1200
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["length"]
    text = "".join((ch.choices[0].delta.content or "") for ch in chunks if ch.choices)
    assert text == r.choices[0].message.content


def test_seed_reproducibility(server):
    c = client(server)
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Roll dice"}], max_tokens=10, temperature=1.0,
              top_p=0.9, seed=1234)
    def text(r):
        m = r.choices[0].message
        return (getattr(m, "reasoning_content", None) or "") + "\x00" + (m.content or "")

    a, b = c.chat.completions.create(**kw), c.chat.completions.create(**kw)
    assert text(a) == text(b)
    # Another seed samples differently (10 tokens at T = 1 from a near-flat random model: a collision
    # is vanishingly unlikely, and the seed plumbing would be broken if it happened every time).
    d = c.chat.completions.create(**{**kw, "seed": 99})
    assert text(d) != text(a)


def test_n_and_logprobs(server):
    r = client(server).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=5, n=3, temperature=0.8, seed=7, logprobs=True,
                                                top_logprobs=3)
    assert sorted(ch.index for ch in r.choices) == [0, 1, 2]
    entries = 0
    for ch in r.choices:
        assert ch.logprobs is not None and ch.logprobs.content is not None
        # One entry per generated token: exactly max_tokens when the choice ran to its length limit.
        n = len(ch.logprobs.content)
        assert 1 <= n <= 5, n
        if ch.finish_reason == "length":
            assert n == 5, (n, ch.finish_reason)
        entries += n
        for item in ch.logprobs.content:
            assert item.logprob <= 0.0
            assert len(item.top_logprobs) == 3, item.top_logprobs
            tops = [t.logprob for t in item.top_logprobs]
            assert tops == sorted(tops, reverse=True), tops
            assert all(t <= 0.0 for t in tops), tops
            assert item.logprob <= tops[0] + 1e-5  # nothing is more likely than the top entry
    # usage.completion_tokens sums the choices: every generated token has its logprob entry.
    assert entries == r.usage.completion_tokens, (entries, r.usage.completion_tokens)


def test_every_token_has_its_logprob_entry_streamed_or_not(server):
    # A token whose text is held back (a stop string's first characters, part of a UTF-8 sequence) or decodes to
    # nothing still has its entry: in the stream at once, with empty text; at the end of a non-streamed answer.
    c = client(server)
    base = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0, logprobs=0)
    toks = base.choices[0].logprobs.tokens
    text = base.choices[0].text
    # A stop string across the boundary of tokens 3 and 4 (its first character held back with token 3's entry,
    # then matched by token 4, which adds no text), and one inside a single token.
    cut = len("".join(toks[:3]))
    spans = toks[2][-1] + toks[3][0]
    assert text.find(spans) == cut - 1, (toks, spans)
    for stop in (None, [spans], [text[5]]):
        full = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0, logprobs=2,
                                    stop=stop)
        lp = full.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == full.usage.completion_tokens, (stop, lp.tokens)
        chunks = list(c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0,
                                           logprobs=2, stop=stop, stream=True,
                                           stream_options={"include_usage": True}))
        toks, lps, streamed = [], [], ""
        for ch in chunks:
            if not ch.choices:
                continue
            streamed += ch.choices[0].text or ""
            if ch.choices[0].logprobs is not None:
                toks += ch.choices[0].logprobs.tokens
                lps += ch.choices[0].logprobs.token_logprobs
        assert streamed == full.choices[0].text
        assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
        assert toks == lp.tokens and lps == lp.token_logprobs, stop
        if stop:
            assert full.choices[0].finish_reason == "stop" and stop[0] not in full.choices[0].text


def test_completions_and_stop(server):
    c = client(server)
    base = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0)
    text = base.choices[0].text
    assert base.choices[0].finish_reason in ("length", "stop")
    assert len(text) >= 4, text  # 16 byte-level tokens
    stop = text[2:4]
    r = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[: text.index(stop)]


def tokenize(server, **body):
    req = urllib.request.Request(server.base + "/tokenize", data=json.dumps({"model": MODEL, **body}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["tokens"]


def test_tools_round_trip(server):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    result = "18 C, sunny; humidity 64 %, wind 12 km/h from the north-west, no rain expected before Thursday"
    call = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_0", "type": "function",
                             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]}]
    msgs = call + [{"role": "tool", "tool_call_id": "call_0", "content": result}]
    c = client(server)
    r = c.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=6)
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")
    # The tool result reached the prompt: the same request without the tool message has at least
    # len(tokens of the result) fewer prompt tokens (the result plus its message framing).
    result_ids = tokenize(server, prompt=result)
    assert len(result_ids) >= 20, result_ids
    without = c.chat.completions.create(model=MODEL, messages=call, tools=tools, max_tokens=1)
    grown = r.usage.prompt_tokens - without.usage.prompt_tokens
    assert grown >= len(result_ids), (r.usage.prompt_tokens, without.usage.prompt_tokens, len(result_ids))
    # ... and as those very tokens: the rendered conversation contains the result's ids contiguously.
    rendered = tokenize(server, messages=msgs, add_generation_prompt=True)
    n = len(result_ids)
    assert any(rendered[i:i + n] == result_ids for i in range(len(rendered) - n + 1)), "tool result not in prompt"


def status_of(server, body, path="/v1/chat/completions", headers=None):
    req = urllib.request.Request(server.base + path, data=body, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_errors(server):
    ok = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    with pytest.raises(openai.BadRequestError):
        client(server).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                               temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client(server).chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    code, body = status_of(server, json.dumps({**ok, "n": 1000}).encode())
    assert code == 400 and body["error"]["type"] == "invalid_request_error"
    code, _ = status_of(server, b"x" * (9 << 20))
    assert code == 413


def test_api_key():
    s = Server(api_key="sekret")
    try:
        with pytest.raises(openai.AuthenticationError):
            client(s, "wrong").models.list()
        assert [m.id for m in client(s, "sekret").models.list().data] == [MODEL]
        with urllib.request.urlopen(s.base + "/health", timeout=5) as r:  # health needs no key
            assert r.status == 200
    finally:
        assert s.stop() == 0


def test_queue_full_gives_429():
    s = Server(extra_args=["--max-running", "1", "--max-waiting", "1"])
    try:
        results, lock = [], threading.Lock()

        def one():
            try:
                client(s).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "go"}],
                                                  max_tokens=64, temperature=0)
                status = 200
            except openai.APIStatusError as e:  # any HTTP error status, 429 included
                status = e.status_code
            except Exception as e:  # connection reset, timeout, ...: recorded, fails below
                status = repr(e)
            with lock:
                results.append(status)

        ts = [threading.Thread(target=one) for _ in range(8)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert len(results) == 8, results
        assert all(r in (200, 429) for r in results), results
        assert 429 in results and 200 in results, results
    finally:
        assert s.stop() == 0
