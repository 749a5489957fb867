#!/usr/bin/env python3
"""Decode TPOT under a mixed load: 16 streams decode continuously while long prompts arrive periodically, on one
colocated `kestrel serve` (OMP_NUM_THREADS=2) against 1 prefill + 1 decode `kestrel serve` (OMP_NUM_THREADS=1
each, the same two cores) behind `sglang-router --pd-disaggregation`. The reason PD exists: in the colocated server
a long prompt's prefill chunks share scheduler steps with the decodes; in PD they run on another instance.

    UCX_TLS=shm python bench/pd_mixed_load.py --kestrel build/release/kestrel --model models/default --reps 3 \\
        --json bench/results/pd_mixed_load-....json

Each repetition runs both setups in turn, each with fresh processes (ephemeral ports): the streams start (chat
completions, ignore_eos, `--stream-tokens` each, a finished stream starts again), then a quiet window
(`--quiet-s`, no long prompt), then the loaded window: `--longs` long prompts (`--long-words` words, max_tokens 1),
one every `--long-every-s`, the window ending `--long-every-s` after the last one was answered. TPOT per token =
the time since the previous delta of the same stream, spread over the tokens that arrived together (one read may
hold several); p50 / p99 over every token of the 16 streams inside the window. --pin puts the prefill instance on
CPU 0 and the decode instance on CPU 1 (taskset); the colocated server gets both. Prefix caching is off everywhere
(every long prompt is distinct anyway).
"""
import argparse
import concurrent.futures as cf
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

WORDS = ("harbor lantern tide compass anchor signal beacon keeper island storm ledger rope gull cliff night wave "
         "current shoal reef mast sail hull deck chart").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base, proc, path="/health", limit=300):
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{base} exited")
        try:
            with urllib.request.urlopen(base + path, timeout=1) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.2)
    sys.exit(f"{base} did not become healthy")


