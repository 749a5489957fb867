"""The prefix cache's Redis tier (L4) through `kestrel serve` on the shipped default model: a redis-server of the
test's own; server A holds a 4-turn conversation with --prefix-cache-redis and writes its prefixes there; a second
server B (its own process and pools, same Redis) holds the same conversation, reports cached tokens on every turn
whose prefix A stored, answers with logprobs identical to A's, and counts Redis hits on /metrics. A Redis that does
not answer at startup is one log line: the server serves and counts the errors. A bad HOST:PORT is a usage error.
Without redis-server the tests skip (fail where CI or KESTREL_CI is set)."""
import os
import shutil
import socket
import subprocess
import tempfile
import time

import openai
import pytest

from conftest import Server, free_port

MODEL = "kimi-k3"
BIN = os.environ.get("KESTREL_BINARY", "build/release/kestrel")
# Small pages and prefill chunks, so the short prompts reach several whole-chunk boundaries.
GRID = ["--page-tokens", "16", "--prefill-chunk", "32"]
SYSTEM = ("You are a careful assistant for a library. Answer in one sentence, cite the shelf, and never invent "
          "a title. The catalogue lists history, science, poetry, travel and cooking, each on its own floor.")
# A healthy server's timeout is not what these tests measure: the default (200 ms) can expire on a loaded machine
# (tests running beside each other) and turn a hit into a counted read error.
HEALTHY = ["--prefix-cache-redis-timeout-ms", "5000"]


def in_ci():
    return any(os.environ.get(v, "") not in ("", "0") for v in ("CI", "KESTREL_CI"))


def ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="module")
def redis():
    binary = os.environ.get("KESTREL_REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        why = "redis-server is not installed (Debian package redis-server; scripts/install-deps.sh)"
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="kestrel-redis-")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", workdir, "--logfile", os.path.join(workdir, "redis.log")])
    deadline = time.time() + 10
    while not ping(port):
        assert time.time() < deadline and proc.poll() is None, "redis-server did not start"
        time.sleep(0.05)
    yield port
    proc.kill()
    proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)


def conversation(server, turns=4):
    c = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Question {t}: which floor holds book number {17 * t + 3}?"})
        r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0, logprobs=True,
                                      top_logprobs=3)
        ch = r.choices[0]
        out.append({
            "content": ch.message.content or "",
            "logprobs": [(x.token, x.logprob, [(y.token, y.logprob) for y in x.top_logprobs])
                         for x in ch.logprobs.content],
            "prompt_tokens": r.usage.prompt_tokens,
            "cached": r.usage.prompt_tokens_details.cached_tokens,
        })
        messages.append({"role": "assistant", "content": out[-1]["content"] or "ok"})
    return out


def written(server, timeout=30):
    """/metrics once the writer has put every object it was handed (the writes are asynchronous)."""
    deadline = time.time() + timeout
    while True:
        m = server.idle_metrics()
        done = m["kestrel_prefix_cache_redis_objects_written_total"] + m["kestrel_prefix_cache_redis_write_errors_total"]
        if done >= m["kestrel_prefix_cache_redis_objects_submitted_total"] or time.time() > deadline:
            return m
        time.sleep(0.1)


