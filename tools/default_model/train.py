"""Trains the default model (k3torch.K3Model) on the arrays from prepare.py for a fixed wall-clock budget.

    python train.py --data data.npz --out DIR --minutes 60 [--device cuda] [--threads 2]

Batches are random windows of seq+1 tokens: with probability --text-frac from the text stream, otherwise from
the dictionary-chat stream. AdamW, linear warm-up then cosine decay over the time budget (so the learning
rate reaches its floor when the budget ends, whatever the speed). Experts are balanced without an auxiliary
loss, as K3's noaux_tc router is: after each step each layer's e_score_correction_bias moves by --bias-rate
towards the mean load. Every --eval-minutes the held-out text and chat losses are measured; the weights with
the best held-out loss (mean of text and chat) are written to DIR/weights-*.safetensors (bf16 for matrices, which is what the
exported checkpoint stores, fp32 for the small vectors) with the config and the log, so a stopped run leaves
a usable model.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3torch  # noqa: E402

SMALL = 1 << 16  # tensors with at most this many elements stay fp32 in the weight files


def save_weights(model, cfg, out, meta, shard_bytes=15 << 20):
    sd = {k: (v.detach().float() if v.numel() <= SMALL else v.detach().to(torch.bfloat16)).cpu().contiguous()
          for k, v in model.state_dict().items()}
    for f in os.listdir(out):
        if f.startswith("weights-") and f.endswith(".safetensors"):
            os.remove(os.path.join(out, f))
    shard, size, n = {}, 0, 0
    for k in sorted(sd):
        b = sd[k].numel() * sd[k].element_size()
        if shard and size + b > shard_bytes:
            save_file(shard, os.path.join(out, f"weights-{n}.safetensors"), {"config": cfg.to_json()})
            shard, size, n = {}, 0, n + 1
        shard[k] = sd[k]
        size += b
    save_file(shard, os.path.join(out, f"weights-{n}.safetensors"), {"config": cfg.to_json()})
    with open(os.path.join(out, "train_meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


def load_weights(d):
    """(Config, state dict in fp32) from the weights-*.safetensors written by save_weights."""
    from safetensors import safe_open
    sd, cfg = {}, None
    for f in sorted(os.listdir(d)):
        if f.startswith("weights-") and f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), "pt") as st:
                cfg = k3torch.Config.from_json(st.metadata()["config"])
                for k in st.keys():
                    sd[k] = st.get_tensor(k).float()
    return cfg, sd


def windows(stream, starts, L):
    return np.stack([stream[s:s + L] for s in starts]) if len(starts) else np.empty((0, L), stream.dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--text-frac", type=float, default=0.4)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--eval-minutes", type=float, default=5)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--config", default="{}", help="JSON overrides of k3torch.Config fields")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: time budget only)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    os.makedirs(a.out, exist_ok=True)
    cfg = k3torch.Config(**json.loads(a.config))
    d = np.load(a.data)
    text, chat = d["text_train"], d["chat_train"]
    L = a.seq + 1
    held = {}
    for name in ("text_heldout", "chat_heldout"):
        s = d[name]
        n = min(a.eval_windows, (len(s) - 1) // L)
        held[name] = torch.from_numpy(windows(s, np.arange(n) * L, L).astype(np.int64)).to(dev)

    model = k3torch.K3Model(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n and "res_proj" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n and "res_proj" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    moes = [L_.mlp for L_ in model.layers if isinstance(L_.mlp, k3torch.LatentMoE)]
    log = open(os.path.join(a.out, "train_log.txt"), "a")

    def say(msg):
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    say(f"config {cfg.to_json()}")
    say(f"torch {torch.__version__}" + (f", {torch.cuda.get_device_name()}" if dev.type == "cuda" else ""))
    say(f"params {n_params / 1e6:.2f} M, device {dev}, threads {a.threads}, batch {a.batch} x {a.seq}, "
        f"text {len(text)} / chat {len(chat)} tokens")

    @torch.no_grad()
    def evaluate():
        model.eval()
        res = {}
        for name, w in held.items():
            tot, cnt = 0.0, 0
            for i in range(0, len(w), a.batch):
                x = w[i:i + a.batch]
                logits = model(x[:, :-1])
                tot += F.cross_entropy(logits.reshape(-1, cfg.vocab), x[:, 1:].reshape(-1), reduction="sum").item()
                cnt += x[:, 1:].numel()
            res[name] = tot / cnt
        model.train()
        return res

    budget = a.minutes * 60
    t0 = time.time()
    last_eval = t0
    step, tokens, best = 0, 0, float("inf")
    ema = None
    history = []
    while True:
        el = time.time() - t0
        done = el >= budget or (a.max_steps and step >= a.max_steps)
        if done or time.time() - last_eval >= a.eval_minutes * 60:
            r = evaluate()
            last_eval = time.time()
            history.append({"step": step, "tokens": tokens, "minutes": el / 60, **r})
            say(f"eval step {step} tokens {tokens} min {el / 60:.1f}: held-out text loss {r['text_heldout']:.4f} "
                f"(ppl {math.exp(r['text_heldout']):.2f}), chat loss {r['chat_heldout']:.4f}")
            score = 0.5 * (r["text_heldout"] + r["chat_heldout"])
            if score < best:
                best = score
                save_weights(model, cfg, a.out, {"step": step, "tokens": tokens, "minutes": el / 60,
                                                 "params": n_params, "args": vars(a), "eval": r,
                                                 "history": history})
                say(f"saved weights (best mean held-out loss {best:.4f})")
            if done:
                break
        frac = min(1.0, el / budget)
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        n_text = int(rng.binomial(a.batch, a.text_frac))
        xs = np.concatenate([windows(text, rng.integers(0, len(text) - L, n_text), L),
                             windows(chat, rng.integers(0, len(chat) - L, a.batch - n_text), L)])
        x = torch.from_numpy(xs.astype(np.int64)).to(dev)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for m in moes:
                m.e_score_correction_bias += a.bias_rate * torch.sign(m.last_load.mean() - m.last_load)
        step += 1
        tokens += x[:, 1:].numel()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 50 == 0 or step <= 3:
            loads = torch.stack([m.last_load for m in moes])
            say(f"step {step} loss {loss.item():.4f} ema {ema:.4f} lr {lr:.2e} tok/s {tokens / (time.time() - t0):.0f} "
                f"max expert load {loads.max().item():.3f}")
    say(f"done: {step} steps, {tokens} tokens, {(time.time() - t0) / 60:.1f} min, best mean held-out loss {best:.4f}")


if __name__ == "__main__":
    main()