class Setup:
    """The server processes of one setup; `base` is where clients send requests."""

    def __init__(self, args, mode):
        self.procs, self.logs = [], []
        common = [args.kestrel, "serve", "--quiet", "--cache-mib", str(args.cache_mib), "--max-running",
                  str(args.streams + 4), "--max-context", str(args.max_context), "--no-prefix-cache"]
        common += ["--preset", args.preset] if args.preset else [args.model]
        if mode == "colocated":
            port = free_port()
            self._start(args, common + ["--port", str(port)], 2, "0,1")
            self.base = f"http://127.0.0.1:{port}"
        else:
            pport, dport, rport = free_port(), free_port(), free_port()
            self._start(args, common + ["--port", str(pport), "--role", "prefill"], 1, "0")
            self._start(args, common + ["--port", str(dport), "--role", "decode"], 1, "1")
            router = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                      "--prefill", f"http://127.0.0.1:{pport}", str(pport), "--decode", f"http://127.0.0.1:{dport}",
                      "--host", "127.0.0.1", "--port", str(rport), "--prometheus-port", str(free_port())]
            log = tempfile.TemporaryFile()
            self.procs.append(subprocess.Popen(router, stdout=log, stderr=subprocess.STDOUT))
            self.base = f"http://127.0.0.1:{rport}"
            wait_healthy(self.base, self.procs[-1], "/readiness")

    def _start(self, args, cmd, threads, cpus):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        if args.pin:
            cmd = ["taskset", "-c", cpus] + cmd
        log = tempfile.TemporaryFile()
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        port = cmd[cmd.index("--port") + 1]
        wait_healthy(f"http://127.0.0.1:{port}", p, "/health/ready")

    def close(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def chat_body(prompt, max_tokens, stream):
    b = {"model": "kimi-k3", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
         "temperature": 0, "ignore_eos": True, "chat_template_kwargs": {"thinking": False}, "stream": stream}
    if stream:
        b["stream_options"] = {"include_usage": True}
    return json.dumps(b)


def stream_loop(host, port, idx, max_tokens, stop, out, started):
    """Streams one request after another until `stop`; appends (arrival time, TPOT) per token to `out`."""
    n = 0
    while not stop.is_set():
        conn = http.client.HTTPConnection(host, port, timeout=600)
        conn.request("POST", "/v1/chat/completions", chat_body(f"Stream {idx}.{n}: tell me about the sea", max_tokens,
                                                               True), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise SystemExit(f"stream {idx}: HTTP {r.status} {r.read()[:200]}")
        buf, last = b"", None
        while not stop.is_set():
            chunk = r.read1(65536)
            if not chunk:
                break
            now = time.perf_counter()
            buf += chunk
            k = 0
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                payload = ev[6:]
                if payload == b"[DONE]":
                    continue
                for ch in json.loads(payload).get("choices", []):
                    d = ch.get("delta", {})
                    if d.get("content") or d.get("reasoning_content"):
                        k += 1
            if k == 0:
                continue
            if last is None:
                if n == 0:
                    started.release()
            else:
                out.extend([(now, (now - last) / k)] * k)
            last = now
        conn.close()
        n += 1


def long_prompt(rng, words):
    return f"Document {rng.random():.12f}: " + " ".join(rng.choice(WORDS) for _ in range(words))


def one_long(base_host, base_port, prompt):
    t = time.perf_counter()
    conn = http.client.HTTPConnection(base_host, base_port, timeout=600)
    conn.request("POST", "/v1/chat/completions", chat_body(prompt, 1, False), {"Content-Type": "application/json"})
    r = conn.getresponse()
    body = r.read()
    if r.status != 200:
        raise SystemExit(f"long prompt: HTTP {r.status} {body[:300]}")
    conn.close()
    return time.perf_counter() - t, json.loads(body)["usage"]["prompt_tokens"]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_once(args, mode, seed):
    setup = Setup(args, mode)
    host, port = "127.0.0.1", int(setup.base.rsplit(":", 1)[1])
    rng = random.Random(seed)
    stop, started, samples = threading.Event(), threading.Semaphore(0), []
    threads = [threading.Thread(target=stream_loop, args=(host, port, i, args.stream_tokens, stop, samples, started),
                                daemon=True) for i in range(args.streams)]
    try:
        one_long(host, port, long_prompt(rng, 8))  # warm-up (and the decode instance's handshake)
        for t in threads:
            t.start()
        for _ in range(args.streams):
            if not started.acquire(timeout=300):
                raise SystemExit("streams did not start")
        time.sleep(args.settle_s)
        q0 = time.perf_counter()
        time.sleep(args.quiet_s)
        t0 = time.perf_counter()
        longs = []
        with cf.ThreadPoolExecutor(max_workers=args.longs) as ex:
            futs = []
            for k in range(args.longs):
                futs.append(ex.submit(one_long, host, port, long_prompt(rng, args.long_words)))
                if k + 1 < args.longs:
                    time.sleep(args.long_every_s)
            longs = [f.result() for f in futs]
        time.sleep(args.long_every_s)
        t1 = time.perf_counter()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        setup.close()
    quiet = [s for at, s in samples if q0 <= at < t0]
    loaded = [s for at, s in samples if t0 <= at < t1]
    return {"mode": mode, "loadavg_1m_after": os.getloadavg()[0], "window_s": t1 - t0, "quiet_window_s": t0 - q0,
            "long_prompt_tokens": statistics.median(n for _, n in longs),
            "long_latency_ms": [1000 * t for t, _ in longs],
            "quiet": {"tokens": len(quiet), "tpot_p50_ms": 1000 * pct(quiet, 0.5), "tpot_p99_ms": 1000 * pct(quiet, 0.99)},
            "loaded": {"tokens": len(loaded), "tpot_p50_ms": 1000 * pct(loaded, 0.5),
                       "tpot_p99_ms": 1000 * pct(loaded, 0.99), "tpot_mean_ms": 1000 * statistics.fmean(loaded),
                       "tpot_max_ms": 1000 * max(loaded)}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kestrel", default="build/release/kestrel")
    ap.add_argument("--model", default="models/default", help="checkpoint directory (default: the shipped model)")
    ap.add_argument("--preset", help="a generated random-weight preset instead of --model (k3-bench, ...)")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--stream-tokens", type=int, default=2048, help="max_tokens of each stream (restarted when done)")
    ap.add_argument("--long-words", type=int, default=2000, help="words per long prompt")
    ap.add_argument("--longs", type=int, default=4, help="long prompts per loaded window")
    ap.add_argument("--long-every-s", type=float, default=5.0)
    ap.add_argument("--settle-s", type=float, default=2.0)
    ap.add_argument("--quiet-s", type=float, default=5.0)
    ap.add_argument("--cache-mib", type=int, default=1024)
    ap.add_argument("--max-context", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default="colocated,pd")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    runs, load_before = [], os.getloadavg()[0]
    for rep in range(args.reps):
        for mode in args.modes.split(","):
            r = run_once(args, mode, seed=1000 * rep + 17)
            r["rep"] = rep
            runs.append(r)
            L, Q = r["loaded"], r["quiet"]
            print(f"rep {rep} {mode:>9}: loaded TPOT p50 {L['tpot_p50_ms']:.1f} ms p99 {L['tpot_p99_ms']:.1f} ms "
                  f"(max {L['tpot_max_ms']:.0f}, {L['tokens']} tokens); quiet p50 {Q['tpot_p50_ms']:.1f} "
                  f"p99 {Q['tpot_p99_ms']:.1f}; long prompts {r['long_prompt_tokens']} tokens, latency "
                  + ", ".join(f"{x:.0f}" for x in r["long_latency_ms"]) + " ms", flush=True)
    summary = {}
    for mode in args.modes.split(","):
        rs = [r for r in runs if r["mode"] == mode]
        summary[mode] = {k: [r["loaded"][k] for r in rs] for k in ("tpot_p50_ms", "tpot_p99_ms")}
        summary[mode].update({"quiet_" + k: [r["quiet"][k] for r in rs] for k in ("tpot_p50_ms", "tpot_p99_ms")})
    for mode, s in summary.items():
        print(f"{mode:>9}: loaded p50 median {statistics.median(s['tpot_p50_ms']):.1f} ms "
              f"({min(s['tpot_p50_ms']):.1f}-{max(s['tpot_p50_ms']):.1f}), p99 median "
              f"{statistics.median(s['tpot_p99_ms']):.1f} ms ({min(s['tpot_p99_ms']):.1f}-{max(s['tpot_p99_ms']):.1f})")
    if "colocated" in summary and "pd" in summary:
        ratios = [c / p for c, p in zip(summary["colocated"]["tpot_p99_ms"], summary["pd"]["tpot_p99_ms"])]
        print("p99 colocated / PD per repetition: " + ", ".join(f"{x:.2f}x" for x in ratios))
        summary["p99_ratio_colocated_over_pd"] = ratios
    if args.json:
        cfg = {k: v for k, v in vars(args).items() if k not in ("json", "kestrel")}
        cfg["model"] = os.path.basename(os.path.normpath(args.model)) if not args.preset else None
        cfg["ucx_tls"] = os.environ.get("UCX_TLS", "")
        with open(args.json, "w") as f:
            json.dump({"bench": "pd_mixed_load", "config": cfg, "loadavg_1m_before": load_before, "runs": runs,
                       "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
