#!/usr/bin/env python3
"""Side-by-side benchmark, Kestrel vs llama.cpp, on the very same GGUF files.

The peers are fetched and built by bench/peers.py from their PyPI source packages into a cache directory
outside the repository (default ~/.cache/kestrel-peers): llama.cpp from llama-cpp-python's (its converter,
gguf-py and Python bindings too), ik_llama.cpp from ik-llama-cpp-python's. The script runs itself under the
peers' virtual environment (torch + transformers for the converter), so any python3 starts it:

    python3 bench/llama_cpp_compare.py --kestrel build/release/kestrel --work-dir /tmp/llbench -r 3 \
        -p 512,4096,16384 --out-json bench_llama_cpp.json --out-md bench_llama_cpp.md

(`--llama-cpp-src DIR` instead uses an llama.cpp tree of your own, with `llama_cpp` importable by this python.)

Models (made once under --work-dir, reused afterwards; sha256 recorded):
  kimi-linear-bench  Kimi-Linear-48B-A3B layer widths (hidden 2304, 32 KDA/MLA heads, 3 KDA + 1 MLA,
                     64 experts top-8 + 1 shared at 1024, dense 9216), vocab 32768      -> Q4_0
  k3-shape-bench     K3 layer widths (hidden 7168, 96 heads, q_lora 1536, LatentMoE 3584/3072, 2 shared,
                     dense 33792): layer 0 KDA + dense, layer 1 MLA + MoE (32 experts top-8), vocab 32768
                                                                                          -> Q4_0, and the
                     released format (MXFP4 experts repacked by the converter, everything else BF16)
  deepseek2-lite-bench  DeepSeek-V2-Lite layer widths (hidden 2048, 16 MLA heads without q_lora, kv_lora 512,
                     64 experts top-6 + 2 shared at 1408, dense 10944), 1 dense + 3 MoE layers, vocab 32768
                                                                                          -> Q4_0
  qwen3moe-bench     Qwen3-30B-A3B layer widths (hidden 2048, 32 query / 4 KV heads of 128, q/k norms,
                     128 experts top-8 at 768, no shared expert), 8 of its 48 layers, vocab 32768 -> Q4_0
  gptoss-bench       gpt-oss-20b layer widths (hidden 2880, 64 query / 8 KV heads of 64 with biases and sinks,
                     window 128 on the even layers, YaRN, 32 experts top-4 at 2880 with biases), 4 of its 24
                     layers, vocab 32768                   -> MXFP4_MOE (experts MXFP4, other matrices Q8_0)
Pipeline: `kestrel make-model` (HF layout) -> llama.cpp's convert_hf_to_gguf.py -> llama_model_quantize
(Q4_0; output and token_embd forced to Q4_0, F32 norms/routers kept as llama.cpp keeps them; or MXFP4_MOE).

Protocol per file (docs/model-math.md §9.3; llama-bench semantics):
  * page cache warmed (one full read of the file) before each engine;
  * correctness gate first: a fixed random 32-token prompt, Kestrel's greedy 16-token continuation and the
    logits behind each choice (`kestrel bench --gate-*`) against llama.cpp's logits at the same positions
    (llama.cpp fed the prompt + Kestrel's tokens). Bounds below (GATE_*); timing is skipped when it fails;
  * ppN (N from -p, 512 by default): N prompt tokens on an empty context (llama.cpp: llama_decode calls of
    n_batch = n_ubatch = 512 tokens);
    tg128: 128 single-token decodes from an empty context; -r repetitions, mean ± sd of per-repetition t/s;
    both engines with 2 threads, one untimed warm-up (a pp-token prefill + 1 decode, as llama-bench) first;
  * Kestrel: `kestrel bench --model FILE --threads 2 --pp 512 --tg 128 --reps R --json`;
    llama.cpp: llama_cpp.Llama in this process (f16 KV cache and flash-attention setting at the package
    defaults, as llama-bench), driven through Llama.eval (one llama_decode per call).
Derived, per cell: ratio = Kestrel / llama.cpp; active weight bytes per token from the GGUF header (all
tensors, one embedding row, top-k/n_expert of each routed-expert tensor); achieved GB/s = tg t/s × active bytes;
% of the DRAM read roofline measured in the same run (bench/membw_bench, 2 threads, the better of before
and after the cells; --dram-gb-s overrides); prefill GOP/s = pp t/s ×
2 × active matrix params; % of the int8 peak measured in the same run (bench/w4a8_bench BM_Int8Peak,
2 threads: vpdpbusd zmm with AVX-512 VNNI, else AVX2's vpmaddubsw + vpmaddwd + vpaddd). Kestrel's
`--kernels fast` mode (KESTREL_MXFP4_INT8=1 KESTREL_BF16_ACTS=1: int8 activations on compressed-tensors MXFP4 experts, bf16 activations on BF16 weights) applies to safetensors checkpoints (GGUF
files already run that way by default), so it is run on the K3 safetensors checkpoint the MXFP4 GGUF was
converted from (same expert bits, same BF16 rest) as an extra Kestrel row.
ik_llama.cpp loads none of the kimi-k3 / kimi-linear files; on the cells it loads (IK_ARCHS) it is timed with
its own llama-bench (-p/-n/-r as above, JSON output, --ik-args: its MLA, flash-attention and fused-MoE
options), not gated (the gate is Kestrel against mainline llama.cpp). llama.cpp 0.3.36 runs deepseek2 files only
with its CPU weight repacking off (NO_REPACK_ARCHS; tools/gen_gguf_goldens.py says why).
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (standard library only)


def _run_in_peers_venv():
    """Re-executes this script under the peers' virtual environment (numpy, torch, transformers for the
    converter) unless --llama-cpp-src names a tree of the caller's own or it already runs there; before any
    import that needs them, so a bare python3 starts it. --help needs none of them."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--peers-dir", default=peers.default_dir())
    pre.add_argument("--llama-cpp-src")
    pre.add_argument("-h", "--help", action="store_true")
    known, _ = pre.parse_known_args()
    if known.llama_cpp_src or known.help:
        return
    venv_py = peers.venv_python(known.peers_dir)
    if os.path.realpath(sys.prefix) != os.path.realpath(os.path.dirname(os.path.dirname(venv_py))):
        os.execv(venv_py, [venv_py, os.path.abspath(__file__), *sys.argv[1:]])


