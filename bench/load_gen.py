#!/usr/bin/env python3
"""Load generator for `kestrel serve`: TTFT, TPOT and aggregate output tokens/s at several
concurrency levels, streaming chat completions with a fixed output length (ignore_eos).

    python bench/load_gen.py --kestrel build/release/kestrel --concurrency 1,16      # the shipped default model
    python bench/load_gen.py --kestrel build/release/kestrel --preset k3-bench --concurrency 1,4,16,64
    python bench/load_gen.py --kestrel build/release/kestrel --model path/to/checkpoint
    python bench/load_gen.py --url http://127.0.0.1:8000 ...      # an already running server
    python bench/load_gen.py --kestrel build/release/kestrel --model FILE.gguf \
        --llama-server LLAMA_BUILD/bin/llama-server --concurrency 1,16 --max-tokens 128 --reps 2 --json

Starts its own server (loopback, ephemeral port) unless --url is given. Bounded: each level runs
max(8, 2*c) requests (--requests N: N). --reps R runs the levels R times in turn (1, 16, 1, 16, ...) and reports the
median of each column, so a noisy machine's drift hits every level alike; the per-repetition
ratios are printed too. --kernels fast starts the server with `--kernels fast`.

--llama-server BIN (with --model FILE.gguf) also starts llama.cpp's server on the same file with the same
--threads, one slot per stream of the highest level (-np) and a context of that many slots of
(prompt + output + 64) tokens, weight repacking off (llama.cpp 0.3.36 aborts on the Kimi-Linear GGUF with it on), and runs
the same levels against both engines: each repetition runs every level on one engine, then on the
other, the order swapped every repetition. Prompts are then --prompt-tokens random token ids (exact
lengths, no chat template; Kestrel's /v1/completions, llama-server's /completion, greedy, ignore_eos), and
the report adds, per level, Kestrel / llama-server for output tok/s and llama-server / Kestrel for TPOT
(both > 1 where Kestrel is ahead). Both servers get one untimed warm-up round at the highest level.
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
import time
import urllib.parse
import urllib.request


def sse_events(r):
    """The JSON payloads of a server-sent event stream, in order ([DONE] and comment events skipped)."""
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev.startswith(b":"):  # an SSE comment (a keep-alive), not an event
                continue
            if ev[6:] != b"[DONE]":
                try:
                    yield json.loads(ev[6:])
                except json.JSONDecodeError:
                    raise SystemExit(f"load_gen: a server-sent event that is not JSON: {ev[:300]!r}")


def one(host, port, prompt, max_tokens):
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", "/v1/chat/completions", json.dumps({
        "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "chat_template_kwargs": {"thinking": False}, "stream": True, "stream_options": {"include_usage": True}}),
        {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    stamps, usage = [], None
    for j in sse_events(r):
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


def one_ids(host, port, engine, ids, max_tokens):
    """One streamed completion of a token-id prompt: Kestrel's /v1/completions or llama-server's /completion."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    if engine == "llama-server":
        body = {"prompt": ids, "n_predict": max_tokens, "cache_prompt": False, "stream": True, "temperature": 0,
                "top_k": 1, "ignore_eos": True, "return_tokens": True}
        conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    else:
        body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                "logprobs": 0, "stream_options": {"include_usage": True}}
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    stamps, n = [], None
    for j in sse_events(r):
        if engine == "llama-server":
            if j.get("timings"):
                n = int(j["timings"]["predicted_n"])
            if j.get("tokens") or j.get("content"):
                stamps.append(time.perf_counter())
        else:
            if j.get("usage"):
                n = j["usage"]["completion_tokens"]
            for ch in j.get("choices", []):
                if (ch.get("logprobs") or {}).get("tokens") or ch.get("text"):
                    stamps.append(time.perf_counter())
    conn.close()
    n = len(stamps) if n is None else n
    if n != max_tokens:
        raise SystemExit(f"load_gen: a {engine} stream ended after {n} of {max_tokens} tokens")
    ttft = (stamps[0] - t0) if stamps else float("nan")
    tpot = (stamps[-1] - stamps[0]) / (n - 1) if stamps and n > 1 else float("nan")
    return ttft, tpot, n


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(host, port, proc, name):
    for _ in range(12000):
        try:
            urllib.request.urlopen(f"http://{host}:{port}/health", timeout=1)
            return
        except Exception:
            if proc is not None and proc.poll() is not None:
                raise SystemExit(f"load_gen: {name} exited before it was healthy")
            time.sleep(0.1)
    raise SystemExit(f"load_gen: {name} did not become healthy")


