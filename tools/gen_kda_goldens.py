#!/usr/bin/env python3
"""Generate KDA kernel goldens from the independent reference fla-core (pure-PyTorch naive kernels).

Run with the project venv:  python tools/gen_kda_goldens.py [--out tests/data/kda]

Reference code (fla-core, version recorded in each file's metadata):
  * fla/ops/kda/naive.py : naive_recurrent_kda, naive_chunk_kda   -- loaded by file path with importlib,
    so fla/__init__.py (which imports triton and the GPU kernels) never runs.
  * fla/ops/kda/gate.py  : naive_kda_gate, naive_kda_lowerbound_gate -- that module imports triton at
    top level, so the two pure-torch functions are extracted from its source with `ast` and executed
    in a namespace holding only torch / F (the upstream text is used verbatim, not re-derived).
  * l2norm as fla: x / sqrt(sum x^2 + 1e-6) (fla/modules/l2norm.py, eps inside the sqrt).

Layout of each golden (safetensors, all fp32, B = 1 squeezed away, matching src/kernels/cpu/kda.h):
  q, k [T,H,K] (already l2-normalised, NOT scaled), v [T,H,V], g [T,H,K], beta [T,H],
  state0 [H,K,V] (initial state, key-major), out [T,H,V] (naive_recurrent_kda), state_final [H,K,V],
  lowerbound only: out_chunk = naive_chunk_kda output on the first 128 tokens (all cases check that
  naive_chunk_kda agrees with naive_recurrent_kda on their first 64*floor(T/64) tokens; the max
  differences are stored in the metadata).
  metadata: scale, gate form, fla version, agreement of naive_chunk vs naive_recurrent.
Because the recurrence is causal, out[:L] is also the reference for every prefix length L; the tests
run prefixes 1, 2, 63, 64, 65, 127, 128, 129, ... of one sequence (chunk edges) instead of storing
separate cases, which keeps all goldens around 3 MB.
"""
import argparse
import ast
import importlib.util
import math
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file


def fla_dir() -> str:
    spec = importlib.util.find_spec("fla")  # does not execute fla/__init__.py
    assert spec is not None and spec.submodule_search_locations, "fla-core not installed"
    return list(spec.submodule_search_locations)[0]