def model_copy(edit_config=False):
    """The shipped default model copied to a fresh directory (new paths and modification times, same bytes; or
    one byte more in config.json: still the same model to the loader, other bytes to the weights digest)."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "default")
    dst = os.path.join(tempfile.mkdtemp(prefix="kestrel-model-copy-"), "default")
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    if edit_config:
        with open(os.path.join(dst, "config.json"), "a") as f:
            f.write("\n")
    return dst


def test_second_server_reuses_the_first_ones_prefixes(redis):
    """B loads a copy of A's model from another directory: objects are bound to the weights' digest, not to paths."""
    flags = GRID + ["--prefix-cache-redis", f"127.0.0.1:{redis}"] + HEALTHY
    a = Server(flags, model_args=())
    try:
        first = conversation(a)
        ma = written(a)
    finally:
        a.stop()
    assert ma["kestrel_prefix_cache_redis_objects_written_total"] > 0, ma
    assert ma["kestrel_prefix_cache_redis_write_errors_total"] == 0
    assert ma["kestrel_prefix_cache_redis_hits_total"] == 0  # nothing there yet
    copy = model_copy()
    b = Server(flags, model_args=("--model", copy))
    try:
        second = conversation(b)
        mb = b.idle_metrics()
    finally:
        b.stop()
        shutil.rmtree(os.path.dirname(copy), ignore_errors=True)
    for t, (x, y) in enumerate(zip(first, second)):
        assert x["content"] == y["content"], f"turn {t}"
        assert x["logprobs"] == y["logprobs"], f"turn {t}: logprobs differ"  # floats compared exactly
        assert x["prompt_tokens"] == y["prompt_tokens"]
    # A stored each turn's prompt end (on the chunk grid); B's same prompt finds it, from the first turn on.
    assert first[0]["cached"] == 0
    assert all(y["cached"] > 0 and y["cached"] % 32 == 0 for y in second), second
    assert all(y["cached"] >= x["cached"] for x, y in zip(first, second))
    assert all(y["cached"] < y["prompt_tokens"] for y in second)
    # Every turn's deepest boundary is deeper than what B's live pools hold (the turn before): all from Redis.
    assert mb["kestrel_prefix_cache_redis_hits_total"] == len(second), mb
    assert mb["kestrel_prefix_cache_redis_hit_tokens_total"] == sum(y["cached"] for y in second), mb
    assert mb["kestrel_prefix_cache_redis_read_errors_total"] == 0
    assert mb["kestrel_prefix_cache_redis_corrupt_total"] == 0
    assert mb["kestrel_prefix_cache_redis_read_bytes_total"] > 0
    assert "kestrel_prefix_cache_disk_hits_total" not in mb  # no disk tier configured


def test_other_model_bytes_get_no_hits(redis):
    """A model whose files differ by one byte is another model to the shared tier: nothing A wrote is read."""
    flags = GRID + ["--prefix-cache-redis", f"127.0.0.1:{redis}"] + HEALTHY
    a = Server(flags, model_args=())
    try:
        first = conversation(a, turns=2)
        written(a)
    finally:
        a.stop()
    copy = model_copy(edit_config=True)
    c = Server(flags, model_args=("--model", copy))
    try:
        other = conversation(c, turns=2)
        mc = c.idle_metrics()
    finally:
        c.stop()
        shutil.rmtree(os.path.dirname(copy), ignore_errors=True)
    assert [x["logprobs"] for x in first] == [y["logprobs"] for y in other]  # the same model to the loader
    assert mc["kestrel_prefix_cache_redis_hits_total"] == 0, mc
    assert mc["kestrel_prefix_cache_redis_corrupt_total"] == 0, mc  # not even found: other keys
    assert other[0]["cached"] == 0


def test_unreachable_redis_is_logged_and_counted():
    dead = free_port()  # nothing listens there
    s = Server(GRID + ["--prefix-cache-redis", f"127.0.0.1:{dead}", "--prefix-cache-redis-timeout-ms", "100"],
               model_args=())
    try:
        out = conversation(s, turns=2)
        m = written(s)
    finally:
        s.stop()
    assert all(len(x["logprobs"]) > 0 for x in out)
    assert out[1]["cached"] > 0  # the live pools still serve
    assert m["kestrel_prefix_cache_redis_read_errors_total"] >= 1, m
    assert m["kestrel_prefix_cache_redis_write_errors_total"] >= 1, m
    assert m["kestrel_prefix_cache_redis_hits_total"] == 0
    log = open(s.log.name).read()
    assert log.count("Redis tier does not answer") == 1, log


@pytest.mark.parametrize("value", ["localhost", "localhost:", ":6379", "127.0.0.1:0", "127.0.0.1:70000",
                                   "127.0.0.1:63x9", "::1:6379"])
def test_bad_host_port_is_a_usage_error(value):
    p = subprocess.run([BIN, "serve", "--prefix-cache-redis", value], capture_output=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count(b"\n") == 1 and b"--prefix-cache-redis" in p.stderr, p.stderr