def start_kestrel(args, port, peer):
    cmd = [args.kestrel, "serve", "--quiet", "--port", str(port), "--max-running", "64", "--max-waiting", "1024",
           "--cache-mib", "1024", "--max-batch-tokens", "512", "--prefill-chunk", "256"]
    if args.preset:
        cmd += ["--preset", args.preset]
    if args.model:
        cmd += [args.model]
    if args.kernels:
        cmd += ["--kernels", args.kernels]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads)) if peer else None
    return subprocess.Popen(cmd, stderr=subprocess.DEVNULL, env=env), cmd


def start_llama_server(args, port, levels):
    slots = max(levels)
    ctx = slots * (args.prompt_tokens + args.max_tokens + 64)
    cmd = [args.llama_server, "-m", args.model, "--port", str(port), "--host", "127.0.0.1", "-t", str(args.threads),
           "-tb", str(args.threads), "-np", str(slots), "-c", str(ctx), "-b", "512", "-ub", "512", "--no-ui",
           "--fit", "off", "--no-repack"]
    env = dict(os.environ)
    lib = os.path.dirname(os.path.abspath(args.llama_server))
    env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env), cmd


def run_level(host, port, engine, c, max_tokens, prompts):
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=c) as ex:
        if engine is None:
            res = list(ex.map(lambda p: one(host, port, p, max_tokens), prompts))
        else:
            res = list(ex.map(lambda p: one_ids(host, port, engine, p, max_tokens), prompts))
    wall = time.perf_counter() - t0
    toks = sum(r[2] for r in res)
    tpot = statistics.median(r[1] for r in res)
    return {"concurrency": c, "requests": len(prompts),
            "ttft_p50_ms": 1000 * statistics.median(r[0] for r in res),
            "tpot_p50_ms": 1000 * tpot,
            "output_tok_s": toks / wall,
            # Aggregate decode rate while streams are running: c streams, one token per TPOT each.
            "decode_tok_s": c / tpot}


def n_requests(args, c):
    return args.requests if args.requests else max(8, 2 * c)


KEYS = ("ttft_p50_ms", "tpot_p50_ms", "output_tok_s", "decode_tok_s")


def summarize(runs, levels):
    return [{"concurrency": c, "requests": runs[c][0]["requests"], "reps": len(runs[c]),
             **{k: statistics.median(r[k] for r in runs[c]) for k in KEYS},
             "decode_tok_s_each": [r["decode_tok_s"] for r in runs[c]],
             "output_tok_s_each": [r["output_tok_s"] for r in runs[c]]} for c in levels]


def print_rows(rows, runs, levels):
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


