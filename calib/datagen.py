"""Training data for the drafter: the target's own greedy responses to calibration prompts.

A drafter is judged by how often its tokens equal the target's greedy tokens, so the labels
are exactly those tokens (not human text). Generating them one sequence at a time wastes the
CPU on batch-1 matmuls, so this file has a small batched greedy decoder built from the
model's segments (``pre_attn`` / ``post_attn`` take leading batch dims) with its own batched
KV buffer and masked SDPA; ``TargetModel`` itself stays batch-1.

Left padding: prompts of different lengths are right-aligned, so every row's next token sits
in the same column and one decode step is one [B, 1] forward. Pad columns are masked out of
attention and get position 0; real tokens get positions 0..len-1 as in ``Runtime.generate``.

Output directory (never pickle):
  manifest.json            {"format": "thor-calib-data/1", split, seed, n, max_tokens, target,
                            constrained, prompt_set_sha256}
  shard-NNNNN.safetensors  tokens int32 [sum T_i] (prompt + response, flat), offsets int64 [N+1],
                           prompt_lens int32 [N], prompt_index int64 [N] (index in the prompt set)
Resumable: shards are written atomically (tmp + os.replace) after each batch; a restart reads
the shards' prompt_index and only generates what is missing.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from thor_runtime.errors import ThorError
from thor_runtime.fileio import write_json_atomic
from thor_runtime.kv_cache import prompt_set_hash
from thor_runtime.model import attend

from .prompts import PromptSpec, RobotRequest, calib_items, render_key

DATA_FORMAT = "thor-calib-data/1"


@dataclass(frozen=True)
class GenConfig:
    max_tokens: int = 256
    batch: int = 8
    # Robot prompts answered as the planner answers them: greedy under the plan grammar
    # (what a deployed drafter must predict), one sequence at a time.
    constrained: bool = False

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ThorError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.batch < 1:
            raise ThorError(f"--batch must be >= 1, got {self.batch}")


@torch.inference_mode()
def _greedy_one(model, prompt: list[int], max_tokens: int, eos: set) -> list[int]:
    if not prompt:
        raise ThorError("datagen: empty prompt")
    cache = model.new_cache(len(prompt) + max_tokens)
    logits = model.prefill(torch.tensor(prompt), cache).logits
    out: list[int] = []
    while True:
        out.append(int(logits[-1].argmax()))
        if out[-1] in eos or len(out) >= max_tokens:
            return out
        logits = model.forward(torch.tensor(out[-1:]), cache).logits


@torch.inference_mode()
def batched_greedy(model, prompts: list[list[int]], max_tokens: int, eos_ids=()) -> list[list[int]]:
    """Greedy continuations of several prompts at once -> one list of new ids per prompt,
    ending with the EOS id when one was produced (as ``Runtime.generate``'s token_ids)."""
    if getattr(model, "is_hybrid", False):  # recurrent state: no batched path, one sequence at a time
        return [_greedy_one(model, p, max_tokens, set(eos_ids)) for p in prompts]
    cfg, dev, dt = model.cfg, model.device, model.dtype
    B = len(prompts)
    if B == 0:
        return []
    lens = torch.tensor([len(p) for p in prompts])                                   # [B]
    if (lens == 0).any():
        raise ThorError("datagen: empty prompt")
    P = int(lens.max())
    S = P + max_tokens
    if S > cfg.max_position_embeddings:
        raise ThorError(f"datagen: {P} prompt + {max_tokens} new tokens exceed the model context "
                        f"{cfg.max_position_embeddings}")
    model.ensure_positions(S)
    pad = P - lens                                                                   # [B] left pad
    ids = torch.zeros(B, P, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, pad[b]:] = torch.tensor(p)
    col = torch.arange(S)                                                            # [S]
    valid = col[None, :] >= pad[:, None]                                             # [B, S] real key
    pos = (col[None, :] - pad[:, None]).clamp(min=0)                                 # [B, S]
    kshape = (cfg.num_layers, B, cfg.num_kv_heads, S, cfg.head_dim)
    kbuf, vbuf = torch.zeros(kshape, dtype=dt, device=dev), torch.zeros(kshape, dtype=dt, device=dev)
    rows = torch.arange(B)                       # which original prompt each live row is
    out: list[list[int]] = [[] for _ in range(B)]
    eos = set(eos_ids)

    def step(tok: torch.Tensor, c0: int) -> torch.Tensor:
        """tok [b, T] at columns c0..c0+T-1 -> last-column logits [b, V]."""
        c1 = c0 + tok.shape[1]           # kbuf/vbuf are read at call time (re-bound on compaction)
        h = model.embed(tok.to(dev))                                                 # [b, T, D]
        p = pos[rows, c0:c1].to(dev)                                                 # [b, T]
        # key j visible to query column c iff j is a real token and j <= c
        qcol = torch.arange(c0, c1)[:, None]                                         # [T, 1]
        m = valid[rows, None, :c1] & (col[None, :c1] <= qcol)[None]                  # [b, T, c1]
        # A pad query sees only itself: a fully masked row would give NaN, and NaN keys poison
        # even masked scores. Real rows never see pad columns, so this changes nothing real.
        m = m | (col[None, :c1] == qcol)[None]
        m = m[:, None].to(dev)                                                       # [b, 1, T, c1]
        for i in range(cfg.num_layers):
            q, k, v = model.pre_attn(i, h, p)            # q [b, H, T, Dh], k/v [b, Hkv, T, Dh]
            kbuf[i, :, :, c0:c1], vbuf[i, :, :, c0:c1] = k, v
            o = attend(q, kbuf[i, :, :, :c1], vbuf[i, :, :, :c1], m)                    # [b, H, T, Dh]
            h = model.post_attn(i, h, o.transpose(1, 2).reshape(*h.shape[:2], -1))
        return model.head(h[:, -1])                                                  # [b, V]

    nxt = step(ids, 0).argmax(-1)                                                    # [B]
    c = P
    for t in range(max_tokens):
        done = torch.zeros(len(rows), dtype=torch.bool)
        for j, r in enumerate(rows.tolist()):
            tok = int(nxt[j])
            out[r].append(tok)
            done[j] = tok in eos or len(out[r]) >= max_tokens
        if done.all():
            break
        if done.any():
            # Drop finished rows so later steps only pay for live ones (buffers are re-indexed).
            keep = (~done).nonzero().squeeze(1)                                      # [b']
            kbuf, vbuf = kbuf[:, keep.to(dev)], vbuf[:, keep.to(dev)]
            rows, nxt = rows[keep], nxt[keep]
        nxt = step(nxt[:, None], c).argmax(-1)                                       # [b]
        c += 1
    return out


class PlanGreedy:
    """The planner's decode path for data: greedy under the request's plan grammar (general
    instructions, which have no request, are decoded unconstrained). The planner's own
    speculation (``auto``: the hybrid proposer where a drafter fits the target, else prompt
    lookup) makes it faster and, being greedy and exact, does not change a token."""

    def __init__(self, model, tok, max_tokens: int, spec: str = "auto"):
        """spec "none": only ``constraint`` is wanted (no drafter is loaded)."""
        from agent.grammar import GrammarTokenizer
        from thor_runtime.generate import Runtime
        from thor_runtime.speculative import SpecOptions, build_speculation

        self.rt = Runtime(model, tok)
        self.gtok = GrammarTokenizer(tok)
        self.speculation = build_speculation(SpecOptions(method=spec), model)
        self.max_tokens = max_tokens

    def constraint(self, req: RobotRequest | None):
        """A fresh plan-grammar constraint for req, built exactly as the planner builds it."""
        from agent.planner import prepare_request

        if req is None:
            return None
        return prepare_request(self.gtok, req.world, req.skills, thinking=self.gtok.think_ids is not None
                               ).grammar.constraint()

    def __call__(self, ids: list[int], req: RobotRequest | None) -> list[int]:
        from thor_runtime.sampling import SamplingParams

        return self.rt.generate(ids, SamplingParams(max_tokens=self.max_tokens), self.speculation,
                                constraint=self.constraint(req)).token_ids


# ---- dataset on disk ----------------------------------------------------------------------------
def _manifest(out: Path) -> dict | None:
    f = out / "manifest.json"
    if not f.exists():
        return None
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ThorError(f"{f}: not valid JSON ({e})") from None


def read_shards(data_dir: str | Path) -> list[dict]:
    """-> [{"ids": list[int] (prompt + response), "prompt_len": int, "index": int}] sorted by index."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = Path(data_dir)
    man = _manifest(d)
    if man is None or man.get("format") != DATA_FORMAT:
        raise ThorError(f"{d}: not a calibration data directory (missing manifest.json with format "
                        f"{DATA_FORMAT}); make one with `thor calib gen-data`")
    seqs = []
    for f in sorted(d.glob("shard-*.safetensors")):
        try:
            t = load_file(str(f))
        except (SafetensorError, OSError, ValueError) as e:
            raise ThorError(f"{f}: cannot read shard (truncated?): {e}") from None
        need = {"tokens", "offsets", "prompt_lens", "prompt_index"}
        if set(t) != need:
            raise ThorError(f"{f}: expected tensors {sorted(need)}, found {sorted(t)}")
        toks, off = t["tokens"].tolist(), t["offsets"].tolist()
        for j, (pl, ix) in enumerate(zip(t["prompt_lens"].tolist(), t["prompt_index"].tolist())):
            seqs.append({"ids": toks[off[j]:off[j + 1]], "prompt_len": pl, "index": ix})
    return sorted(seqs, key=lambda s: s["index"])


def write_shard(path: Path, seqs: list[dict]) -> None:
    from safetensors.torch import save_file

    flat = [t for s in seqs for t in s["ids"]]
    off = [0]
    for s in seqs:
        off.append(off[-1] + len(s["ids"]))
    tensors = {"tokens": torch.tensor(flat, dtype=torch.int32), "offsets": torch.tensor(off, dtype=torch.int64),
               "prompt_lens": torch.tensor([s["prompt_len"] for s in seqs], dtype=torch.int32),
               "prompt_index": torch.tensor([s["index"] for s in seqs], dtype=torch.int64)}
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": DATA_FORMAT})
    os.replace(tmp, path)


def generate_dataset(model, tok, spec: PromptSpec, gen: GenConfig, out: str | Path, target: str = "",
                     progress: bool = True) -> dict:
    """Generate (or finish generating) the dataset in ``out``. -> summary dict."""
    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    items = calib_items(spec)
    prompts = [m for m, _ in items]
    man = {"format": DATA_FORMAT, "split": spec.split, "seed": spec.seed, "n": spec.n,
           "general_frac": spec.general_frac, "max_tokens": gen.max_tokens, "target": target,
           "constrained": gen.constrained, "prompt_set_sha256": prompt_set_hash([render_key(m) for m in prompts])}
    old = _manifest(out)
    if old is not None:
        keys = ("format", "split", "seed", "general_frac", "max_tokens", "target", "constrained")
        diff = [k for k in keys if old.get(k, False if k == "constrained" else None) != man[k]]
        if diff:
            raise ThorError(f"{out}: existing data was made with different settings ({', '.join(diff)}); "
                            "use another --out or delete it")
    write_json_atomic(out / "manifest.json", man)

    done = {s["index"] for s in read_shards(out)}
    todo = [i for i in range(len(prompts)) if i not in done]
    enc = {i: tok.encode_chat(prompts[i]) for i in todo}
    # Similar lengths per batch: less left padding to pay for.
    todo.sort(key=lambda i: len(enc[i]))
    shard_no = len(list(out.glob("shard-*.safetensors")))
    bar = tqdm(total=len(prompts), initial=len(done), desc="gen-data", unit="prompt", file=sys.stderr,
               disable=not progress, dynamic_ncols=True)
    n_tok = 0
    plan_greedy = PlanGreedy(model, tok, gen.max_tokens) if gen.constrained else None
    for b in range(0, len(todo), gen.batch):
        idx = todo[b:b + gen.batch]
        if plan_greedy is not None:
            resp = [plan_greedy(enc[i], items[i][1]) for i in idx]
        else:
            resp = batched_greedy(model, [enc[i] for i in idx], gen.max_tokens, getattr(tok, "eos_token_ids", ()))
        seqs = [{"ids": enc[i] + r, "prompt_len": len(enc[i]), "index": i} for i, r in zip(idx, resp)]
        write_shard(out / f"shard-{shard_no:05d}.safetensors", seqs)
        shard_no += 1
        n_tok += sum(len(r) for r in resp)
        bar.update(len(idx))
        bar.set_postfix(new_tokens=n_tok)
    bar.close()
    return {"out": str(out), "prompts": len(prompts), "generated_now": len(todo), "new_tokens": n_tok,
            **{k: man[k] for k in ("split", "seed", "max_tokens", "prompt_set_sha256")}}
