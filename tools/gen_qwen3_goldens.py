#!/usr/bin/env python3
"""Golden logits for the `qwen3moe-micro-bf16` random checkpoint from the INDEPENDENT reference transformers
`Qwen3MoeForCausalLM` (float32, CPU, eager attention).

Run with the project venv (transformers + torch CPU, tools/requirements-goldens.txt):

    python tools/gen_qwen3_goldens.py --kestrel build/release/kestrel \\
        --preset qwen3moe-micro-bf16 --out tests/data/models/qwen3moe_micro.safetensors

Steps
  1. `kestrel make-model --preset P --out TMP` writes the Qwen3-MoE release layout: config.json
     (Qwen3MoeForCausalLM, num_key_value_heads < num_attention_heads, head_dim, rope_theta 1e6, norm_topk_prob
     true) and bf16 safetensors with per-expert gate/up/down projections and the per-head q_norm / k_norm.
  2. transformers loads the directory with `from_pretrained` (its own checkpoint conversion, strict: every tensor
     must be consumed and none missing), float32, eager attention.
  3. Logits of every position of a fixed 200-token prompt (numpy RandomState(0).randint(0, vocab, 200)) in one
     forward; a 32-token greedy continuation of its first 65 tokens through the KV cache, checked against a
     teacher-forced forward of the same tokens.
Writes prompt I32 [200], logits F32 [200, vocab], greedy_prompt_len I32 [1], greedy I32 [32]; metadata: the
reference, the command, the self-consistency numbers.
"""
import argparse
import os
import subprocess
import sys
import tempfile


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_command import recorded_command  # noqa: E402
from golden_hf import golden_tensors, prompt_and_greedy  # noqa: E402

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kestrel", required=True, help="kestrel binary (writes the checkpoint)")
    ap.add_argument("--preset", default="qwen3moe-micro-bf16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    command = recorded_command("gen_qwen3_goldens.py")

    import torch
    import transformers
    from safetensors.numpy import save_file
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(0)
    meta = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "ckpt")
        subprocess.run([args.kestrel, "make-model", "--preset", args.preset, "--out", ckpt], check=True)
        model, info = Qwen3MoeForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager",
                                                          output_loading_info=True)
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            assert not info.get(k), f"{k}: {info.get(k)}"
        model.eval()
    config = model.config
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    at = model.model.layers[0].self_attn
    print(f"heads {config.num_attention_heads}, kv heads {config.num_key_value_heads}, head_dim {config.head_dim}, "
          f"scaling {at.scaling:.8f}, rope_theta {getattr(config, 'rope_theta', None) or config.rope_parameters}")
    print(f"experts {config.num_experts} top-{config.num_experts_per_tok} norm_topk_prob {config.norm_topk_prob}")
    assert config.num_key_value_heads < config.num_attention_heads and config.norm_topk_prob

    prompt, logits, greedy, consistency = prompt_and_greedy(model, torch)

    meta["reference"] = f"transformers {transformers.__version__} Qwen3MoeForCausalLM float32 eager"
    meta["preset"] = args.preset
    meta["command"] = command
    meta["torch"] = torch.__version__
    meta.update(consistency)
    tensors = golden_tensors(prompt, logits, greedy)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(tensors, args.out, metadata=meta)
    size = os.path.getsize(args.out)
    print(f"wrote {args.out} ({size} bytes)")
    assert size < 600 * 1024


if __name__ == "__main__":
    main()
