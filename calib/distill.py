"""`thor calib distill`: train a DFlash block drafter on the target's own greedy outputs.

One training example = one block at an anchor position a in the response of a sequence s:

    block ids  [s[a], MASK x (B-1)]  at positions a .. a+B-1
    context    target tap features of tokens a-W .. a-1 (what the proposer's window holds
               when a is the anchor: causal across blocks, nothing at or after the anchor)
    labels     s[a+1 .. a+B-1]      (the target's greedy tokens: the data IS its output)

Within a block attention is bidirectional (the drafter's inference mode). Several blocks of
one sequence share one context slice per row; the mask keeps each block to its own anchor's
past (``block_attention_mask``) and to the last W features (the inference window).

Loss: cross-entropy at block rows k = 1..B-1, weighted w_k = exp(-(k-1)/gamma), normalised by
the weights present. Why decay: a draft at row k only counts if rows 1..k-1 were accepted,
so early rows matter most; gamma = 7 for B = 16 (the DFlash paper's choice) leaves row 15 at
~0.14 of row 1 — still trained, but it cannot dominate the gradient.

The target's embedding and lm_head are shared and frozen (bound, never saved). AdamW with
linear warmup then cosine decay to 10 % of the peak rate; gradient norm clipped at 1.

Several workers (torchrun): the drafter is wrapped in DistributedDataParallel (gloo; training
runs on the CPU) and each worker trains on its contiguous slice of the same global batch of
--batch rows (drawn by every worker from the same generator). The loss one process takes is a
mean over the whole batch's weighted positions, so each worker divides its weighted CE sum by
the batch's weight sum (added up over the workers) times the worker count: DDP's gradient
average is then the one-process gradient, and the loss curve is one process's within float
rounding. Rank 0 alone writes checkpoints, the drafter and the report; after torchrun restarts
the workers (--max-restarts) every one resumes from the last checkpoint.

Precision: fp32 by default. Measured on the 2-core dev box (1 thread, SmolLM2-135M target,
batch 4 x 8 blocks of 16): with the data-vocabulary softmax fp32 took 0.43-0.57 s/step and
bf16 autocast 0.74-0.86 s/step (casts dominate once the head is small); only with the full
49k-vocabulary head was bf16 faster (2.8 vs 5.0 s/step). Hence --bf16 is opt-in.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from agent.planner.plan_format import FORMAT_KEY
from thor_runtime.config import SpeculationSettings
from thor_runtime.errors import ThorError
from thor_runtime.fileio import write_json_atomic
from thor_runtime.speculative import (
    DFlashConfig,
    DFlashDrafter,
    DraftVocab,
    block_attention_mask,
    default_tap_layers,
    response_counts,
    save_drafter,
    weights_kind,
)

from .ckpt import init_hash, init_weights, load_checkpoint, save_checkpoint
from .dist import ONE, World
from .features import build_features
from .shards import read_manifest, read_shards

SPAN = 64  # anchors of one row lie within SPAN tokens, so a row's context is at most W + SPAN


@dataclass(frozen=True)
class DistillConfig:
    out: str
    data: str | None = None
    gen_n: int = 64
    gen_max_tokens: int = 192
    layers: int = 1
    block_size: int = DFlashConfig.block_size  # the drafter's own B
    taps: str = "auto"
    num_taps: int = 3
    window: int = SpeculationSettings.window  # W as the runtime runs it
    steps: int = 1000
    lr: float = 3e-4
    warmup: int = 50
    batch: int = 4
    blocks: int = 8
    gamma: float = 7.0
    weight_decay: float = 0.01
    ckpt_every: int = 100
    resume: bool = False
    bf16: bool = False
    seed: int = 0
    eval_n: int = 8
    eval_max_tokens: int = 128
    vocab: str = "data"  # softmax over: "data" (data tokens + negatives) | "full"
    negatives: int = 2048  # random out-of-data ids per step with vocab=data
    max_time: float = 0.0  # stop (with a checkpoint) after this much training time
    stop_at: int = 0  # stop (with a checkpoint) after this step; 0 = run to `steps`
    eval_prompts: str = "robot"  # held-out set for the report: robot | general
    draft_vocab: int = 2048  # head shortlist: the N most frequent response tokens (0 = full head)
    intermediate: int = 0  # the drafter's MLP width (0 = the target's): a wide target's
    #                                  MLP would make the drafter larger than it needs to be
    init: str = ""  # a drafter dir to start from instead of random weights (after a
    #                                  format change the old drafter already knows the plans' words)

    def __post_init__(self):
        for k in (
            "gen_n",
            "gen_max_tokens",
            "layers",
            "num_taps",
            "window",
            "steps",
            "batch",
            "blocks",
            "ckpt_every",
            "eval_max_tokens",
        ):
            if getattr(self, k) < 1:
                raise ThorError(f"distill: {k} must be >= 1, got {getattr(self, k)}")
        if self.block_size < 2:
            raise ThorError(f"distill: block size must be >= 2, got {self.block_size}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ThorError(f"distill: lr must be a positive number, got {self.lr}")
        if (
            min(
                self.warmup,
                self.eval_n,
                self.max_time,
                self.weight_decay,
                self.stop_at,
                self.draft_vocab,
                self.intermediate,
            )
            < 0
        ):
            raise ThorError(
                "distill: warmup, eval_n, max_time, weight_decay, stop_at, draft_vocab and "
                "intermediate must be >= 0"
            )
        if not self.gamma > 0:
            raise ThorError(f"distill: gamma must be > 0, got {self.gamma}")
        if self.vocab not in ("data", "full") or self.negatives < 0:
            raise ThorError("distill: --vocab must be data or full and --negatives >= 0")
        if self.taps != "auto":
            self.tap_list(1 << 30)

    @classmethod
    def from_args(cls, a) -> "DistillConfig":
        block = cls.block_size if a.block_size is None else a.block_size
        return cls(
            a.out,
            a.data,
            a.gen_n,
            a.gen_max_tokens,
            a.layers,
            block,
            a.taps,
            a.num_taps,
            a.window,
            a.steps,
            a.lr,
            a.warmup,
            a.batch,
            a.blocks,
            a.gamma,
            a.weight_decay,
            a.ckpt_every,
            a.resume,
            a.bf16,
            a.seed,
            a.eval_n,
            a.eval_max_tokens,
            a.vocab,
            a.negatives,
            a.max_time,
            a.stop_at,
            draft_vocab=a.draft_vocab,
            intermediate=a.intermediate,
            init=a.init or "",
        )

    def tap_list(self, num_layers: int) -> tuple[int, ...]:
        if self.taps == "auto":
            return default_tap_layers(num_layers, min(self.num_taps, num_layers))
        try:
            taps = tuple(int(x) for x in self.taps.split(","))
        except ValueError:
            raise ThorError(
                f"--taps: expected auto or comma-separated layer ids, got {self.taps!r}"
            ) from None
        if len(set(taps)) != len(taps) or any(not 0 <= t < num_layers for t in taps):
            raise ThorError(
                f"--taps: layer ids must be distinct and in 0..{num_layers - 1}, got {self.taps}"
            )
        return taps


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[B-1] w_k = exp(-(k-1)/gamma) for block rows k = 1..B-1."""
    return torch.exp(-torch.arange(block_size - 1, dtype=torch.float32) / gamma)


