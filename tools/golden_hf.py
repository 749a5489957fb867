"""What the transformers-based golden scripts share: the reference logits of a fixed random prompt and a greedy
continuation through the KV cache, checked against the model's own one-shot forwards.

prompt_and_greedy(model, torch): a PROMPT_LEN-token prompt (numpy RandomState(0).randint(0, vocab, PROMPT_LEN)),
the logits of every position in one forward (checked against a forward of its first GREEDY_PROMPT_LEN tokens
alone), and a GREEDY_NEW-token greedy continuation of those first tokens through the cache (checked against a
teacher-forced forward of the same tokens: same argmax, logits within 1e-3).
"""
import numpy as np

PROMPT_LEN = 200
GREEDY_PROMPT_LEN = 65
GREEDY_NEW = 32


def prompt_and_greedy(model, torch):
    """Returns (prompt int64 [PROMPT_LEN], logits float32 tensor [PROMPT_LEN, vocab], greedy list, metadata dict)."""
    vocab = model.config.vocab_size
    prompt = np.random.RandomState(0).randint(0, vocab, size=PROMPT_LEN).astype(np.int64)
    with torch.no_grad():
        ids = torch.from_numpy(prompt)[None]
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
        pre = model(input_ids=ids[:, :GREEDY_PROMPT_LEN], use_cache=False).logits[0].float()
        d_prefix = (pre - logits[:GREEDY_PROMPT_LEN]).abs().max().item()
        print(f"self-consistency: prefix[{GREEDY_PROMPT_LEN}] alone vs the {PROMPT_LEN} run: max|diff|={d_prefix:.3e}")
        assert d_prefix < 1e-3
        out = model(input_ids=ids[:, :GREEDY_PROMPT_LEN], use_cache=True)
        cache = out.cache
        step_logits = [out.logits[0, -1].float()]
        greedy = []
        for t in range(GREEDY_NEW):
            nxt = int(torch.argmax(step_logits[-1]))
            greedy.append(nxt)
            if t + 1 == GREEDY_NEW:
                break
            out = model(input_ids=torch.tensor([[nxt]]), cache=cache, use_cache=True)
            cache = out.cache
            step_logits.append(out.logits[0, -1].float())
        step_logits = torch.stack(step_logits)
        tf_ids = torch.cat([ids[:, :GREEDY_PROMPT_LEN], torch.tensor([greedy[:-1]])], dim=1)
        tf = model(input_ids=tf_ids, use_cache=False).logits[0, GREEDY_PROMPT_LEN - 1:].float()
        d_cache = (tf - step_logits).abs().max().item()
        assert torch.equal(tf.argmax(-1), torch.tensor(greedy)), "cached greedy != teacher-forced argmax"
        top2 = torch.topk(step_logits, 2, dim=-1).values
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        print(f"self-consistency: cached decode vs teacher-forced: max|diff|={d_cache:.3e}; min greedy margin={margin:.4f}")
        assert d_cache < 1e-3
        print(f"greedy continuation: {greedy}")
    meta = {"prefix_vs_full_max_abs_diff": f"{d_prefix:.6e}", "cached_vs_teacher_forced_max_abs_diff": f"{d_cache:.6e}",
            "greedy_min_top2_margin": f"{margin:.6f}"}
    return prompt, logits, greedy, meta


def golden_tensors(prompt, logits, greedy):
    """The tensors tests/models/golden_test.cpp reads."""
    return {"prompt": prompt.astype(np.int32), "logits": np.ascontiguousarray(logits.numpy().astype(np.float32)),
            "greedy_prompt_len": np.array([GREEDY_PROMPT_LEN], dtype=np.int32),
            "greedy": np.array(greedy, dtype=np.int32)}
