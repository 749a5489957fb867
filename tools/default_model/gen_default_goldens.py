"""Golden file for the shipped default model (tests/models/default_model_test.cpp).

    python tools/default_model/gen_default_goldens.py --model models/default --weights RUN_DIR \\
        --data data.npz --out tests/data/models/default_model.safetensors

The reference is the training model itself (k3torch.K3Model) in fp32 on the CPU, with fla-core's
naive_recurrent_kda as the KDA kernel, loaded from the exported checkpoint:
  logits_exact  routed experts decoded from the checkpoint's MXFP4 (the values Kestrel multiplies with)
  logits_bf16   routed experts as trained (bf16, before MXFP4 quantisation; needs --weights)
  greedy        16 greedy tokens of the exact model after the prompt
  heldout       2048 held-out text tokens (8 windows of 256) for the perplexity test; heldout_nll_exact is the
                reference's mean NLL on them (metadata)
  unigram_logprob  log p(token) of the add-one unigram model of the training text, same tokenizer
Everything else of the checkpoint (bf16 matrices, fp32 vectors) is read from the checkpoint, so the comparison
also checks the export.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import k3torch  # noqa: E402
import export  # noqa: E402
import prepare  # noqa: E402
import bpe  # noqa: E402
from train import load_weights  # noqa: E402
from gen_kda_goldens import load_naive  # noqa: E402
from golden_command import recorded_command  # noqa: E402


class _Key(str):
    def __getitem__(self, e):
        return (str(self), e)


def config_from_json(path):
    t = json.load(open(path))["text_config"]
    la = t["linear_attn_config"]
    return k3torch.Config(vocab=t["vocab_size"], hidden=t["hidden_size"], layers=t["num_hidden_layers"],
                          full_attn_layers=tuple(la["full_attn_layers"]), attn_res_block=t["attn_res_block_size"],
                          kda_heads=la["num_heads"], head_dim=la["head_dim"], mla_heads=t["num_attention_heads"],
                          q_lora=t["q_lora_rank"], kv_lora=t["kv_lora_rank"], nope=t["qk_nope_head_dim"],
                          rope=t["qk_rope_head_dim"], v_dim=t["v_head_dim"], intermediate=t["intermediate_size"],
                          experts=t["num_experts"], top_k=t["num_experts_per_token"], shared=t["num_shared_experts"],
                          moe_inter=t["moe_intermediate_size"], latent=t["routed_expert_hidden_size"],
                          gate_lower_bound=la["gate_lower_bound"])


def model_from_checkpoint(d, expert_override=None):
    cfg = config_from_json(os.path.join(d, "config.json"))
    raw = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), "pt") as st:
                for k in st.keys():
                    raw[k] = st.get_tensor(k)
    m = k3torch.K3Model(cfg)
    keys = {k: _Key(k) for k in m.state_dict()}
    sd = {}
    experts = {}
    for rel, key in export.released_tensors(cfg, keys):
        if isinstance(key, tuple):  # ("mxfp4", (torch name, e))
            tname, e = key[1]
            w = export.mxfp4_dequantize(raw[rel + ".weight_packed"], raw[rel + ".weight_scale"])
            experts.setdefault(tname, {})[e] = w
        else:
            sd[str(key)] = raw[rel].float()
    for tname, ws in experts.items():
        sd[tname] = torch.stack([ws[e] for e in range(cfg.experts)])
    if expert_override is not None:
        for tname in experts:
            sd[tname] = expert_override[tname].float()
    missing = set(m.state_dict()) - set(sd)
    assert not missing, missing
    m.load_state_dict(sd)
    return cfg, m.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--weights", required=True, help="train.py output (the bf16 experts before quantisation)")
    ap.add_argument("--data", required=True, help="prepare.py output (held-out tokens, training text for the unigram)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(2)
    torch.backends.cuda.matmul.allow_tf32 = False
    naive_recurrent, _ = load_naive()
    kernel = lambda q, k, v, g, beta, scale: naive_recurrent(q, k, v, g, beta, scale=scale)[0]

    cfg, exact = model_from_checkpoint(a.model)
    _, trained_sd = load_weights(a.weights)
    _, pre = model_from_checkpoint(a.model, {k: v for k, v in trained_sd.items() if k.endswith((".w1", ".w2", ".w3"))})

    enc = bpe.load_encoding(a.model)
    d = np.load(a.data)
    text = d["text_heldout"]
    chat = prepare.encode_segments(enc, prepare.render_segments([("user", None, 'What does "river" mean?')],
                                                                generation_prompt=True))
    prompt = [int(t) for t in text[:64]] + chat
    x = torch.tensor([prompt])
    with torch.no_grad():
        logits_exact = exact(x, kernel)[0]
        logits_bf16 = pre(x, kernel)[0]
        greedy, cur = [], list(prompt)
        for _ in range(16):
            nxt = int(exact(torch.tensor([cur]), kernel)[0, -1].argmax())
            greedy.append(nxt)
            cur.append(nxt)
        held = torch.from_numpy(text[64:64 + 8 * 256].astype(np.int64)).reshape(8, 256)
        nll = 0.0
        for w in held:
            lg = exact(w[None], "chunk")[0, :-1]
            nll += torch.nn.functional.cross_entropy(lg, w[1:], reduction="sum").item()
        nll /= 8 * 255
    counts = np.bincount(d["text_train"], minlength=cfg.vocab).astype(np.float64) + 1.0
    unigram = np.log(counts / counts.sum()).astype(np.float32)
    tg = held[:, 1:].numpy()
    uni_nll = float(-unigram[tg].mean())
    diff = (logits_exact - logits_bf16)
    nmse = (diff.pow(2).sum(-1) / logits_exact.pow(2).sum(-1)).max().item()
    top1 = (logits_exact.argmax(-1) == logits_bf16.argmax(-1)).float().mean().item()
    meta = {"reference": "tools/default_model k3torch.K3Model fp32 CPU, KDA = fla-core naive_recurrent_kda",
            "command": recorded_command("default_model/gen_default_goldens.py"), "prompt_text": enc.decode(prompt), "greedy_text": enc.decode(greedy),
            "heldout_nll_exact": f"{nll:.6f}", "heldout_ppl_exact": f"{math.exp(nll):.3f}",
            "unigram_ppl": f"{math.exp(uni_nll):.3f}",
            "bf16_vs_mxfp4_max_nmse": f"{nmse:.4g}", "bf16_vs_mxfp4_top1": f"{top1:.4f}"}
    save_file({"prompt": torch.tensor(prompt, dtype=torch.int32), "logits_exact": logits_exact.float().contiguous(),
               "logits_bf16": logits_bf16.float().contiguous(), "greedy": torch.tensor(greedy, dtype=torch.int32),
               "heldout": held.to(torch.int32).contiguous(), "unigram_logprob": torch.from_numpy(unigram)},
              a.out, {k: str(v) for k, v in meta.items()})
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
