#!/usr/bin/env python3
"""Time to first token through `sglang-router --pd-disaggregation` (1 prefill + 1 decode `kestrel serve`, the state
handed over by UCX) against one colocated `kestrel serve`, same model and flags, on loopback. Each request is a
chat completion with max_tokens 1 (greedy, not streamed), so its latency is the TTFT as a client sees it; through
the router it includes the prefill, the hand-off and the router's two forwards. Requests run one at a time, so
the instances never compete for the cores. Starts every process itself (ephemeral ports); UCX_TLS from the
environment (shm or tcp).

    UCX_TLS=tcp python bench/pd_ttft.py --kestrel build/release/kestrel --preset k3-default --words 40 --runs 5
    UCX_TLS=shm python bench/pd_ttft.py --model models/default --words 4000 --max-context 8192 --runs 5 --json OUT

The two setups alternate run by run (colocated, router, colocated, ...), so drift on a shared machine hits both.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base, proc, limit=180):
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{base} exited")
        try:
            with urllib.request.urlopen(base + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.2)
    sys.exit(f"{base} did not become healthy")


def start(args, extra):
    port = free_port()
    model = ["--preset", args.preset] if args.preset else [args.model]
    cmd = [args.kestrel, "serve", "--quiet", "--port", str(port), *model, "--cache-mib",
           str(args.cache_mib), "--max-context", str(args.max_context), "--no-prefix-cache", *extra]
    p = subprocess.Popen(cmd, stdout=tempfile.TemporaryFile(), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, p)
    return p, base, port


def ttft(base, words, salt=0):
    # A distinct first word per run: nothing can be served from a cache.
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": " ".join([f"run{salt}"] + ["lighthouse"] * words)}],
            "max_tokens": 1, "temperature": 0}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    return time.perf_counter() - t, out["usage"]["prompt_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kestrel", default="build/release/kestrel")
    ap.add_argument("--preset", help="a generated random-weight preset (k3-default, k3-bench, ...)")
    ap.add_argument("--model", help="a checkpoint directory instead of --preset")
    ap.add_argument("--words", type=int, default=40, help="prompt words (the k3-default tokenizer: about 12 tokens each)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cache-mib", type=int, default=256)
    ap.add_argument("--max-context", type=int, default=2048)
    ap.add_argument("--json", help="write the per-run TTFTs here")
    args = ap.parse_args()
    if not args.preset and not args.model:
        args.preset = "k3-default"
    procs = []
    try:
        col, col_base, _ = start(args, [])
        pre, pre_base, pre_port = start(args, ["--role", "prefill"])
        dec, dec_base, _ = start(args, ["--role", "decode"])
        procs += [col, pre, dec]
        rport = free_port()
        router = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                                   "--prefill", f"http://127.0.0.1:{pre_port}", str(pre_port), "--decode", dec_base,
                                   "--host", "127.0.0.1", "--port", str(rport), "--prometheus-port", str(free_port())],
                                  stdout=tempfile.TemporaryFile(), stderr=subprocess.STDOUT)
        procs.append(router)
        wait_healthy(f"http://127.0.0.1:{rport}", router)
        setups = (("colocated", col_base), ("router 1P+1D", f"http://127.0.0.1:{rport}"))
        ts, n = {name: [] for name, _ in setups}, 0
        for name, base in setups:
            ttft(base, 4)  # warm-up (and the decode instance's handshake)
        for run in range(args.runs):
            for name, base in setups:
                dt, n = ttft(base, args.words, run)
                ts[name].append(dt * 1000)
        for name, _ in setups:
            print(f"{name:>13}: prompt {n} tokens, TTFT median {statistics.median(ts[name]):.0f} ms, "
                  f"min {min(ts[name]):.0f} ms, max {max(ts[name]):.0f} ms ({args.runs} runs, "
                  f"UCX_TLS={os.environ.get('UCX_TLS', '')})")
        # The prefill's own account of each hand-off: parked (first token sampled) → completion sent.
        with urllib.request.urlopen(pre_base + "/metrics", timeout=10) as r:
            metrics = dict(line.rsplit(" ", 1) for line in r.read().decode().splitlines()
                           if line.startswith(("kestrel_pd_handoff_seconds_sum", "kestrel_pd_handoff_seconds_count",
                                               "kestrel_pd_transfer_bytes_total")))
        handoffs = float(metrics["kestrel_pd_handoff_seconds_count"])
        handoff_ms = 1000 * float(metrics["kestrel_pd_handoff_seconds_sum"]) / handoffs
        handoff_bytes = float(metrics["kestrel_pd_transfer_bytes_total"]) / handoffs
        print(f"prefill side: {handoffs:.0f} hand-offs, mean {handoff_ms:.1f} ms parked -> completion sent, "
              f"{handoff_bytes / 1e6:.2f} MB each (the 4-word warm-up included)")
        c_med, p_med = statistics.median(ts["colocated"]), statistics.median(ts["router 1P+1D"])
        print(f"added by the hand-off and the router: {p_med - c_med:.0f} ms median "
              f"({100 * (p_med - c_med) / c_med:.1f} %)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"bench": "pd_ttft", "model": os.path.basename(os.path.normpath(args.model)) if args.model
                           else args.preset, "prompt_tokens": n, "ucx_tls": os.environ.get("UCX_TLS", ""),
                           "runs": args.runs, "loadavg_1m_after": os.getloadavg()[0], "ttft_ms": ts, "median_ms": {k: statistics.median(v) for k, v in ts.items()},
                           "added_fraction": (p_med - c_med) / c_med, "prefill_handoffs": handoffs,
                           "prefill_handoff_mean_ms": handoff_ms, "handoff_mean_bytes": handoff_bytes}, f, indent=1)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)


if __name__ == "__main__":
    main()