def compare(args, levels):
    """Kestrel and llama-server on the same GGUF, same threads, same token-id prompts; levels alternate per repetition."""
    host = "127.0.0.1"
    rng = random.Random(7)
    lo, hi = args.token_range
    # One prompt set per (repetition, level), shared by both engines; distinct prompts, so no prefix reuse.
    prompt_sets = {(rep, c): [[rng.randrange(lo, hi) for _ in range(args.prompt_tokens)] for _ in range(n_requests(args, c))]
                   for rep in range(max(1, args.reps)) for c in levels}
    load = os.getloadavg()[0]
    servers = {}
    try:
        kport, lport = free_port(), free_port()
        kproc, kcmd = start_kestrel(args, kport, True)
        servers["kestrel"] = (kproc, kport)
        wait_healthy(host, kport, kproc, "kestrel")
        lproc, lcmd = start_llama_server(args, lport, levels)
        servers["llama-server"] = (lproc, lport)
        wait_healthy(host, lport, lproc, "llama-server")
        names = ["kestrel", "llama-server"]
        for e in names:
            warm = [[rng.randrange(lo, hi) for _ in range(args.prompt_tokens)] for _ in range(max(levels))]
            run_level(host, servers[e][1], e, max(levels), 8, warm)
        runs = {e: {c: [] for c in levels} for e in names}
        for rep in range(max(1, args.reps)):
            for e in (names if rep % 2 == 0 else names[::-1]):
                for c in levels:
                    row = run_level(host, servers[e][1], e, c, args.max_tokens, prompt_sets[(rep, c)])
                    runs[e][c].append(row)
                    print(f"rep {rep} {e:>12} c={c}: {row['output_tok_s']:.1f} output tok/s, "
                          f"TPOT p50 {row['tpot_p50_ms']:.1f} ms", file=sys.stderr)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    rows = {e: summarize(runs[e], levels) for e in runs}
    ratios = []
    for i, c in enumerate(levels):
        k, l = rows["kestrel"][i], rows["llama-server"][i]
        ratios.append({"concurrency": c,
                       "output_tok_s_ratio": k["output_tok_s"] / l["output_tok_s"],
                       "tpot_p50_ratio": l["tpot_p50_ms"] / k["tpot_p50_ms"],
                       "output_tok_s_ratio_each": [a["output_tok_s"] / b["output_tok_s"]
                                                   for a, b in zip(runs["kestrel"][c], runs["llama-server"][c])]})
    base = os.path.basename
    out = {"model": base(args.model), "threads": args.threads, "prompt_tokens": args.prompt_tokens,
           "max_tokens": args.max_tokens, "reps": max(1, args.reps), "load_avg_1m_at_start": load,
           "kestrel_cmd": [base(kcmd[0])] + [base(x) if x == args.model else x for x in kcmd[1:]],
           "llama_server_cmd": [base(lcmd[0])] + [base(x) if x == args.model else x for x in lcmd[1:]],
           "engines": rows, "ratios": ratios}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for e in rows:
            print(e)
            print_rows(rows[e], runs[e], levels)
        for r in ratios:
            print(f"c={r['concurrency']}: Kestrel / llama-server output tok/s {r['output_tok_s_ratio']:.2f}x "
                  f"(each repetition: {', '.join(f'{x:.2f}x' for x in r['output_tok_s_ratio_each'])}), "
                  f"TPOT p50 {r['tpot_p50_ratio']:.2f}x")


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
    ap.add_argument("--requests", type=int, help="requests per level (default: max(8, 2 x concurrency))")
    ap.add_argument("--llama-server", help="llama.cpp's server binary: also run it on --model (a GGUF) and compare")
    ap.add_argument("--threads", type=int, default=2, help="compute threads of both servers (with --llama-server)")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="token-id prompt length (with --llama-server)")
    ap.add_argument("--token-range", type=int, nargs=2, default=(1, 2000), help="prompt token ids are drawn here")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    if args.llama_server:
        if not (args.model and args.model.endswith(".gguf")) or args.url or args.preset:
            raise SystemExit("load_gen: --llama-server needs --model FILE.gguf (and no --url or --preset)")
        compare(args, levels)
        return
    proc = None
    if args.url:
        u = urllib.parse.urlparse(args.url)
        host, port = u.hostname, u.port
    else:
        host, port = "127.0.0.1", free_port()
        proc, _ = start_kestrel(args, port, False)
        wait_healthy(host, port, proc, "kestrel")
    runs = {c: [] for c in levels}
    try:
        for _ in range(max(1, args.reps)):
            for c in levels:
                prompts = [f"Request {i}: topic {i % 7}" for i in range(n_requests(args, c))]
                runs[c].append(run_level(host, port, None, c, args.max_tokens, prompts))
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)
    rows = summarize(runs, levels)
    if args.json:
        print(json.dumps(rows))
    else:
        print_rows(rows, runs, levels)


if __name__ == "__main__":
    main()