if __name__ == "__main__":
    _run_in_peers_venv()

try:
    import numpy as np
    import llbench_models as lm  # noqa: E402
except ImportError:  # only --help gets here without them (see _run_in_peers_venv)
    np = lm = None

# Gate bounds. llama.cpp quantizes activations to Q8_0 before Q4_0/Q8_0/MXFP4 products (Kestrel's default
# GGUF int8 mode does the same, bit for bit: tests/ops/gguf_int8_test) and rounds them to BF16/F16 elsewhere
# (its MLA latent cache is F16). On these random-weight bench models the per-row NMSE is bimodal: rows
# where both engines route every token to the same experts agree to ~1e-3 (int8 mode: ~7e-4), rows where
# one of the 8 routed experts flips in one MoE layer (near-tied router scores: random weights) land at
# 1e-2..1e-1, and which rows flip is chance (the kimi-linear cell measured 6 to 9 flipped rows of 16).
# A wrong layout / scale / expert mapping gives NMSE ~1 on every row and top-1 ~1/vocab. Bounds: at least
# a quarter of the rows clean (NMSE <= 5e-3), median NMSE <= 0.1, greedy top-1 agreement >= 0.3.
GATE_CLEAN_NMSE = 5e-3
GATE_MIN_CLEAN_FRAC = 0.25
GATE_MEDIAN_NMSE = 0.1
GATE_MIN_TOP1 = 0.3
GATE_PROMPT = 32
GATE_GEN = 16

CELLS = [
    # (cell name, preset, gguf kind, extra Kestrel rows)
    ("kimi-linear-bench Q4_0", "kimi-linear-bench", "q4_0", []),
    ("k3-shape-bench Q4_0", "k3-shape-bench", "q4_0", []),
    ("k3-shape-bench MXFP4 experts + BF16", "k3-shape-bench", "mxfp4", ["int8"]),
    ("deepseek2-lite-bench Q4_0", "deepseek2-lite-bench", "q4_0", []),
    ("qwen3moe-bench Q4_0", "qwen3moe-bench", "q4_0", []),
    ("gptoss-bench MXFP4 experts + Q8_0", "gptoss-bench", "mxfp4_moe", []),
]
IK_ARCHS = {"deepseek2", "qwen3moe", "gpt-oss"}  # GGUF architectures of these cells that ik_llama.cpp loads
NO_REPACK_ARCHS = {"deepseek2"}
IK_ARGS = "-mla 3 -fa 1 -fmoe 1"