def lr_at(step: int, cfg: DistillConfig) -> float:
    """Linear warmup to cfg.lr, then cosine to 0.1 * cfg.lr at cfg.steps (step counts from 0)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def make_batch(
    seqs: list[dict],
    feats,
    cfg: DistillConfig,
    mask_id: int,
    gen: torch.Generator,
    rows: slice = slice(None),
) -> dict:
    """Sample cfg.batch sequences x cfg.blocks anchors -> tensors for one step: the rows
    ``rows`` of that global batch (a DDP worker's slice; all of it by default). Every worker
    draws the whole batch from the same generator, so the generators stay in step and the
    workers' slices are together the batch one process trains on."""
    Bk, W, nb = cfg.block_size, cfg.window, cfg.blocks
    C = W + SPAN
    draws = []
    pick = torch.randint(len(seqs), (cfg.batch,), generator=gen)
    for i in pick.tolist():
        s, pl = seqs[i]["ids"], seqs[i]["prompt_len"]
        T = len(s)
        lo, hi = pl, T - 2  # anchor needs at least one label after it
        start = lo + int(torch.randint(max(1, hi - SPAN + 2 - lo), (1,), generator=gen))
        anchors = start + torch.randint(min(SPAN, hi - start + 1), (nb,), generator=gen)  # [nb]
        draws.append((i, start, anchors))
    draws = draws[rows]
    R = len(draws)
    ctx = torch.zeros(R, C, feats.taps.shape[1], dtype=feats.taps.dtype)  # [R, C, n_taps*D]
    ctx_pos = torch.zeros(R, C, dtype=torch.long)  # [R, C]
    ctx_ok = torch.zeros(R, C, dtype=torch.bool)  # [R, C]
    ids = torch.full((R, nb, Bk), mask_id, dtype=torch.long)  # [R, nb, Bk]
    pos = torch.zeros(R, nb, Bk, dtype=torch.long)  # [R, nb, Bk]
    labels = torch.full((R, nb, Bk - 1), -100, dtype=torch.long)  # [R, nb, Bk-1]
    for r, (i, start, anchors) in enumerate(draws):
        s = seqs[i]["ids"]
        c0, c1 = max(feats.first[i], start - W), int(anchors.max())
        n = c1 - c0
        ctx[r, :n] = feats.rows(i, c0, c1)
        ctx_pos[r, :n] = torch.arange(c0, c1)
        ctx_ok[r, :n] = True
        st = torch.tensor(s)
        for j, a in enumerate(anchors.tolist()):
            ids[r, j, 0] = s[a]
            pos[r, j] = torch.arange(a, a + Bk)
            lab = st[a + 1 : a + Bk]
            labels[r, j, : lab.shape[0]] = lab
    block_pos = pos.view(R, nb * Bk)  # [R, N]
    mask = block_attention_mask(ctx_pos, block_pos, Bk, ctx_ok)  # [R, N, C+N]
    # The proposer's window holds only the last W features before the anchor.
    anchor = block_pos[:, ::Bk].repeat_interleave(Bk, dim=1)  # [R, N]
    mask[:, :, :C] &= ctx_pos[:, None, :] >= (anchor - W)[:, :, None]
    return {
        "ids": ids.view(R, nb * Bk),
        "pos": block_pos,
        "ctx": ctx,
        "ctx_pos": ctx_pos,
        "mask": mask,
        "labels": labels,
    }


def block_loss(
    drafter: DFlashDrafter,
    b: dict,
    w: torch.Tensor,
    bf16: bool = False,
    vocab: torch.Tensor | None = None,
):
    """-> (weighted CE scalar, per-row top-1 accuracy [B-1], labeled positions count).

    vocab: optional sorted ids [Vs] to take the softmax over instead of the full vocabulary
    (every label must be in it). The [V, D] head is most of a CPU training step (its forward
    and input-gradient are 2 * rows * V * D MACs); see ``train_vocab``."""
    ce_w, wsum, hit, valid = block_terms(drafter, b, w, bf16, vocab)
    return ce_w / wsum.clamp(min=1e-6), hit / valid.clamp(min=1), int(valid.sum())


def block_terms(
    drafter: DFlashDrafter,
    b: dict,
    w: torch.Tensor,
    bf16: bool = False,
    vocab: torch.Tensor | None = None,
    net=None,
):
    """The sums ``block_loss`` divides -> (sum of weighted CE (with grad), sum of the weights
    present, top-1 hits [B-1], labeled rows [B-1]). Sums, not means, so that workers that
    each hold a slice of the batch can add theirs up to the whole batch's. net: what runs the
    forward (the drafter wrapped for DDP), default the drafter itself."""
    R, N = b["ids"].shape
    Bk = w.shape[0] + 1
    lab = b["labels"]  # [R, nb, Bk-1]
    head = drafter.lm_head_w  # [V, D]
    if vocab is not None:
        head = head[vocab]  # [Vs, D]
        lab = torch.where(lab >= 0, torch.searchsorted(vocab, lab.clamp(min=0)), lab)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        h = (drafter if net is None else net)(
            b["ids"], b["pos"], b["ctx_pos"], ctx_taps=b["ctx"], attn_mask=b["mask"]
        )  # [R, N, D]
        h = h.view(R, N // Bk, Bk, -1)[:, :, 1:]  # [R, nb, Bk-1, D]
        logits = F.linear(h, head.to(h.dtype))  # [R, nb, Bk-1, V|Vs]
    ce = F.cross_entropy(
        logits.flatten(0, 2).float(), lab.flatten(), reduction="none", ignore_index=-100
    ).view_as(lab)  # [R, nb, Bk-1]
    valid = (lab >= 0).float()
    wv = w[None, None] * valid
    with torch.no_grad():
        hit = (logits.argmax(-1) == lab).float() * valid
    return (ce * wv).sum(), wv.sum(), hit.sum((0, 1)), valid.sum((0, 1))  # [], [], [Bk-1] x 2


def data_tokens(seqs: list[dict], vocab_size: int) -> torch.Tensor:
    """bool [V]: ids that occur anywhere in the data."""
    seen = torch.zeros(vocab_size, dtype=torch.bool)
    for s in seqs:
        seen[torch.tensor(s["ids"])] = True
    return seen


def train_vocab(in_data: torch.Tensor, negatives: int, gen: torch.Generator) -> torch.Tensor:
    """Sorted ids [Vs]: every token of the data (labels and prompt words the target copies)
    plus ``negatives`` other ids drawn afresh each step. Why: a full-vocabulary softmax costs
    ~10x more on CPU, while the target's planner outputs use a few thousand distinct tokens; the
    random negatives keep pushing down logits of tokens outside the data, so the drafter's
    full-vocabulary argmax at inference stays inside what it was trained to rank."""
    seen = in_data.clone()
    rest = (~seen).nonzero().squeeze(1)
    if negatives and len(rest):
        seen[rest[torch.randperm(len(rest), generator=gen)[:negatives]]] = True
    return seen.nonzero().squeeze(1)


def _fingerprint(cfg: DistillConfig, dcfg: DFlashConfig, data_hash: str) -> dict:
    keep = (
        "layers",
        "block_size",
        "window",
        "steps",
        "lr",
        "warmup",
        "batch",
        "blocks",
        "gamma",
        "weight_decay",
        "bf16",
        "seed",
        "vocab",
        "negatives",
    )
    init = {"init": init_hash(cfg.init)} if cfg.init else {}  # none: checkpoints made before --init
    return {
        **{k: getattr(cfg, k) for k in keep},
        "drafter": json.dumps(asdict(dcfg), sort_keys=True),
        "data": data_hash,
        **init,
    }


def _plot(losses: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if losses:
        st, lv = zip(*losses)
        ax.plot(st, lv, lw=0.8, alpha=0.4, label="loss")
        k = max(1, len(lv) // 25)
        sm = [
            sum(lv[max(0, i - k + 1) : i + 1]) / len(lv[max(0, i - k + 1) : i + 1])
            for i in range(len(lv))
        ]
        ax.plot(st, sm, lw=1.6, label=f"mean of {k}")
    ax.set_xlabel("step")
    ax.set_ylabel("weighted CE")
    ax.set_title("DFlash distillation")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass
class Prepared:
    """What training reads: the data set, its drafter config and the target's tap features."""

    data_name: str  # the gen-data dirs' names, comma-separated
    manifest: dict
    seqs: list[dict]
    dcfg: DFlashConfig
    feats: object  # features.Features
    data_hash: str


@dataclass
class Trained:
    drafter: DFlashDrafter
    step: int
    losses: list
    elapsed_s: float
    acc: torch.Tensor  # [B-1] last step's per-position train accuracy


def _weights_key(model) -> dict:
    """Taps of other weights are other features; fp32, the long-standing default, adds no key so
    caches made before the key existed stay valid."""
    kind = weights_kind(model)
    return {} if kind == "fp32" else {"weights": kind}


def prepare(loaded, cfg: DistillConfig, progress: bool = True, world: World = ONE) -> Prepared:
    """Generate the data when none is given, check it, and compute (or reuse) the features
    (with several workers each generates and computes its share; all then read the whole)."""
    model, tok = loaded.model, loaded.tokenizer
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    dirs = [Path(d) for d in cfg.data.split(",") if d.strip()] if cfg.data else [out / "data"]
    if cfg.data is None:
        from .datagen import GenConfig, generate_dataset
        from .prompts import PromptSpec

        generate_dataset(
            model,
            tok,
            PromptSpec("train", cfg.gen_n),
            GenConfig(cfg.gen_max_tokens, 8),
            dirs[0],
            progress=progress,
            world=world,
        )
    man, seqs = read_data(dirs)

    mcfg = model.cfg
    taps = cfg.tap_list(mcfg.num_layers)
    mask_id = tok.token_to_id("<|endoftext|>")
    mask_id = mcfg.vocab_size - 1 if mask_id is None else mask_id
    dcfg = DFlashConfig(
        tap_layers=taps,
        mask_token_id=mask_id,
        hidden_size=mcfg.hidden_size,
        num_layers=cfg.layers,
        num_heads=mcfg.num_heads,
        num_kv_heads=mcfg.num_kv_heads,
        head_dim=mcfg.head_dim,
        intermediate_size=cfg.intermediate or mcfg.intermediate_size,
        block_size=cfg.block_size,
        rms_eps=mcfg.rms_eps,
        rope_theta=mcfg.rope_theta,
        target_id=mcfg.name,
        window=cfg.window,
        target_weights=weights_kind(model),
        plan_format=man.get(FORMAT_KEY, "") if man.get("constrained") else "",
    )
    data_hash = f"{man['prompt_set_sha256']}:{len(seqs)}:{sum(len(s['ids']) for s in seqs)}"
    feats = build_features(
        model,
        seqs,
        taps,
        cfg.window,
        out / "features",
        {"target": mcfg.name, **_weights_key(model)},
        progress,
        world,
    )
    return Prepared(",".join(d.name for d in dirs), man, seqs, dcfg, feats, data_hash)


def train(
    model, prep: Prepared, cfg: DistillConfig, progress: bool = True, world: World = ONE
) -> Trained:
    """The training loop, checkpointing every ``ckpt_every`` steps (``resume`` continues one;
    so does a worker torchrun restarted, where a checkpoint is)."""
    from tqdm import tqdm

    rows = world.rows(cfg.batch)
    dcfg, seqs = prep.dcfg, prep.seqs
    torch.manual_seed(cfg.seed)  # drafter init only; batches use their own generator
    drafter = DFlashDrafter(dcfg)
    # Small init for the projections (HF-style 0.02), unit norms: the residual stream starts
    # as the anchor/mask embedding, so early steps are stable.
    with torch.no_grad():
        for n, p in drafter.named_parameters():
            if not n.endswith("norm.weight"):
                p.normal_(0.0, 0.02)
    if cfg.init:
        init_weights(drafter, cfg.init)
    drafter.bind_target(model.embed_w.float(), model.lm_head.float())
    for p in (drafter.embed_w, drafter.lm_head_w):
        p.requires_grad_(False)
    opt = torch.optim.AdamW(
        drafter.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    fp = _fingerprint(cfg, dcfg, prep.data_hash)
    ckpt_dir = Path(cfg.out) / "ckpt"
    step, losses, elapsed = 0, [], 0.0
    # A restarted worker group resumes what the killed one checkpointed (the command line is
    # the first one's, with or without --resume); before its first checkpoint it starts over.
    if cfg.resume or (world.restart and (ckpt_dir / "ckpt.json").exists()):
        doc = load_checkpoint(ckpt_dir, drafter, opt, gen, fp)
        step, losses, elapsed = (
            int(doc["step"]),
            [list(x) for x in doc["losses"]],
            float(doc["elapsed_s"]),
        )
    if world.size > 1:
        at = world.gather(step)
        if len(set(at)) > 1:  # a worker on another machine cannot see rank 0's checkpoint
            raise ThorError(
                f"distill: the workers would resume at different steps ({at}, by rank): "
                f"{ckpt_dir} must be one directory every worker sees"
            )
    net = _ddp(drafter, world)

    w = position_weights(cfg.block_size, cfg.gamma)  # [B-1]
    in_data = data_tokens(seqs, model.cfg.vocab_size)  # [V] bool
    drafter.train()
    bar = tqdm(
        total=cfg.steps,
        initial=step,
        desc="distill" if world.size == 1 else f"distill ({world.size} workers)",
        unit="step",
        file=sys.stderr,
        disable=not (progress and world.main),
        dynamic_ncols=True,
    )
    t0, toks, acc = time.perf_counter(), 0, torch.zeros(cfg.block_size - 1)
    while step < cfg.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        b = make_batch(seqs, prep.feats, cfg, dcfg.mask_token_id, gen, rows)
        vocab = train_vocab(in_data, cfg.negatives, gen) if cfg.vocab == "data" else None
        ce_w, wsum, hit, valid = block_terms(drafter, b, w, cfg.bf16, vocab, net)
        if world.size == 1:
            loss = ce_w / wsum.clamp(min=1e-6)
        else:
            # the whole batch's sums, so that every worker scales its part of the gradient by
            # the same weight total: DDP's mean over workers is then the one-process gradient
            tot = world.sum(torch.cat([torch.stack([ce_w.detach(), wsum]), hit, valid]))
            wsum, hit, valid = tot[1], tot[2 : 2 + len(hit)], tot[2 + len(hit) :]
            loss = ce_w / wsum.clamp(min=1e-6) * world.size
        acc = hit / valid.clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        toks += int(valid.sum())
        lval = float(loss.detach()) if world.size == 1 else float(tot[0] / wsum.clamp(min=1e-6))
        losses.append([step, round(lval, 6)])
        dt = time.perf_counter() - t0
        bar.update(1)
        bar.set_postfix(loss=f"{lval:.3f}", acc1=f"{float(acc[0]):.2f}", tok_s=f"{toks / dt:.0f}")
        late = bool(cfg.max_time and elapsed + dt >= cfg.max_time)
        # each worker has its own clock: they stop together when the first one is late
        over = (world.any(late) if cfg.max_time else late) or step == cfg.stop_at
        if world.main and (step % cfg.ckpt_every == 0 or step == cfg.steps or over):
            save_checkpoint(ckpt_dir, step, drafter, opt, gen, fp, losses, elapsed + dt)
        if over:
            break
    bar.close()
    drafter.eval()
    return Trained(drafter, step, losses, elapsed + time.perf_counter() - t0, acc)


def report(
    loaded,
    prep: Prepared,
    run: Trained,
    cfg: DistillConfig,
    command: str = "",
    progress: bool = True,
) -> dict:
    """Save the drafter (with its shortlist), the loss plot and report.json; a finished run is
    also evaluated on held-out prompts."""
    out, losses = Path(cfg.out), run.losses
    if cfg.draft_vocab:
        run.drafter.draft_vocab = build_draft_vocab(
            prep.seqs, cfg.draft_vocab, loaded.model.cfg.vocab_size, prep.data_name
        )
    save_drafter(run.drafter, out)
    _plot(losses, out / "loss.png")
    doc = {
        "drafter": str(out),
        "step": run.step,
        "steps": cfg.steps,
        "finished": run.step >= cfg.steps,
        "final_loss": losses[-1][1] if losses else None,
        "final_loss_mean_last_50": round(
            sum(x[1] for x in losses[-50:]) / max(1, len(losses[-50:])), 4
        ),
        "train_acc_per_position_last_step": [round(float(a), 3) for a in run.acc],
        "train_sequences": len(prep.seqs),
        "train_time_s": round(run.elapsed_s, 1),
        "tap_layers": list(prep.dcfg.tap_layers),
        "position_weight": f"exp(-(k-1)/{cfg.gamma})",
        "config": asdict(cfg),
        "command": command,
    }
    if cfg.eval_n and run.step >= cfg.steps:  # an interrupted run is evaluated when it finishes
        from .eval_drafter import EvalConfig, evaluate

        # Judged the way the data was made: planner data is evaluated under the plan grammar.
        constrained = bool(prep.manifest.get("constrained")) and cfg.eval_prompts == "robot"
        doc["heldout"] = evaluate(
            loaded,
            EvalConfig(
                str(out),
                cfg.eval_n,
                cfg.eval_max_tokens,
                prompt_set=cfg.eval_prompts,
                constrained=constrained,
            ),
            progress=progress,
            drafter=run.drafter,
        )
    write_json_atomic(out / "report.json", doc)
    return doc


def run_distill(
    loaded, cfg: DistillConfig, command: str = "", progress: bool = True, world: World = ONE
) -> dict:
    """prepare -> train -> report (rank 0's; the other workers return where they stopped)."""
    world.rows(cfg.batch)  # an uneven split is refused before the data and taps are made
    prep = prepare(loaded, cfg, progress, world)
    run = train(loaded.model, prep, cfg, progress, world)
    if not world.main:
        return {"rank": world.rank, "step": run.step}
    return report(loaded, prep, run, cfg, command, progress)


def _ddp(drafter: DFlashDrafter, world: World):
    """The drafter as the workers train it: wrapped in DDP (which averages the gradients over
    the workers during backward) when there are several, else itself."""
    if world.size == 1:
        return drafter
    from torch.nn.parallel import DistributedDataParallel

    # The target's embedding and head are plain tensors on the drafter, not parameters: DDP
    # neither broadcasts nor reduces them.
    return DistributedDataParallel(drafter)


# what the data sets one run trains on must share: the same answers to the same kind of prompt
_SAME = ("split", "target", "constrained", FORMAT_KEY)


def read_data(dirs: list[Path]) -> tuple[dict, list[dict]]:
    """-> (manifest, sequences) of one or more gen-data dirs of the train split, in order (a
    later one adds requests: the features of the earlier ones' parts are reused). Their target,
    plan format and decoding must agree; the manifest's prompt_set_sha256 covers every dir."""
    mans, seqs = [], []
    for d in dirs:
        m = read_manifest(d) or {}
        if m.get("split") != "train":
            raise ThorError(
                f"{d}: distillation only trains on the train split (found {m.get('split')!r})"
            )
        diff = [k for k in _SAME if mans and m.get(k) != mans[0].get(k)]
        if diff:
            raise ThorError(
                f"{d}: its {', '.join(diff)} differ from {dirs[0]}'s: one run trains on one "
                f"target's answers to one format"
            )
        mans.append(m)
        seqs += [s for s in read_shards(d) if len(s["ids"]) - s["prompt_len"] >= 2]
    if not seqs:
        raise ThorError(f"{', '.join(map(str, dirs))}: no sequences with a response of >= 2 tokens")
    man = dict(mans[0])
    if len(mans) > 1:
        man["prompt_set_sha256"] = hashlib.sha256(
            ":".join(m.get("prompt_set_sha256", "") for m in mans).encode()
        ).hexdigest()
    man.setdefault("prompt_set_sha256", "")
    return man, seqs


def build_draft_vocab(seqs: list[dict], size: int, vocab_size: int, data_name: str) -> DraftVocab:
    """The drafter head's shortlist from the training responses (see draft_vocab.py)."""
    counts = response_counts(seqs)
    return DraftVocab.from_counts(
        counts,
        size,
        vocab_size,
        source={
            "data": data_name,
            "sequences": len(seqs),
            "response_tokens": sum(counts.values()),
            "distinct_tokens": len(counts),
        },
    )


def write_draft_vocab(drafter_dir: str, data_dir: str, size: int, vocab_size: int) -> dict:
    """(Re)build the shortlist of an existing drafter from its training data."""
    from thor_runtime.speculative import load_drafter

    d, data = Path(drafter_dir), Path(data_dir)
    load_drafter(d)  # refuses anything that is not a drafter before writing into it
    man = read_manifest(data) or {}
    if man.get("split") != "train":
        raise ThorError(
            f"{data}: the shortlist comes from training data (found split {man.get('split')!r})"
        )
    vocab = build_draft_vocab(read_shards(data), size, vocab_size, data.name)
    path = vocab.save(d)
    return {
        "drafter": str(d),
        "path": str(path),
        "size": len(vocab.ids),
        "coverage": vocab.coverage,
        **vocab.source,
    }