def load_naive():
    path = os.path.join(fla_dir(), "ops", "kda", "naive.py")
    spec = importlib.util.spec_from_file_location("fla_kda_naive", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.naive_recurrent_kda, mod.naive_chunk_kda


def load_gates():
    path = os.path.join(fla_dir(), "ops", "kda", "gate.py")
    src = open(path).read()
    tree = ast.parse(src)
    wanted = {"naive_kda_gate", "naive_kda_lowerbound_gate"}
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {f.name for f in fns} == wanted, f"gate functions not found in {path}"
    for f in fns:
        f.decorator_list = []
    ns = {"torch": torch, "F": F}
    exec(compile(ast.Module(body=fns, type_ignores=[]), path, "exec"), ns)
    return ns["naive_kda_gate"], ns["naive_kda_lowerbound_gate"]


def fla_version() -> str:
    try:
        from importlib.metadata import version
        return version("fla-core")
    except Exception:  # noqa: BLE001
        return "unknown"


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # fla/modules/l2norm.py: x * rsqrt(sum(x^2) + eps)
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def fla_dt_bias(H: int, K: int, gen: torch.Generator) -> torch.Tensor:
    # fla/layers/kda.py init: dt = exp(U*(ln 0.1 - ln 1e-3) + ln 1e-3), clamp >= 1e-4,
    # dt_bias = dt + log(-expm1(-dt))  (inverse softplus)
    u = torch.rand(H * K, generator=gen, dtype=torch.float64)
    dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
    return (dt + torch.log(-torch.expm1(-dt))).float()


def make_case(name, T, H, K, V, gate, seed, a_log_range, f_mean, f_std, use_dt_bias, out_dir, fns):
    naive_recurrent_kda, naive_chunk_kda, naive_kda_gate, naive_kda_lowerbound_gate = fns
    gen = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(1, T, H, K, generator=gen))
    k = l2norm(torch.randn(1, T, H, K, generator=gen))
    v = torch.randn(1, T, H, V, generator=gen)
    beta = torch.sigmoid(torch.randn(1, T, H, generator=gen))
    lo, hi = a_log_range
    A_log = torch.log(torch.empty(H).uniform_(lo, hi, generator=gen))
    dt_bias = fla_dt_bias(H, K, gen) if use_dt_bias else torch.zeros(H * K)
    # per-channel offsets so that some channels barely decay while others decay hard
    f = f_mean + f_std * torch.randn(1, T, H, K, generator=gen) + 2.0 * torch.randn(1, 1, H, K, generator=gen)
    if gate == "softplus":
        g = naive_kda_gate(f, A_log, dt_bias)
    else:
        g = naive_kda_lowerbound_gate(f, A_log, dt_bias, lower_bound=-5.0)
    assert (g <= 0).all()
    # asymmetric random initial state [1,H,K,V] (key-major)
    state0 = 0.5 * torch.randn(1, H, K, V, generator=gen)
    scale = K ** -0.5

    out, sfin = naive_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=state0.clone(),
                                    output_final_state=True)
    tensors = {
        "q": q[0], "k": k[0], "v": v[0], "g": g[0], "beta": beta[0], "state0": state0[0],
        "out": out[0], "state_final": sfin[0],
    }
    meta = {"scale": repr(scale), "gate": gate, "fla_core": fla_version(), "T": str(T), "H": str(H),
            "K": str(K), "V": str(V), "reference": "fla naive_recurrent_kda (fp32)",
            "g_min": repr(g.min().item()), "g_mean": repr(g.mean().item())}
    T64 = (T // 64) * 64
    if T64 > 0:
        oc, sc = naive_chunk_kda(q[:, :T64], k[:, :T64], v[:, :T64], g[:, :T64], beta[:, :T64], scale=scale,
                                 initial_state=state0.clone(), output_final_state=True, chunk_size=64)
        # state after T64 tokens from the recurrent reference, for the comparison
        _, s64 = naive_recurrent_kda(q[:, :T64], k[:, :T64], v[:, :T64], g[:, :T64], beta[:, :T64],
                                     scale=scale, initial_state=state0.clone(), output_final_state=True)
        finite = bool(torch.isfinite(oc).all() and torch.isfinite(sc).all())
        do = (oc - out[:, :T64]).abs().max().item() if finite else float("nan")
        ds = (sc - s64).abs().max().item() if finite else float("nan")
        meta.update({"chunk_T": str(T64), "chunk_vs_recurrent_out_maxabs": repr(do),
                     "chunk_vs_recurrent_state_maxabs": repr(ds)})
        print(f"  {name}: naive_chunk_kda vs naive_recurrent_kda on {T64} tokens: out {do:.3e} state {ds:.3e}"
              f" (finite={finite})")
        if name != "extreme":  # fla's naive chunk forms exp(+|Γ|) before masking; only a cross-check here
            assert finite and do < 1e-4 and ds < 1e-4, "fla naive chunk and recurrent disagree"
        if name == "lowerbound":  # store one chunk reference output (keeps the total size small)
            tensors["out_chunk"] = oc[0]
    tensors = {kk: vv.contiguous().float() for kk, vv in tensors.items()}
    path = os.path.join(out_dir, f"{name}.safetensors")
    save_file(tensors, path, metadata=meta)
    os.chmod(path, 0o644)
    print(f"  wrote {path} ({os.path.getsize(path) / 1024:.0f} KiB); |out|max={out.abs().max().item():.3f}"
          f" g_min={g.min().item():.1f}")


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "kda"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(2)
    fns = (*load_naive(), *load_gates())
    K = V = 128
    # softplus (Kimi-Linear-48B) gate, fla init ranges: A_log = log U(1,16), dt_bias per fla init.
    # T = 200 covers prefixes 1, 2, 63, 64, 65, 127, 128, 129, 200.
    make_case("softplus", 200, 2, K, V, "softplus", 1, (1.0, 16.0), 0.0, 1.0, True, args.out, fns)
    # lower-bound "safe" gate (K3): g = -5 * sigmoid(exp(A_log) (f + dt_bias)); T = 129 (tail of 1).
    make_case("lowerbound", 129, 2, K, V, "lowerbound", 2, (1.0, 16.0), 0.0, 1.0, True, args.out, fns)
    # extreme softplus gate: A = exp(A_log) in [8,16], f ~ N(3, 2) + per-channel N(0, 2), no dt_bias:
    # per-token g down to ~ -150, chunk cumsums ~ -10^3..-10^4 (exp(-Γ) would overflow); some channels
    # keep g near 0. One head, T = 300 (chunk edges 64..256 plus a 44-token tail).
    make_case("extreme", 300, 1, K, V, "softplus", 3, (8.0, 16.0), 3.0, 2.0, False, args.out, fns)


if __name__ == "__main__":
    main()
