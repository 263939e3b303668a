"""DFlash proposer: a block drafter over a per-token window of target features.

The window holds at most W context entries, ONE PER COMMITTED TOKEN (FlashRT's
per-token window, not one per cycle): each entry is the fc-projected target taps of
that token, its absolute position, and — cached so nothing is recomputed per cycle —
every drafter layer's K/V of it. Entries live in a ring buffer; the drafter's attention
over the context is non-causal and positions are baked into K by RoPE, so the ring's
slot order never matters and the oldest entry is dropped by overwriting it.

Lifecycle (driven by ``generate.py``):

* ``start``: the window is seeded from the prefill taps of the last min(W, prompt_len)
  prompt tokens (``seed_window=False`` starts empty: the first block then attends to
  itself only).
* ``propose(seq, k)``: anchor = the last committed token (seq[-1] unless grammar-forced
  tokens follow it), which has no feature yet (it is verified in this cycle); the block
  [anchor, MASK x (B-1)] gives k <= B-1 drafts (greedy argmax, probs None; or sampled from
  q with q returned if sample_probs); forced tokens occupy the block's first rows. With a
  draft vocabulary (draft_vocab.py) the head scores only its ids plus the prompt's.
* ``commit(n_rows, taps)``: verify rows 0..n_rows-1 (row 0 = the anchor just verified,
  then the accepted drafts) enter the window in row order, at positions next_pos.. —
  so the first new entry is the first newly committed token, never a repeat of the
  previous cycle's last row (the FlashRT review bug).
"""

from __future__ import annotations

import copy

import torch

from thor_runtime.device import cpu_bf16
from thor_runtime.errors import ThorError
from thor_runtime.kernels.row_linear import RowLinear, head_rows, on_rows, row_kernel
from thor_runtime.speculative.base import Proposer
from thor_runtime.speculative.dflash_graph import GraphedBlock
from thor_runtime.speculative.dflash_io import check_fits
from thor_runtime.speculative.dflash_model import DFlashDrafter
from thor_runtime.speculative.dflash_rows import fused_weights, row_drafter


def draft_dtype(target) -> torch.dtype:
    """The dtype a drafter with its own head rows runs in beside ``target``: the target's
    activation dtype, except bf16 in place of fp32 on a CPU with native bf16 arithmetic (AVX-512
    BF16, AMX, ARM BF16), where its 16-row matmuls take about half the time. Drafts are only
    guesses (the target's verify decides every token), so this moves speed, never output;
    the rule reads the CPU's flags, so every process on one machine drafts alike."""
    if target.device.type == "cpu" and target.dtype == torch.float32 and cpu_bf16():
        return torch.bfloat16
    return target.dtype


