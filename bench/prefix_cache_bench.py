#!/usr/bin/env python3
"""Prefix-cache workloads against `kestrel serve` (cache on and off) and, on a GGUF file, llama.cpp's server
(`llama-server`, whose per-slot `cache_prompt` reuse and host-memory prompt cache are the peer), one engine at a
time on the same trace:

  multi-turn:    U users share one system prompt of S tokens; each user sends T turns, each turn appends the
                 previous answer and a new user part of Q tokens (the agent / chat pattern). Users run
                 concurrently, user u starting u x --stagger seconds after the first; a user's turns follow
                 each other.
  shared-prefix: R requests, each the shared S-token prefix + its own Q-token question, --concurrency at a time.

Prompts are token ids (exact lengths, no template), streamed with greedy decoding and ignore_eos. Reports per
engine: TTFT p50/p99 of every request, of the cold ones (nothing earlier shares a whole grid of tokens) and of
the warm ones; TTFT of the warm requests against the same requests with the cache off; reused tokens (Kestrel:
usage.prompt_tokens_details.cached_tokens; llama-server: timings.cache_n) against the infinite-cache ideal of the
same trace (the longest prefix each request shares with any earlier one, token granular); decode TPOT p50.

    python bench/prefix_cache_bench.py --kestrel build/release/kestrel --preset k3-bench --system 8192 --json
    python bench/prefix_cache_bench.py --gguf FILE.gguf --llama-server LLAMA_BUILD/bin/llama-server ...

A GGUF both servers load can be made from a Kestrel preset with llama.cpp's own tools (`--make-gguf PRESET`:
`kestrel make-model`, the converter of the llama-cpp-python source package run by --convert-python, which needs
torch, then llama-quantize to Q4_0, then the first 4096 ranks of cl100k_base as its tokenizer; see
bench/llbench_models.py). Starts its servers itself (loopback, ephemeral ports).
"""
import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sse_events(resp):
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if line.startswith(b"data: ") and line[6:] != b"[DONE]":
                    yield json.loads(line[6:])


class Engine:
    name = "?"

    def wait_healthy(self, path="/health"):
        for _ in range(12000):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=1)
                return
            except Exception:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited")
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)

    def post(self, path, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=7200)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"{self.name}: HTTP {r.status}: {r.read()[:300]!r}")
        return conn, r


