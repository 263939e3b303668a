"""transformers as the oracle: a checkpoint loaded by transformers, and its greedy tokens."""

from __future__ import annotations

import torch


def hf_oracle(path, gguf_file=None):
    from transformers import AutoModelForCausalLM

    kw = {"gguf_file": gguf_file} if gguf_file else {}
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, **kw).eval()


def hf_greedy(hf, ids, n):
    # No EOS for the oracle either: both sides generate exactly n greedy tokens.
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=n,
            do_sample=False,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()