class DFlashProposer(Proposer):
    name = "dflash"

    def __init__(
        self,
        drafter: DFlashDrafter,
        target=None,
        window: int | None = None,
        seed_window: bool = True,
        block_size: int | None = None,
        sample_probs: bool = False,
        draft_temperature: float = 1.0,
        seed: int | None = None,
        full_vocab: bool = False,
        fixed_block: bool | None = None,
    ):
        """target: the TargetModel whose embedding / lm_head the drafter shares (may be None if
        the drafter is already bound). sample_probs: draw drafts from softmax(logits /
        draft_temperature) and return those probabilities, for speculative sampling (drafts
        must be samples of the q handed to the acceptor); otherwise greedy drafts, no probs.
        full_vocab: score the whole vocabulary even if the drafter has a draft vocabulary.
        fixed_block: the block forward at one shape over the whole window (dflash_graph.py), a
        CUDA graph on CUDA; None = on CUDA."""
        cfg = drafter.cfg
        if target is not None:
            check_fits(cfg, target.cfg, "dflash drafter")
            # The drafter runs in the shared table's dtype, so the full lm_head is used as is (a
            # dtype mismatch would copy [V, D] on every propose) — unless a draft vocabulary
            # gathers its rows once anyway: then see draft_dtype.
            shortlist = drafter.draft_vocab is not None and not full_vocab
            # with its own head rows, the drafter's projections run on the target's row kernel
            # where it has one (row_linear.py)
            self._rows = row_kernel(target) if shortlist else None
            self._target = target if self._rows is not None else None
            if self._rows is not None:
                # the whole block and window updates as row-kernel calls where they fit
                # (dflash_rows.py), from the float weights, read before on_rows replaces them
                fused = fused_weights(drafter) if not isinstance(drafter.fc, RowLinear) else None
                on_rows(drafter, self._rows)
                if fused is not None:
                    drafter.row_block = row_drafter(self._rows, drafter, fused)
            else:
                drafter.to(
                    device=target.device,
                    dtype=draft_dtype(target) if shortlist else target.embed_w.dtype,
                )
            drafter.bind_target(target.embed_w, target.lm_head)
        elif drafter.embed_w is None:
            raise ThorError("dflash: pass the target model (its embedding and lm_head are shared)")
        else:
            self._rows = self._target = None
        self.window = cfg.window if window is None else int(window)
        self.block_size = cfg.block_size if block_size is None else int(block_size)
        if self.window < 0:
            raise ThorError(f"dflash: window must be >= 0, got {self.window}")
        if self.block_size < 2:
            raise ThorError(f"dflash: block size must be >= 2, got {self.block_size}")
        if sample_probs and not draft_temperature > 0:
            raise ThorError(f"dflash: draft temperature must be > 0, got {draft_temperature}")
        self.drafter = drafter.eval()
        self.tap_layers = cfg.tap_layers
        self.seed_window, self.sample_probs, self.temp = (
            seed_window,
            sample_probs,
            float(draft_temperature),
        )
        self.gen = torch.Generator(device=drafter.embed_w.device)
        self.gen.manual_seed(seed if seed is not None else torch.seed() % (2**63))
        self.vocab = None if full_vocab else drafter.draft_vocab
        # the block and window updates as row-kernel calls (dflash_rows.py), where they fit
        self._fast = drafter.row_block if self._rows is not None and self.window > 0 else None
        self._ids: torch.Tensor | None = None  # [V'] token ids the head scores (None = all)
        self._head: torch.Tensor | None = None  # [V', D] their lm_head rows
        self._alloc()
        on_cuda = self._kv.is_cuda
        fixed = on_cuda if fixed_block is None else fixed_block
        self._block = (
            GraphedBlock(self.drafter, self._kv, self.block_size, graphs=on_cuda)
            if fixed and self.window > 0
            else None
        )

    def fork(self) -> "DFlashProposer":
        """The same drafter and settings with a window of its own (the drafter's weights are
        shared; its draft generator is seeded from this one's)."""
        other = copy.copy(self)
        other.gen = torch.Generator(device=self.gen.device)
        other.gen.manual_seed(
            int(torch.randint(0, 2**62, (1,), generator=self.gen, device=self.gen.device))
        )
        other._ids = other._head = None
        other._alloc()
        if self._block is not None:
            other._block = GraphedBlock(
                other.drafter, other._kv, other.block_size, graphs=other._kv.is_cuda
            )
        return other

    # ---- window storage
    def _alloc(self) -> None:
        c, W = self.drafter.cfg, self.window
        dev, dt = self.drafter.embed_w.device, self.drafter.dtype
        # the C block writes its own K/V after the window's entries: block_size slots more
        S = W + (self.block_size if self._fast is not None else 0)
        with torch.inference_mode():
            self._feats = torch.zeros(W, c.hidden_size, dtype=dt, device=dev)  # [W, D]
            self._pos = torch.zeros(W, dtype=torch.long, device=dev)  # [W]
            self._kv = torch.zeros(
                c.num_layers, 2, c.num_kv_heads, S, c.head_dim, dtype=dt, device=dev
            )  # [L, 2, Hkv, S, Dh]
        self._count = 0  # entries ever appended (ring write cursor = count % W)
        self._next_pos = 0  # absolute position of the next token to commit
        # committed rows not yet in the window: (raw taps [n, n_taps*D], first position). They go
        # in at the next propose, several cycles' in one call, in the forward's turn: a window
        # update on the row kernel would otherwise wait for other sequences' shared rounds
        self._pending: list[tuple[torch.Tensor, int]] = []

    def _flush(self) -> None:
        if self._pending:
            raw = (
                torch.cat([r for r, _ in self._pending])
                if len(self._pending) > 1
                else self._pending[0][0]
            )
            first = self._pending[0][1]
            self._pending = []
            with torch.inference_mode():
                self._append(raw, first)

    def _append(self, raw: torch.Tensor, first_pos: int) -> None:
        """raw [n, n_taps*D]: taps of consecutive tokens at positions first_pos.. in order."""
        n, W = raw.shape[0], self.window
        if W == 0 or n == 0:
            return
        if n > W:  # only the newest W can survive anyway
            raw, first_pos, n = raw[n - W :], first_pos + n - W, W
        d = self.drafter
        pos = torch.arange(first_pos, first_pos + n, device=self._pos.device)  # [n]
        slots = (torch.arange(n, device=self._pos.device) + self._count) % W  # [n]
        if self._fast is not None:
            self._fast.append(raw, pos, slots, self._kv, self._feats)
        else:
            feats = d.project(raw)  # [n, D]
            kv = d.context_kv(feats, pos)  # [L, 2, Hkv, n, Dh]
            self._feats.index_copy_(0, slots, feats)
            self._kv[:, :, :, :W].index_copy_(3, slots, kv)
        self._pos.index_copy_(0, slots, pos)
        self._count += n

    @property
    def window_len(self) -> int:
        self._flush()
        return min(self._count, self.window)

    def window_entries(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Oldest first: positions [n] and projected features [n, D] (inspection, tests)."""
        n, W = self.window_len, self.window
        order = torch.arange(n) if self._count <= W else (torch.arange(W) + self._count) % W
        order = order.to(self._pos.device)
        return self._pos[order].clone(), self._feats[order].clone()

    # ---- Proposer contract
    @torch.inference_mode()
    def start(self, prompt_ids, prompt_taps):
        self._count, self._pending = 0, []
        self._next_pos = len(prompt_ids)
        if self.vocab is not None:
            # Per request: the shortlist plus this prompt's tokens, gathered once.
            self._ids = self.vocab.with_tokens(prompt_ids).to(self._pos.device)  # [V']
            if self._rows is not None:
                self._head = head_rows(self._rows, self._target, self._ids, self.drafter.lm_head_w)
            else:
                self._head = self.drafter.lm_head_w.index_select(0, self._ids).to(
                    self.drafter.dtype
                )  # [V', D]
        if self.seed_window and prompt_taps:
            raw = self.drafter.concat_taps(prompt_taps)  # [T, n_taps*D]
            T = raw.shape[0]
            if T > len(prompt_ids):
                raise ThorError(f"dflash: {T} prompt tap rows for a {len(prompt_ids)}-token prompt")
            self._append(raw, len(prompt_ids) - T)

    def propose(self, seq, k):
        drafts, q, _ = self._propose(seq, k, scored=False)
        return drafts, q

    def propose_scored(self, seq, k) -> tuple[list[int], torch.Tensor | None, torch.Tensor]:
        """propose, plus the drafter's own probability of each draft (conf [n]): what the
        hybrid proposer weighs against prompt lookup."""
        return self._propose(seq, k, scored=True)

    @torch.inference_mode()
    def _propose(self, seq, k, scored: bool):
        none = torch.zeros(0)
        k = min(k, self.block_size - 1)
        if k <= 0:
            return [], None, none
        # Grammar-forced tokens may ride after the committed anchor (seq[-m:]). They have no
        # features yet, so the block stays anchored on the committed token, exactly as in
        # training ([anchor, MASK...] right after the context), and the forced tokens take
        # the block's first m rows: their drafts are certain, only rows after them are used.
        anchor_pos = self._next_pos
        m = len(seq) - 1 - anchor_pos
        if m < 0:
            raise ThorError(
                f"dflash: proposer is out of step with the sequence ({len(seq)} tokens, window "
                f"expects at least {anchor_pos + 1}); call start() per sequence"
            )
        k = min(k, self.block_size - 1 - m)
        if k <= 0:
            return [], None, none
        n = self.window_len
        if self._fast is not None:
            hn = self._fast.block(
                self.drafter.block_input(seq[anchor_pos], self.block_size), anchor_pos, self._kv, n
            )  # [B, D]
            logits = self.drafter.score(hn[1 : m + k + 1], self._head)[m:]  # [k, V']
        elif self._block is not None:
            hn = self._block.run(seq[anchor_pos], anchor_pos, n)[: m + k]  # [m+k, D]
            logits = self.drafter.score(hn, self._head)[m:]  # [k, V']
        else:
            ctx = self._kv[:, :, :, :n] if n else None  # [L, 2, Hkv, n, Dh]
            logits = self.drafter.draft_block(
                ctx, seq[anchor_pos], anchor_pos, m + k, self.block_size, head=self._head
            )[m:]  # [k, V']
        if not self.sample_probs:
            best = logits.argmax(-1)  # [k]
            ids = (best if self._ids is None else self._ids[best]).tolist()
            if not scored:  # plain DFlash: no softmax on the hot path
                return ids, None, none
            conf = torch.softmax(logits.float(), dim=-1).gather(1, best[:, None]).squeeze(1)  # [k]
            return ids, None, conf.cpu()
        q = torch.softmax(logits / self.temp, dim=-1)  # [k, V']
        drafts = torch.multinomial(q, 1, generator=self.gen).squeeze(-1)  # [k]
        conf = q.gather(1, drafts[:, None]).squeeze(1).float().cpu()  # [k]
        if self._ids is None:
            return drafts.tolist(), q, conf
        full = q.new_zeros(k, self.drafter.lm_head_w.shape[0])  # [k, V]
        full.index_copy_(1, self._ids, q)  # q is zero off the shortlist: those are never drafted
        return self._ids[drafts].tolist(), full, conf

    @torch.inference_mode()
    def commit(self, n_rows, taps):
        if taps and self.window:
            raw = self.drafter.concat_taps(taps)[:n_rows]  # [n_rows, n_taps*D]
            self._pending.append((raw, self._next_pos))
            while sum(r.shape[0] for r, _ in self._pending[1:]) >= self.window:
                self._pending.pop(0)  # the newest W rows alone reach the window
        self._next_pos += n_rows
