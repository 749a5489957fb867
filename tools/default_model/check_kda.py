"""Checks the training model's KDA kernels against fla-core's naive reference kernels (fp64, CPU).

    python tools/default_model/check_kda.py

k3torch.chunk_kda (vectorised, used for training) and k3torch.recurrent_kda must both equal fla's
naive_recurrent_kda and naive_chunk_kda on random inputs with K3's bounded gate, including a length that is not
a multiple of the chunk size. Prints the max differences; exits non-zero above 1e-5 against fla (which computes
in fp32) or above 1e-10 between the fp64 chunked and recurrent forms here.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import k3torch  # noqa: E402
from gen_kda_goldens import load_naive  # noqa: E402  (fla's naive.py loaded by path, no triton import)


def main():
    naive_recurrent, naive_chunk = load_naive()
    torch.manual_seed(0)
    worst = 0.0
    for B, T, H, K in [(2, 128, 3, 16), (1, 77, 2, 32)]:
        q = k3torch.l2norm(torch.randn(B, T, H, K, dtype=torch.float64))
        k = k3torch.l2norm(torch.randn(B, T, H, K, dtype=torch.float64))
        v = torch.randn(B, T, H, K, dtype=torch.float64)
        g = -5.0 * torch.sigmoid(torch.randn(B, T, H, K, dtype=torch.float64) * 2)
        beta = torch.sigmoid(torch.randn(B, T, H, dtype=torch.float64))
        scale = K ** -0.5
        ref, _ = naive_recurrent(q, k, v, g, beta, scale=scale)
        ref = ref.double()
        outs = {"chunk16": k3torch.chunk_kda(q, k, v, g, beta, scale, C=16),
                "chunk64": k3torch.chunk_kda(q, k, v, g, beta, scale, C=64),
                "recurrent": k3torch.recurrent_kda(q, k, v, g, beta, scale)}
        if T % 64 == 0:
            outs["fla_naive_chunk"] = naive_chunk(q, k, v, g, beta, scale=scale)[0].double()
        for name, o in outs.items():
            d = (o - ref).abs().max().item()
            worst = max(worst, d)
            print(f"B={B} T={T} H={H} K={K} {name:16s} vs fla naive_recurrent_kda: max |diff| {d:.2e}")
        d64 = (outs["chunk16"] - outs["recurrent"]).abs().max().item()
        print(f"B={B} T={T} H={H} K={K} chunk16 vs recurrent (both fp64): max |diff| {d64:.2e}")
        if d64 > 1e-10:
            sys.exit(f"FAIL: chunked vs recurrent {d64:.2e} > 1e-10")
    # gradients stay finite through the masked exponentials
    q = torch.randn(1, 40, 2, 8, requires_grad=True)
    o = k3torch.chunk_kda(k3torch.l2norm(q), k3torch.l2norm(q), q, -5 * torch.sigmoid(q), torch.sigmoid(q[..., 0]), 0.3)
    o.sum().backward()
    assert torch.isfinite(q.grad).all(), "non-finite gradient"
    print("gradients finite")
    if worst > 1e-5:
        sys.exit(f"FAIL: max diff {worst:.2e} > 1e-5")
    print("PASS")


if __name__ == "__main__":
    main()
