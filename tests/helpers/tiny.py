"""Tiny random-weight checkpoints the tests build themselves (no model hub).

Each is a real HF directory (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json with a ChatML template), so it goes through the same loader
as a user's checkpoint, and transformers can read it as the oracle.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CORPUS = [
    "pick up the red cup and place it on the table",
    "move the gripper to the shelf, then open the drawer",
    '{"steps": [{"id": "s1", "skill": "pick", "args": {"object": "cup"}}]}',
    "The robot arm has a workspace of 0.8 m and a payload of 3 kg.",
    "0123456789 + - * / = ( ) [ ] { } : ; , . ! ?",
] * 20

ARCH_CONFIGS = {
    "llama": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    ),
    "qwen3": dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
    ),
    # Qwen2 always has q/k/v biases (and no q/k norm); the random init sets them non-zero.
    "qwen2": dict(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
}


def make_tokenizer(path: Path, vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token=None, pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML
    fast.save_pretrained(str(path))
    return fast


def make_tiny_dir(path: Path, arch: str = "llama", seed: int = 0, std: float = 0.08) -> Path:
    """Write a random-weight checkpoint of ``arch`` into ``path`` and return it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    fast = make_tokenizer(path)
    kw = dict(ARCH_CONFIGS[arch])
    kw.pop("architectures")
    cfg = AutoConfig.for_model(
        vocab_size=len(fast),
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        **kw,
    )
    cfg.architectures = ARCH_CONFIGS[arch]["architectures"]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    # Larger than HF's init so the logits are well separated and greedy ties are rare.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, std)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def proposer_and_k(opts, model):
    """The proposer and K that ``build_speculation`` picks for these options."""
    from thor_runtime.speculative import build_speculation

    s = build_speculation(opts, model)
    return s.proposer, s.k


def random_drafter(
    target_cfg,
    *,
    num_layers: int = 1,
    block_size: int = 16,
    tap_layers: tuple[int, ...] | None = None,
    num_taps: int = 3,
    mask_token_id: int | None = None,
    window: int = 128,
    seed: int = 0,
    std: float = 0.02,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
):
    """Randomly initialised drafter shaped for ``target_cfg``. Seeded."""
    from thor_runtime.speculative.dflash_io import check_fits, default_tap_layers
    from thor_runtime.speculative.dflash_model import DFlashConfig, DFlashDrafter

    taps = (
        tuple(tap_layers)
        if tap_layers is not None
        else default_tap_layers(target_cfg.num_layers, min(num_taps, target_cfg.num_layers))
    )
    cfg = DFlashConfig(
        tap_layers=taps,
        mask_token_id=target_cfg.vocab_size - 1 if mask_token_id is None else mask_token_id,
        hidden_size=target_cfg.hidden_size,
        num_layers=num_layers,
        num_heads=target_cfg.num_heads,
        num_kv_heads=target_cfg.num_kv_heads,
        head_dim=target_cfg.head_dim,
        intermediate_size=target_cfg.intermediate_size,
        block_size=block_size,
        rms_eps=target_cfg.rms_eps,
        rope_theta=target_cfg.rope_theta,
        target_id=target_cfg.name,
        window=window,
    )
    check_fits(cfg, target_cfg, "random drafter")
    d = DFlashDrafter(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return d.to(device=device, dtype=dtype).eval()


def edited_copy(src: Path, dst: Path, edit) -> Path:
    """A copy of the checkpoint ``src`` at ``dst`` with ``edit`` applied to its tensors (a dict
    of name -> tensor). -> dst"""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    w = load_file(str(src / "model.safetensors"))
    edit(w)
    save_file(w, str(dst / "model.safetensors"))
    return dst
