#!/usr/bin/env python3
"""Prefix-cache workloads against `kestrel serve`, cache on and cache off (the same server binary, same model):

  multi-turn:   U users share one system prompt of S tokens; each user sends T turns, each turn appends its
                previous answer and a new user part of Q tokens (the agent / chat pattern).
  shared-prefix: R independent requests, each = the shared S-token prefix + its own Q-token question.

Prompts are token ids through /v1/completions (exact lengths, no template). Reports TTFT p50/p99 of cold and
warm requests, the hit rate against the infinite-cache ideal of the same trace (the longest prefix each request
shares with any earlier one, token granular), decode TPOT with the cache on vs off, and the server's own
counters. A warm request is one whose prompt shares at least a grid of tokens with an earlier one.

    python bench/prefix_cache_bench.py --kestrel build/release/kestrel --preset k3-bench --system 8192 --json

Starts its servers itself (loopback, ephemeral ports), one at a time.
"""
import argparse
import http.client
import json
import random
import socket
import statistics
import subprocess
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args, cache_on):
        self.port = free_port()
        cmd = [args.kestrel, "serve", "--quiet", "--port", str(self.port), "--cache-mib", str(args.cache_mib),
               "--max-context", str(args.max_context), "--prefill-chunk", str(args.chunk), "--page-tokens",
               str(args.page), "--max-batch-tokens", str(max(args.chunk, 512))]
        cmd += ["--model", args.model] if args.model else ["--preset", args.preset]
        if not cache_on:
            cmd.append("--no-prefix-cache")
        self.proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        for _ in range(12000):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1)
                return
            except Exception:
                if self.proc.poll() is not None:
                    raise RuntimeError("server exited")
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def complete(self, ids, max_tokens):
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        conn.request("POST", "/v1/completions", json.dumps({
            "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "logprobs": 0, "stream_options": {"include_usage": True}}), {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        stamps, usage, buf, toks = [], None, b"", []
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                payload = ev[6:]
                if payload == b"[DONE]":
                    continue
                j = json.loads(payload)
                if j.get("usage"):
                    usage = j["usage"]
                for ch in j.get("choices", []):
                    lp = ch.get("logprobs") or {}
                    got = lp.get("tokens") or []
                    if got or ch.get("text"):
                        stamps.append(time.perf_counter())
                        toks.extend(got)
        conn.close()
        n = usage["completion_tokens"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return {"ttft": stamps[0] - t0, "tpot": (stamps[-1] - stamps[0]) / (n - 1) if n > 1 else float("nan"),
                "cached": cached, "prompt": len(ids)}

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return {l.rpartition(" ")[0]: float(l.rpartition(" ")[2]) for l in r.read().decode().splitlines()
                    if l and not l.startswith("#")}

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)


def trace(args):
    """The requests in order: (user, token ids). Answers are fixed token runs so both servers see the same trace."""
    rng = random.Random(7)
    vocab = args.vocab
    system = [rng.randrange(1, vocab) for _ in range(args.system)]
    reqs = []
    if args.workload == "multi-turn":
        hist = {u: list(system) for u in range(args.users)}
        for t in range(args.turns):
            for u in range(args.users):
                hist[u] += [rng.randrange(1, vocab) for _ in range(args.question)]
                reqs.append((u, list(hist[u])))
                hist[u] += [rng.randrange(1, vocab) for _ in range(args.answer)]  # the previous answer, re-sent
    else:
        for i in range(args.requests):
            reqs.append((i, system + [rng.randrange(1, vocab) for _ in range(args.question)]))
    return reqs


def ideal(reqs):
    """Infinite-cache ideal: tokens each request shares with the longest matching earlier prompt (minus one token
    that must be computed)."""
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


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def run(args, cache_on, reqs):
    s = Server(args, cache_on)
    try:
        res = [s.complete(ids, args.max_tokens) for _, ids in reqs]
        m = s.metrics()
    finally:
        s.stop()
    return res, m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kestrel", default="build/release/kestrel")
    ap.add_argument("--preset", default="k3-bench")
    ap.add_argument("--model")
    ap.add_argument("--vocab", type=int, default=2000, help="token ids are drawn below this")
    ap.add_argument("--workload", choices=["multi-turn", "shared-prefix"], default="multi-turn")
    ap.add_argument("--system", type=int, default=8192, help="shared prefix tokens")
    ap.add_argument("--users", type=int, default=2)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--requests", type=int, default=6, help="shared-prefix: requests")
    ap.add_argument("--question", type=int, default=64)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--cache-mib", type=int, default=4096)
    ap.add_argument("--max-context", type=int, default=16384)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    reqs = trace(args)
    best = ideal(reqs)
    on, m_on = run(args, True, reqs)
    off, _ = run(args, False, reqs)
    warm = [i for i, b in enumerate(best) if b >= args.chunk]
    cold = [i for i in range(len(reqs)) if i not in warm]
    row = {
        "workload": args.workload, "preset": args.model or args.preset, "requests": len(reqs),
        "system_tokens": args.system, "prompt_tokens_mean": statistics.mean(len(r[1]) for r in reqs),
        "ttft_off_p50_ms": 1000 * pct([r["ttft"] for r in off], 0.5),
        "ttft_off_p99_ms": 1000 * pct([r["ttft"] for r in off], 0.99),
        "ttft_on_cold_p50_ms": 1000 * pct([on[i]["ttft"] for i in cold], 0.5) if cold else None,
        "ttft_on_warm_p50_ms": 1000 * pct([on[i]["ttft"] for i in warm], 0.5) if warm else None,
        "ttft_on_warm_p99_ms": 1000 * pct([on[i]["ttft"] for i in warm], 0.99) if warm else None,
        "ttft_warm_over_same_requests_off_p50": (pct([on[i]["ttft"] for i in warm], 0.5) /
                                                pct([off[i]["ttft"] for i in warm], 0.5)) if warm else None,
        "hit_tokens": sum(r["cached"] for r in on), "ideal_hit_tokens": sum(best),
        "hit_rate_vs_ideal": sum(r["cached"] for r in on) / max(1, sum(best)),
        "tpot_on_p50_ms": 1000 * statistics.median(r["tpot"] for r in on),
        "tpot_off_p50_ms": 1000 * statistics.median(r["tpot"] for r in off),
        "server_hit_tokens": m_on.get("kestrel_prefix_cache_hit_tokens_total"),
        "server_snapshots": m_on.get("kestrel_prefix_cache_snapshots"),
        "server_snapshot_bytes": m_on.get("kestrel_prefix_cache_snapshot_bytes"),
    }
    if args.json:
        print(json.dumps(row))
    else:
        for k, v in row.items():
            print(f"{k:>40}: {v:.3f}" if isinstance(v, float) else f"{k:>40}: {v}")


if __name__ == "__main__":
    main()