class Kestrel(Engine):
    def __init__(self, args, cache_on, extra=(), name=None):
        self.name = name or "kestrel" + ("" if cache_on else " (cache off)")
        self.port = free_port()
        cmd = [args.kestrel, "serve", "--quiet", "--port", str(self.port), "--cache-mib", str(args.cache_mib),
               "--max-context", str(args.max_context), "--prefill-chunk", str(args.chunk), "--page-tokens",
               str(args.page), "--max-batch-tokens", str(max(args.chunk, 512)), "--max-running", str(args.slots)]
        cmd += ["--model", args.gguf or args.model] if (args.gguf or args.model) else ["--preset", args.preset]
        if not cache_on:
            cmd.append("--no-prefix-cache")
        cmd += list(extra)
        self.proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        self.wait_healthy()

    def complete(self, ids, max_tokens):
        t0 = time.perf_counter()
        conn, r = self.post("/v1/completions", {
            "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "logprobs": 0, "stream_options": {"include_usage": True}})
        stamps, usage = [], None
        for j in sse_events(r):
            if j.get("usage"):
                usage = j["usage"]
            for ch in j.get("choices", []):
                if (ch.get("logprobs") or {}).get("tokens") or ch.get("text"):
                    stamps.append(time.perf_counter())
        conn.close()
        n = usage["completion_tokens"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return {"t0": t0, "ttft": stamps[0] - t0, "cached": cached, "n": n,
                "tpot": (stamps[-1] - stamps[0]) / (n - 1) if n > 1 else float("nan")}

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return {l.rpartition(" ")[0]: float(l.rpartition(" ")[2]) for l in r.read().decode().splitlines()
                    if l and not l.startswith("#")}

    def written(self, tier, timeout=600):
        """/metrics once the tier's writer has put everything it was handed (writes are asynchronous)."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            p = f"kestrel_prefix_cache_{tier}_"
            if (m[p + "objects_written_total"] + m[p + "write_errors_total"] + m[p + "objects_dropped_total"] >=
                    m[p + "objects_submitted_total"] or time.time() > deadline):
                return m
            time.sleep(0.2)

    def counters(self):
        m = self.metrics()
        return {"hit_tokens": m.get("kestrel_prefix_cache_hit_tokens_total"),
                "snapshots": m.get("kestrel_prefix_cache_snapshots"),
                "snapshot_bytes": m.get("kestrel_prefix_cache_snapshot_bytes")}


class LlamaServer(Engine):
    """llama.cpp's server with its defaults for prompt reuse (cache_prompt on every request, slot chosen by prompt
    similarity, host-memory prompt cache), one slot per concurrent stream, each slot the full context."""

    def __init__(self, args):
        self.name = "llama-server"
        self.port = free_port()
        cmd = [args.llama_server, "-m", args.gguf, "--port", str(self.port), "--host", "127.0.0.1",
               "-t", str(args.threads), "-tb", str(args.threads), "-np", str(args.slots),
               "-c", str(args.max_context * args.slots), "-b", "512", "-ub", "512", "--no-ui", "--fit", "off", "--no-repack"]
        self.cmd = [os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd)]
        self.log = open(os.path.join(args.work_dir, "llama-server.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_healthy()

    def complete(self, ids, max_tokens):
        t0 = time.perf_counter()
        conn, r = self.post("/completion", {
            "prompt": ids, "n_predict": max_tokens, "cache_prompt": True, "stream": True, "temperature": 0,
            "top_k": 1, "ignore_eos": True, "return_tokens": True})
        stamps, timings = [], None
        for j in sse_events(r):
            if j.get("timings"):
                timings = j["timings"]
            if j.get("tokens") or j.get("content"):
                stamps.append(time.perf_counter())
        conn.close()
        n = int(timings["predicted_n"])
        return {"t0": t0, "ttft": stamps[0] - t0, "cached": int(timings.get("cache_n", 0)), "n": n,
                "tpot": (stamps[-1] - stamps[0]) / (n - 1) if n > 1 else float("nan")}

    def counters(self):
        return {}


def trace(args):
    """The requests: (user, token ids). Answers are fixed token runs so every engine sees the same trace."""
    rng = random.Random(7)
    lo, hi = args.token_range
    tok = lambda: rng.randrange(lo, hi)  # noqa: E731
    system = [tok() for _ in range(args.system)]
    reqs = []
    if args.workload == "multi-turn":
        hist = {u: list(system) for u in range(args.users)}
        for t in range(args.turns):
            for u in range(args.users):
                hist[u] += [tok() for _ in range(args.question)]
                reqs.append((u, list(hist[u])))
                hist[u] += [tok() for _ in range(args.answer)]  # the previous answer, re-sent
    else:
        for i in range(args.requests):
            reqs.append((i % args.concurrency, system + [tok() for _ in range(args.question)]))
    return reqs


def ideal(reqs):
    """Infinite-cache ideal: tokens each request shares with the longest matching earlier prompt (minus the one
    token that must be computed). 'Earlier' is trace order, which is arrival order for a user's own turns and for
    the staggered first turns."""
    out, seen = [], []
    for _, ids in reqs:
        best = 0
        for s in seen:
            n = 0
            for a, b in zip(s, ids):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        out.append(min(best, len(ids) - 1))
        seen.append(ids)
    return out


def drive(engine, args, reqs):
    """Runs the trace: one thread per stream (user), each sending its requests in trace order."""
    res = [None] * len(reqs)
    t_start = time.perf_counter()

    def stream(u):
        time.sleep(u * args.stagger)
        for i, (owner, ids) in enumerate(reqs):
            if owner == u:
                res[i] = engine.complete(ids, args.max_tokens)

    streams = sorted({u for u, _ in reqs})
    threads = [threading.Thread(target=stream, args=(u,)) for u in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    if any(r is None for r in res):
        raise RuntimeError(f"{engine.name}: a request failed")
    return res, wall


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else None


def ms(x):
    return None if x is None else round(1000 * x, 1)


def summarize(name, res, wall, best, warm, cold, off, counters):
    t = lambda idx: [res[i]["ttft"] for i in idx]  # noqa: E731
    row = {"engine": name, "wall_s": round(wall, 2),
           "ttft_p50_ms": ms(pct(t(range(len(res))), 0.5)), "ttft_p99_ms": ms(pct(t(range(len(res))), 0.99)),
           "ttft_cold_p50_ms": ms(pct(t(cold), 0.5)), "ttft_warm_p50_ms": ms(pct(t(warm), 0.5)),
           "ttft_warm_p99_ms": ms(pct(t(warm), 0.99)),
           "reused_tokens": sum(r["cached"] for r in res), "ideal_tokens": sum(best),
           "hit_rate_vs_ideal": round(sum(r["cached"] for r in res) / max(1, sum(best)), 4),
           "tpot_p50_ms": ms(statistics.median(r["tpot"] for r in res)),
           "streamed_tokens": sum(r["n"] for r in res)}
    if off is not None and warm:
        row["ttft_warm_over_cache_off_p50"] = round(pct(t(warm), 0.5) / pct([off[i]["ttft"] for i in warm], 0.5), 4)
    row.update(counters)
    return row


def membw_gb_s(binary, threads):
    """The machine's DRAM read bandwidth (bench/membw_bench, 2 GiB, best of 5), the limit a restore copy meets."""
    import re
    if not binary or not os.path.exists(binary):
        return None
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([binary, "2", "5"], check=True, capture_output=True, text=True, env=env).stdout
    return float(re.search(r"read ([0-9.]+) GB/s", out).group(1))


def tier_restores(args, reqs):
    """Restore bandwidth per lower tier: the trace once with the disk and Redis tiers (written), then a fresh server
    over each tier alone runs it again; its admissions restore from that tier. Bandwidth = object bytes read / wall
    time of the reads, as the server counts them (/metrics), next to the TTFT of the restored requests."""
    import shutil
    import tempfile
    redis_bin = shutil.which("redis-server")
    if not redis_bin:
        raise RuntimeError("--tiers needs redis-server (Debian package redis-server)")
    port = free_port()
    rdir = tempfile.mkdtemp(prefix="kestrel-bench-redis-", dir=args.work_dir)
    ddir = tempfile.mkdtemp(prefix="kestrel-bench-disk-", dir=args.work_dir)
    redis = subprocess.Popen([redis_bin, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                              "no", "--dir", rdir, "--maxmemory", "0"], stdout=subprocess.DEVNULL)
    rows = []
    try:
        time.sleep(0.5)
        both = ["--prefix-cache-disk", ddir, "--prefix-cache-disk-mib", str(args.cache_mib * 4),
                "--prefix-cache-redis", f"127.0.0.1:{port}", "--prefix-cache-redis-timeout-ms", "5000"]
        w = Kestrel(args, True, both, "kestrel (writing disk + redis)")
        try:
            drive(w, args, reqs)
            w.written("disk")
            w.written("redis")
        finally:
            w.stop()
        for tier, flags in (("disk", both[:4]), ("redis", both[4:])):
            k = Kestrel(args, True, flags, f"kestrel (restoring from {tier})")
            try:
                res, wall = drive(k, args, reqs)
                m = k.metrics()
            finally:
                k.stop()
            p = f"kestrel_prefix_cache_{tier}_"
            nbytes, secs = m[p + "read_bytes_total"], m[p + "read_seconds_total"]
            restored = [i for i, r in enumerate(res) if r["cached"] > 0]
            rows.append({"tier": tier, "hits": m[p + "hits_total"], "hit_tokens": m[p + "hit_tokens_total"],
                         "read_bytes": nbytes, "read_s": round(secs, 4),
                         "restore_gb_s": round(nbytes / secs / 1e9, 3) if secs > 0 else None,
                         "admission_wait_s": round(m[p + "lookup_seconds_total"], 4),
                         "ttft_restored_p50_ms": ms(pct([res[i]["ttft"] for i in restored], 0.5))})
    finally:
        redis.kill()
        redis.wait()
        shutil.rmtree(rdir, ignore_errors=True)
        shutil.rmtree(ddir, ignore_errors=True)
    return rows


def make_gguf(args):
    import llbench_models as lm
    ckpt = lm.make_checkpoint(args.kestrel, args.make_gguf, os.path.join(args.work_dir, args.make_gguf))
    bf16 = lm.convert(args.convert_python, args.llama_cpp_src, ckpt,
                      os.path.join(args.work_dir, f"{args.make_gguf}-bf16.gguf"), "bf16")
    q4 = lm.quantize_q4_0_binary(args.llama_quantize, bf16, os.path.join(args.work_dir, f"{args.make_gguf}-q4_0.gguf"),
                                 args.threads)
    return lm.with_tokenizer(args.llama_cpp_src, q4, os.path.join(args.work_dir, f"{args.make_gguf}-q4_0-tok.gguf"),
                             args.tiktoken)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kestrel", default="build/release/kestrel")
    ap.add_argument("--preset", default="k3-bench")
    ap.add_argument("--model", help="a checkpoint directory for Kestrel (instead of --preset)")
    ap.add_argument("--gguf", help="a GGUF file both servers load")
    ap.add_argument("--llama-server", help="llama.cpp's server binary: run it as the peer on --gguf")
    ap.add_argument("--make-gguf", metavar="PRESET", help="make --gguf from this Kestrel preset (see above)")
    ap.add_argument("--llama-cpp-src", help="vendor/llama.cpp of the unpacked llama-cpp-python source package")
    ap.add_argument("--convert-python", default=sys.executable, help="a Python with torch for the converter")
    ap.add_argument("--llama-quantize", help="llama.cpp's llama-quantize binary")
    ap.add_argument("--tiktoken", default="build/vocab/cl100k_base.tiktoken")
    ap.add_argument("--work-dir", default="/tmp/prefix-bench")
    ap.add_argument("--engines", default="kestrel,kestrel-off,llama-server")
    ap.add_argument("--token-range", type=int, nargs=2, default=(1, 2000), help="prompt token ids are drawn here")
    ap.add_argument("--workload", choices=["multi-turn", "shared-prefix"], default="multi-turn")
    ap.add_argument("--system", type=int, default=8192, help="shared prefix tokens")
    ap.add_argument("--users", type=int, default=2)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--stagger", type=float, default=0.0, help="seconds between the users' first requests")
    ap.add_argument("--requests", type=int, default=6, help="shared-prefix: requests")
    ap.add_argument("--concurrency", type=int, default=1, help="shared-prefix: requests at a time")
    ap.add_argument("--question", type=int, default=64)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--cache-mib", type=int, default=4096)
    ap.add_argument("--max-context", type=int, default=16384)
    ap.add_argument("--tiers", action="store_true", help="also measure restores from the disk and Redis tiers")
    ap.add_argument("--membw", default="build/release/bench/membw_bench")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    if args.make_gguf:
        args.gguf = make_gguf(args)
    args.slots = args.users if args.workload == "multi-turn" else args.concurrency
    reqs = trace(args)
    best = ideal(reqs)
    warm = [i for i, b in enumerate(best) if b >= args.chunk]
    cold = [i for i in range(len(reqs)) if i not in warm]
    engines = args.engines.split(",")
    if "llama-server" in engines and not (args.llama_server and args.gguf):
        engines.remove("llama-server")
    runs = {}
    for e in engines:
        eng = {"kestrel": lambda: Kestrel(args, True), "kestrel-off": lambda: Kestrel(args, False),
               "llama-server": lambda: LlamaServer(args)}[e]()
        try:
            res, wall = drive(eng, args, reqs)
            runs[e] = (eng.name, res, wall, eng.counters())
            if e == "llama-server":
                llama_cmd = " ".join(eng.cmd[1:])
        finally:
            eng.stop()
    off = runs["kestrel-off"][1] if "kestrel-off" in runs else None
    out = {"workload": args.workload, "model": args.gguf or args.model or args.preset, "requests": len(reqs),
           "system_tokens": args.system, "users": args.users, "turns": args.turns, "stagger_s": args.stagger,
           "prompt_tokens_mean": round(statistics.mean(len(r[1]) for r in reqs), 1), "max_tokens": args.max_tokens,
           "warm_requests": len(warm), "threads": args.threads,
           "rows": [summarize(n, res, wall, best, warm, cold, off, c) for n, res, wall, c in runs.values()]}
    if "llama-server" in runs:
        out["llama_server_flags"] = llama_cmd
    if args.tiers:
        out["tiers"] = tier_restores(args, reqs)
        out["memory_read_gb_s"] = membw_gb_s(args.membw, args.threads)
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps({k: v for k, v in out.items() if k != "rows"}))
        for r in out["rows"]:
            print("  " + json.dumps(r))


if __name__ == "__main__":
    main()
