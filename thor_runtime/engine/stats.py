"""Generation statistics, kept apart from the loop so the loop stays readable."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    kv_dtype: str = "fp32"
    device: str = "cpu"
    kv_bytes: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of those, taken from the prefix cache instead of prefilled
    pinned_prompt_tokens: int = (
        0  # of those, from disk (a pinned shared prefix or a stored world start)
    )
    generated: int = 0
    ttft_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    cycles: int = 0
    drafted: int = 0
    accepted: int = 0
    committed: int = 0
    jump_forward: int = 0
    capped_cycles: int = 0  # cycles whose drafts the draft budget cut (to low_k or none)
    # --spec auto: the class, proposer and K it chose for this request, and where its cost curve
    # came from (speculative/auto.py CostBudget.report); None for the other methods
    auto_choice: dict | None = None
    relaxed_accepted: int = 0  # drafts the relaxed rule kept where strict greedy would not
    draft_s: float = 0.0
    verify_s: float = 0.0
    rest_s: float = 0.0
    grammar_s: float = 0.0  # in the constraint (forced tokens, masks, advancing), any phase
    # per draft position j: how many cycles offered a draft there / accepted it
    pos_offered: list[int] = field(default_factory=list)
    pos_accepted: list[int] = field(default_factory=list)
    # why the proposer that ran is not the one asked for, or what is wrong with it
    # (Speculation.note)
    spec_note: str = ""

    def record_cycle(
        self,
        n_drafts: int,
        n_acc: int,
        n_committed: int,
        forced: int,
        draft_s: float,
        verify_s: float,
        rest_s: float,
        capped: bool = False,
    ) -> None:
        self.cycles += 1
        self.capped_cycles += capped
        self.drafted += n_drafts
        self.accepted += n_acc
        self.committed += n_committed
        self.jump_forward += min(forced, n_acc)
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.rest_s += rest_s
        while len(self.pos_offered) < n_drafts:
            self.pos_offered.append(0)
            self.pos_accepted.append(0)
        for j in range(n_drafts):
            self.pos_offered[j] += 1
            self.pos_accepted[j] += j < n_acc

    def to_dict(self) -> dict:
        decode_tokens = max(self.generated - 1, 0)  # the first token comes out of prefill
        return {
            "ttft_s": round(self.ttft_s, 6),
            "prefill_tok_s": round(
                (self.prompt_tokens - self.cached_prompt_tokens) / self.prefill_s, 2
            )
            if self.prefill_s
            else 0.0,
            "decode_tok_s": round(decode_tokens / self.decode_s, 2) if self.decode_s else 0.0,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            # where the prompt came from: a pinned shared prefix (disk), a recent prompt (memory),
            # computed
            "prompt_tokens_from_disk": self.pinned_prompt_tokens,
            "prompt_tokens_from_memory": self.cached_prompt_tokens - self.pinned_prompt_tokens,
            "prompt_tokens_computed": self.prompt_tokens - self.cached_prompt_tokens,
            "generated_tokens": self.generated,
            "kv_dtype": self.kv_dtype,
            "device": self.device,
            "kv_bytes": self.kv_bytes,
            "cycles": self.cycles,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "accept_length_mean": round(self.committed / self.cycles, 4) if self.cycles else 0.0,
            "accept_per_position": [
                round(a / o, 4) if o else 0.0 for a, o in zip(self.pos_accepted, self.pos_offered)
            ],
            "jump_forward_tokens": self.jump_forward,
            "capped_cycles": self.capped_cycles,
            **({"auto_choice": self.auto_choice} if self.auto_choice is not None else {}),
            "relaxed_accepted": self.relaxed_accepted,
            "time_draft_s": round(self.draft_s, 6),
            "time_verify_s": round(self.verify_s, 6),
            "time_rest_s": round(self.rest_s, 6),
            "time_prefill_s": round(self.prefill_s, 6),
            "time_decode_s": round(self.decode_s, 6),
            "time_grammar_s": round(self.grammar_s, 6),
            "spec_note": self.spec_note,
        }