def warm_page_cache(path):
    paths = [path] if os.path.isfile(path) else [os.path.join(path, f) for f in sorted(os.listdir(path))]
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def membw(binary, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([binary, "2", "5"], check=True, capture_output=True, text=True, env=env).stdout
    return float(re.search(r"read ([0-9.]+) GB/s", out).group(1))


def int8_peak(binary, threads):
    """The CPU's int8 dot-product peak (ops/s) and its form: vpdpbusd zmm with AVX-512 VNNI, else AVX2's
    vpmaddubsw + vpmaddwd + vpaddd (bench/w4a8_bench BM_Int8Peak)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([binary, "--benchmark_filter=Int8Peak", "--benchmark_format=json"], check=True,
                         capture_output=True, text=True, env=env).stdout
    b = json.loads(out)["benchmarks"][0]
    form = "VNNI" if int(b["isa"]) == 512 else "AVX2 (vpmaddubsw+vpmaddwd)"
    return float(b["TOPS"]) * 1e12, form


def kestrel_bench(kestrel, model, threads, pp, tg, reps, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    env.pop("OMP_NUM_THREADS", None)
    cmd = [kestrel, "bench", "--model", model, "--threads", str(threads), "--pp", str(pp), "--tg", str(tg),
           "--reps", str(reps), "--json"]
    lm.log("+ " + " ".join(cmd) + (f"  ({env_extra})" if env_extra else ""))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def kestrel_gate(kestrel, model, prompt, gen, logits_path, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    cmd = [kestrel, "bench", "--model", model, "--threads", "2", "--gate-ids", ",".join(map(str, prompt)),
           "--gate-gen", str(gen), "--gate-out", logits_path]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    j = json.loads(out.strip().splitlines()[-1])
    logits = np.fromfile(logits_path, dtype=np.float32).reshape(gen, j["vocab"])
    os.remove(logits_path)
    return j["generated"], logits


def llama_open(llama_cpp, path, threads, n_ctx, logits_all=False, repack=True):
    """repack=False: llama_model_params.use_extra_bufts = false (what llama-bench --no-repack sets)."""
    default = llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = repack
        return p
    llama_cpp.llama.llama_cpp.llama_model_default_params = params
    try:
        return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                               n_threads_batch=threads, n_gpu_layers=0, logits_all=logits_all, seed=0,
                               verbose=False)
    finally:
        llama_cpp.llama.llama_cpp.llama_model_default_params = default


def llama_gate(llama_cpp, path, threads, prompt, generated, repack=True):
    """llama.cpp's logits at the positions where Kestrel chose each generated token (teacher forcing)."""
    llm = llama_open(llama_cpp, path, threads, 128, logits_all=True, repack=repack)
    seq = list(prompt) + list(generated[:-1])
    llm.eval(seq)
    rows = np.array(llm.scores[len(prompt) - 1: len(seq)], dtype=np.float32, copy=True)
    llm.close()
    return rows


def gate_stats(ours, ref, generated):
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    nmse = np.sum((a - b) ** 2, axis=1) / np.sum(b ** 2, axis=1)
    top1 = float(np.mean(np.argmax(ref, axis=1) == np.array(generated)))
    return {"median_nmse": float(np.median(nmse)), "max_nmse": float(np.max(nmse)), "top1": top1,
            "max_abs": float(np.max(np.abs(a - b))), "rows": int(len(nmse)),
            "clean_frac": float(np.mean(nmse <= GATE_CLEAN_NMSE)),
            "pass": bool(np.median(nmse) <= GATE_MEDIAN_NMSE and top1 >= GATE_MIN_TOP1
                         and np.mean(nmse <= GATE_CLEAN_NMSE) >= GATE_MIN_CLEAN_FRAC)}


def stats(n, runs):
    """runs: (wall seconds, cpu seconds) per repetition of n tokens."""
    secs = [w for w, _ in runs]
    ts = [n / x for x in secs]
    return {"n_tokens": n, "seconds": secs, "tok_s": ts, "tok_s_mean": float(np.mean(ts)),
            "tok_s_sd": float(np.std(ts, ddof=1)) if len(ts) > 1 else 0.0, "cores_used": [c / w for w, c in runs]}


def llama_bench(llama_cpp, path, threads, pps, tg, reps, repack=True):
    """{"pp": {N: stats}, "tg": stats}: the pp sizes and tg of one loaded model, in this process."""
    llm = llama_open(llama_cpp, path, threads, max(max(pps), tg) + 64, repack=repack)
    vocab = llm.n_vocab()
    tg_ids = [(i * 7919 + 13) % vocab for i in range(tg)]  # the same ids Kestrel's bench uses

    # process_time = CPU seconds of all threads of this process (llama.cpp's workers included):
    # cpu / wall = cores the engine actually got (< threads means a contended machine).
    def run_pp(ids):
        llm.reset()  # n_tokens = 0: eval() clears the KV cache from position 0
        c0, t0 = time.process_time(), time.perf_counter()
        llm.eval(ids)
        return time.perf_counter() - t0, time.process_time() - c0

    def run_tg(ids):
        llm.reset()
        c0, t0 = time.process_time(), time.perf_counter()
        for t in ids:
            llm.eval([t])
        return time.perf_counter() - t0, time.process_time() - c0

    res = {"pp": {}}
    for pp in pps:
        # Each run its own prompt, as `kestrel bench` salts them (bench_prompt_ids): rep r uses salt r.
        def ids(salt, n=pp):
            return [(i * 7919 + 13 + salt * 104729) % vocab for i in range(n)]
        run_pp(ids(reps, max(32, min(pp, 512))))  # warm-up, as for Kestrel
        res["pp"][str(pp)] = stats(pp, [run_pp(ids(r)) for r in range(reps)])
    if tg > 0:
        run_tg(tg_ids[:1])
        res["tg"] = stats(tg, [run_tg(tg_ids) for _ in range(reps)])
    llm.close()
    return res


def kestrel_bench_all(kestrel, model, threads, pps, tg, reps, env_extra=None):
    """Kestrel's bench once per pp size (tg with the first), in the shape llama_bench returns."""
    res = {"pp": {}}
    for i, pp in enumerate(pps):
        r = kestrel_bench(kestrel, model, threads, pp, tg if i == 0 else 0, reps, env_extra)
        res["pp"][str(pp)] = r["pp"]
        if "tg" in r:
            res["tg"] = r["tg"]
    return res


def ik_bench(peer, path, threads, pps, tg, reps, extra):
    """ik_llama.cpp's llama-bench (-o json), in the shape llama_bench returns (no per-run CPU time: its
    cores_used are not measured)."""
    cmd = [os.path.join(peer["bin"], "llama-bench"), "-m", path, "-t", str(threads), "-p", ",".join(map(str, pps)),
           "-n", str(tg), "-r", str(reps), "-o", "json", *extra]
    lm.log("+ " + " ".join(cmd))
    env = dict(os.environ, LD_LIBRARY_PATH=peer["bin"])
    text = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    # ik_llama.cpp also prints notes on stdout, inside the JSON array ("Adjusted mainline llama.cpp MLA tensors",
    # "Computed blk.N.attn_kv_b.weight ..."), each on a line of its own starting in column 0 with a letter or "=";
    # the JSON's own lines are brackets or indented.
    out = json.loads("\n".join(line for line in text.splitlines() if line[:1] in ("[", "]", "{", "}", " ", "\t")))
    res = {"pp": {}, "command": cmd[1:]}
    for e in out:
        n = e["n_prompt"] or e["n_gen"]
        ts = [float(x) for x in e["samples_ts"]]
        r = {"n_tokens": n, "seconds": [n / x for x in ts], "tok_s": ts, "tok_s_mean": float(e["avg_ts"]),
             "tok_s_sd": float(e["stddev_ts"])}
        if e["n_gen"] == 0:
            res["pp"][str(n)] = r
        elif e["n_prompt"] == 0:
            res["tg"] = r
    return res


def fmt(r):
    return f"{r['tok_s_mean']:.2f} ± {r['tok_s_sd']:.2f}" if r else "—"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kestrel", default="build/release/kestrel")
    ap.add_argument("--membw", default="build/release/bench/membw_bench")
    ap.add_argument("--w4a8-bench", default="build/release/bench/w4a8_bench")
    ap.add_argument("--peers-dir", default=peers.default_dir(),
                    help="where bench/peers.py fetches and builds the peers (default: %(default)s)")
    ap.add_argument("--llama-cpp-src",
                    help="an llama.cpp tree of your own (converter, gguf-py) instead of the peers' build; "
                         "`llama_cpp` must then be importable by this python")
    ap.add_argument("--engines", default="llama.cpp,ik_llama.cpp",
                    help="peers to time beside Kestrel: llama.cpp (always: the gate's reference), ik_llama.cpp")
    ap.add_argument("--ik-args", default=IK_ARGS, help="ik_llama.cpp llama-bench options (default: %(default)s)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel jobs of the peers' builds")
    ap.add_argument("--work-dir", default="/tmp/llbench")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--pp", default="512", help="prompt sizes, comma-separated (default: %(default)s)")
    ap.add_argument("-n", "--tg", type=int, default=128)
    ap.add_argument("--cells", default="all", help="comma-separated cell indices (0..%d) or 'all'" % (len(CELLS) - 1))
    ap.add_argument("--no-int8", action="store_true", help="skip the --kernels fast safetensors rows")
    ap.add_argument("--dram-gb-s", type=float, default=0.0,
                    help="roofline to use instead of this run's membw_bench (e.g. a quiet-machine figure)")
    ap.add_argument("--out-json", default="llama_cpp_compare.json")
    ap.add_argument("--out-md", default="llama_cpp_compare.md")
    args = ap.parse_args()
    if args.tg < 1:
        ap.error("-n/--tg must be at least 1 (every row reports a decode rate and its roofline fraction)")
    pps = [int(x) for x in args.pp.split(",")]
    engines = args.engines.split(",")
    if args.llama_cpp_src:
        llama_src, llama_peer = args.llama_cpp_src, None
        import llama_cpp
    else:
        llama_peer = peers.ensure("llama.cpp", args.peers_dir, args.jobs)
        llama_src = llama_peer["src"]
        llama_cpp = peers.import_llama_cpp(llama_peer)
    ik_peer = peers.ensure("ik_llama.cpp", args.peers_dir, args.jobs) if "ik_llama.cpp" in engines else None
    sys.path.insert(0, os.path.join(llama_src, "gguf-py"))  # the vendored gguf-py (header reader)
    import gguf

    os.makedirs(args.work_dir, exist_ok=True)
    t_start = time.time()
    cells = CELLS if args.cells == "all" else [CELLS[int(i)] for i in args.cells.split(",")]

    # 1. Files (made once, then reused).
    files = {}
    for _, preset, kind, _ in cells:
        ckpt = lm.make_checkpoint(args.kestrel, preset, os.path.join(args.work_dir, preset))
        mx = os.path.join(args.work_dir, f"{preset}-{'mxfp4' if preset.startswith('k3') else 'bf16'}.gguf")
        lm.convert(sys.executable, llama_src, ckpt, mx, "bf16")
        path = mx
        if kind == "q4_0":
            path = lm.quantize_q4_0(mx, os.path.join(args.work_dir, f"{preset}-q4_0.gguf"))
        elif kind == "mxfp4_moe":
            path = lm.quantize_mxfp4_moe(mx, os.path.join(args.work_dir, f"{preset}-mxfp4-moe.gguf"))
        files[(preset, kind)] = (ckpt, path)

    # 2. Machine limits, same run.
    bw_before = membw(args.membw, args.threads)
    peak, peak_form = int8_peak(args.w4a8_bench, args.threads)
    lm.log(f"DRAM read {bw_before:.1f} GB/s, {peak_form} int8 peak {peak * 1e-12:.2f} TOPS ({args.threads} threads)")

    rng = np.random.RandomState(0)
    results = []
    for name, preset, kind, extra in cells:
        ckpt, path = files[(preset, kind)]
        facts = lm.header_facts(gguf, path)
        repack = facts["arch"] not in NO_REPACK_ARCHS
        sha = lm.sha256(path)
        lm.log(f"== {name}: {path} sha256 {sha}, active {facts['active_bytes_per_token'] / 1e9:.3f} GB/token")
        cell = {"cell": name, "file": path, "sha256": sha, "header": facts, "llama_cpp_repack": repack, "rows": []}
        # Gate.
        prompt = [int(t) for t in rng.randint(0, facts["vocab"], GATE_PROMPT)]
        gen, ours = kestrel_gate(args.kestrel, path, prompt, GATE_GEN, os.path.join(args.work_dir, "gate.f32"))
        ref = llama_gate(llama_cpp, path, args.threads, prompt, gen, repack)
        cell["gate"] = gate_stats(ours, ref, gen)
        lm.log(f"   gate: {cell['gate']}")
        if not cell["gate"]["pass"]:
            lm.log("   gate FAILED: not timing this cell")
            results.append(cell)
            continue
        # Timing.
        warm_page_cache(path)
        lc = llama_bench(llama_cpp, path, args.threads, pps, args.tg, args.reps, repack)
        warm_page_cache(path)
        ks = kestrel_bench_all(args.kestrel, path, args.threads, pps, args.tg, args.reps)
        cell["rows"].append({"engine": "llama.cpp" if repack else "llama.cpp (no repack)", **lc})
        cell["rows"].append({"engine": "kestrel", **ks})
        if ik_peer and facts["arch"] in IK_ARCHS:
            warm_page_cache(path)
            ik = ik_bench(ik_peer, path, args.threads, pps, args.tg, args.reps, args.ik_args.split())
            cell["rows"].append({"engine": "ik_llama.cpp", **ik})
        if "int8" in extra and not args.no_int8:
            # Same expert bits and BF16 rest, as compressed-tensors safetensors (the only MXFP4 the int8 mode
            # covers). Gate: against llama.cpp on the MXFP4 GGUF, like the other rows.
            env = {"KESTREL_MXFP4_INT8": "1", "KESTREL_BF16_ACTS": "1"}  # = --kernels fast
            gen8, ours8 = kestrel_gate(args.kestrel, ckpt, prompt, GATE_GEN, os.path.join(args.work_dir, "gate.f32"), env)
            ref8 = ref if gen8 == gen else llama_gate(llama_cpp, path, args.threads, prompt, gen8, repack)
            g8 = gate_stats(ours8, ref8, gen8)
            lm.log(f"   int8 gate: {g8}")
            row = {"engine": "kestrel --kernels fast (safetensors)", "gate": g8}
            if g8["pass"]:
                warm_page_cache(ckpt)
                row.update(kestrel_bench_all(args.kestrel, ckpt, args.threads, pps, args.tg, args.reps, env))
            cell["rows"].append(row)
        results.append(cell)

    # 3. Report. The roofline is the better of membw_bench before and after the cells: a job sharing the
    # machine during one of them depresses it (it must not be below what the engines themselves stream).
    bw_after = membw(args.membw, args.threads)
    bw_measured = max(bw_before, bw_after)
    bw = args.dram_gb_s or bw_measured
    out = {"machine": {"cpu": platform.processor() or "", "threads": args.threads,
                       "dram_read_gb_s_measured": [bw_before, bw_after], "roofline_gb_s": bw,
                       "vnni_peak_ops": peak, "int8_peak_form": peak_form},
           "protocol": {"pp": pps, "tg": args.tg, "reps": args.reps, "gate_prompt": GATE_PROMPT,
                        "gate_gen": GATE_GEN, "gate_median_nmse": GATE_MEDIAN_NMSE, "gate_min_top1": GATE_MIN_TOP1,
                        "gate_clean_nmse": GATE_CLEAN_NMSE, "gate_min_clean_frac": GATE_MIN_CLEAN_FRAC,
                        "ik_args": args.ik_args if ik_peer else None},
           "kestrel_git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "llama_cpp_python": llama_cpp.__version__,
           "peers": {p["name"]: {k: p[k] for k in ("package", "version", "sdist_sha256")}
                     for p in (llama_peer, ik_peer) if p},
           "cells": results, "wall_s": time.time() - t_start}
    pp_cols = " | ".join(f"pp{n} t/s" for n in pps)
    ratio_cols = " | ".join(f"pp{n} ratio" for n in pps)
    md = [f"DRAM read roofline {bw:.1f} GB/s (membw_bench in this run, before / after: {bw_before:.1f} / "
          f"{bw_after:.1f}), {peak_form} int8 peak {peak * 1e-12:.2f} TOPS ({args.threads} threads, "
          f"measured in this run); tg{args.tg}, -r {args.reps}, mean ± sd t/s; ratios against the cell's "
          f"llama.cpp row; % int8 peak at pp{pps[0]}.", "",
          f"| model / file | engine | {pp_cols} | tg t/s | {ratio_cols} | tg ratio | active GB/token | tg GB/s | "
          f"% roofline | pp{pps[0]} GOP/s | % int8 peak | cores used pp / tg | gate (median NMSE / top-1) |",
          "|---|---|" + "---|" * (2 * len(pps) + 9)]
    for c in results:
        f = c["header"]
        ab, ap_ = f["active_bytes_per_token"], f["active_params_per_token"]
        base = c["rows"][0] if c["rows"] else None
        if not c["rows"]:
            # the columns after "gate failed": the other pp, tg and ratio cells, active bytes, 5 more, the gate
            md.append(f"| {c['cell']} | — | gate failed |" + " |" * (2 * len(pps) + 1) + f" {ab / 1e9:.3f} |" + " |" * 5 +
                      f" {c['gate']['median_nmse']:.2e} / {c['gate']['top1']:.2f} |")
            continue
        for r in c["rows"]:
            g = r.get("gate", c["gate"])
            if "pp" not in r:
                md.append(f"| {c['cell']} | {r['engine']} | gate failed |" + " |" * (2 * len(pps) + 7) +
                          f" {g['median_nmse']:.2e} / {g['top1']:.2f} |")
                continue
            pp0, tg = r["pp"][str(pps[0])]["tok_s_mean"], r["tg"]["tok_s_mean"]
            rps = {str(n): r["pp"][str(n)]["tok_s_mean"] / base["pp"][str(n)]["tok_s_mean"] for n in pps}
            rt = tg / base["tg"]["tok_s_mean"]
            r["derived"] = {"pp_ratio": rps, "tg_ratio": rt, "tg_gb_s": tg * ab / 1e9,
                            "roofline_frac": tg * ab / 1e9 / bw, "pp_gop_s": pp0 * 2 * ap_ / 1e9,
                            "vnni_frac": pp0 * 2 * ap_ / peak}
            d = r["derived"]
            gate_txt = ("(reference)" if r is base else "(not gated)" if r["engine"] == "ik_llama.cpp"
                        else f"{g['median_nmse']:.2e} / {g['top1']:.2f}")
            cores = (f"{np.mean(r['pp'][str(pps[0])]['cores_used']):.2f} / {np.mean(r['tg']['cores_used']):.2f}"
                     if "cores_used" in r["tg"] else "—")
            md.append(f"| {c['cell']} | {r['engine']} | " + " | ".join(fmt(r["pp"][str(n)]) for n in pps) +
                      f" | {fmt(r['tg'])} | " + " | ".join(f"{rps[str(n)]:.2f}×" for n in pps) + f" | {rt:.2f}× | "
                      f"{ab / 1e9:.3f} | {d['tg_gb_s']:.1f} | {100 * d['roofline_frac']:.0f} % | {d['pp_gop_s']:.0f} | "
                      f"{100 * d['vnni_frac']:.1f} % | {cores} | {gate_txt} |")
    md += ["", "Files (sha256):", ""] + [f"* `{os.path.basename(c['file'])}` {c['sha256']} "
                                         f"({c['header']['file_bytes'] / 1e9:.2f} GB; tensor bytes by type: "
                                         + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in sorted(c["header"]["bytes_by_type"].items()))
                                         + ")" for c in results]
    md.append(f"\nWall time of the run: {out['wall_s']:.0f} s.")
    with open(args.out_json, "w") as fh:
        json.dump(out, fh, indent=1)
    with open(args.out_md, "w") as fh:
        fh.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if all(c["gate"]["pass"] for c in results) else 1


if __name__ == "__main__":
    sys.exit(main())
