#!/usr/bin/env python3
"""Load generator for `kestrel serve`: TTFT, TPOT and aggregate output tokens/s at several
concurrency levels, streaming chat completions with a fixed output length (ignore_eos).

    python bench/load_gen.py --kestrel build/release/kestrel --concurrency 1,16      # the shipped default model
    python bench/load_gen.py --kestrel build/release/kestrel --preset k3-bench --concurrency 1,4,16,64
    python bench/load_gen.py --kestrel build/release/kestrel --model path/to/checkpoint
    python bench/load_gen.py --url http://127.0.0.1:8000 ...      # an already running server

Starts its own server (loopback, ephemeral port) unless --url is given. Bounded: each level runs
max(8, 2*c) requests. --reps R runs the levels R times in turn (1, 16, 1, 16, ...) and reports the
median of each column, so a noisy machine's drift hits every level alike; the per-repetition
ratios are printed too. --kernels fast starts the server with `--kernels fast`.
"""
import argparse
import concurrent.futures as cf
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request


def one(host, port, prompt, max_tokens):
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", "/v1/chat/completions", json.dumps({
        "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "chat_template_kwargs": {"thinking": False}, "stream": True, "stream_options": {"include_usage": True}}),
        {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    stamps, usage, buf = [], None, b""
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
                d = ch.get("delta", {})
                if d.get("content") or d.get("reasoning_content"):
                    stamps.append(time.perf_counter())
    conn.close()
    n = usage["completion_tokens"] if usage else len(stamps)
    # ignore_eos: every stream must run to max_tokens, or the batch sizes this benchmark claims do not hold.
    if n != max_tokens:
        raise SystemExit(f"load_gen: a stream ended after {n} of {max_tokens} tokens (ignore_eos not honoured?)")
    ttft = (stamps[0] - t0) if stamps else float("nan")
    # Several tokens can arrive in one read; TPOT spreads the first-to-last interval over the tokens.
    tpot = (stamps[-1] - stamps[0]) / (n - 1) if stamps and n > 1 else float("nan")
    return ttft, tpot, n


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kestrel", default="build/release/kestrel")
    ap.add_argument("--preset", help="generated model preset when starting a server (default: the shipped model)")
    ap.add_argument("--model", help="checkpoint directory or GGUF file when starting a server")
    ap.add_argument("--url")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--reps", type=int, default=1, help="run the levels this many times in turn; report medians")
    ap.add_argument("--kernels", choices=["exact", "fast"], help="the server's --kernels (when starting one)")
    args = ap.parse_args()
    proc = None
    if args.url:
        u = urllib.parse.urlparse(args.url)
        host, port = u.hostname, u.port
    else:
        host, port = "127.0.0.1", free_port()
        cmd = [args.kestrel, "serve", "--quiet", "--port", str(port), "--max-running", "64", "--max-waiting", "1024",
               "--cache-mib", "1024", "--max-batch-tokens", "512", "--prefill-chunk", "256"]
        if args.preset:
            cmd += ["--preset", args.preset]
        if args.model:
            cmd += [args.model]
        if args.kernels:
            cmd += ["--kernels", args.kernels]
        proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        for _ in range(6000):
            try:
                urllib.request.urlopen(f"http://{host}:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
    levels = [int(x) for x in args.concurrency.split(",")]
    runs = {c: [] for c in levels}
    try:
        for _ in range(max(1, args.reps)):
            for c in levels:
                n_req = max(8, 2 * c)
                prompts = [f"Request {i}: topic {i % 7}" for i in range(n_req)]
                t0 = time.perf_counter()
                with cf.ThreadPoolExecutor(max_workers=c) as ex:
                    res = list(ex.map(lambda p: one(host, port, p, args.max_tokens), prompts))
                wall = time.perf_counter() - t0
                toks = sum(r[2] for r in res)
                tpot = statistics.median(r[1] for r in res)
                runs[c].append({"concurrency": c, "requests": n_req,
                                "ttft_p50_ms": 1000 * statistics.median(r[0] for r in res),
                                "tpot_p50_ms": 1000 * tpot,
                                "output_tok_s": toks / wall,
                                # Aggregate decode rate while streams are running: c streams, one token per TPOT each.
                                "decode_tok_s": c / tpot})
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)
    keys = ("ttft_p50_ms", "tpot_p50_ms", "output_tok_s", "decode_tok_s")
    rows = [{"concurrency": c, "requests": runs[c][0]["requests"], "reps": len(runs[c]),
             **{k: statistics.median(r[k] for r in runs[c]) for k in keys},
             "decode_tok_s_each": [r["decode_tok_s"] for r in runs[c]]} for c in levels]
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"{'conc':>5} {'reqs':>5} {'TTFT p50 ms':>12} {'TPOT p50 ms':>12} {'out tok/s':>10} {'decode tok/s':>13}")
        for r in rows:
            print(f"{r['concurrency']:>5} {r['requests']:>5} {r['ttft_p50_ms']:>12.1f} {r['tpot_p50_ms']:>12.2f} "
                  f"{r['output_tok_s']:>10.1f} {r['decode_tok_s']:>13.1f}")
        for r in rows[1:]:
            print(f"c={r['concurrency']} / c={rows[0]['concurrency']}: output {r['output_tok_s'] / rows[0]['output_tok_s']:.2f}x, "
                  f"decode {r['decode_tok_s'] / rows[0]['decode_tok_s']:.2f}x")
            if len(runs[levels[0]]) > 1:
                each = [a / b for a, b in zip(r["decode_tok_s_each"], rows[0]["decode_tok_s_each"])]
                print("  decode ratio per repetition: " + ", ".join(f"{x:.2f}x" for x in each))


if __name__ == "__main__":
    main()
