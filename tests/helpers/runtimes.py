"""Stand-ins for Runtime: they answer each generate() with scripted text, so the planner's loop
runs without a model deciding what it says."""

from __future__ import annotations

from thor_runtime.engine.generate import Result
from thor_runtime.engine.stats import Stats
from thor_runtime.speculative import PLAIN


class ScriptedRuntime:
    """Stands in for Runtime: answers each generate() with the next scripted text."""

    def __init__(self, tok, texts, model=None):
        self.tok, self.texts, self.prompts, self.model = tok, list(texts), [], model

    def generate(self, prompt_ids, params, speculation=PLAIN, constraint=None, on_token=None):
        self.prompts.append(self.tok.decode(prompt_ids))
        ids = self.tok.encode(self.texts.pop(0), add_special=False) + [self.tok.eos_token_ids[0]]
        st = Stats(prompt_tokens=len(prompt_ids), generated=len(ids))
        return Result(ids, self.tok.decode(ids), "eos", len(prompt_ids), st)


class BudgetRuntime(ScriptedRuntime):
    """Each answer stops at the token budget, as a model repeating steps would."""

    def generate(self, prompt_ids, params, speculation=None, constraint=None, on_token=None):
        r = super().generate(prompt_ids, params)
        ids = r.token_ids[:-1]  # no EOS: it was cut
        return Result(
            ids, self.tok.decode(ids), "length", r.prompt_tokens, Stats(generated=len(ids))
        )


class Echo:
    """Stands in for Runtime: answers each generate() with the next scripted text (the last one
    again once they run out) and hands each token to ``on_token``, as the runtime does."""

    def __init__(self, tok, texts):
        self.tok, self.texts, self.calls = tok, list(texts), 0

    def generate(
        self, prompt_ids, params, speculation=PLAIN, constraint=None, on_token=None, on_prefill=None
    ):
        text = self.texts[min(self.calls, len(self.texts) - 1)]
        self.calls += 1
        ids = self.tok.encode(text, add_special=False) + [self.tok.eos_token_ids[0]]
        for t in ids:
            if on_token is not None:
                on_token(t)
        return Result(
            ids,
            self.tok.decode(ids),
            "eos",
            len(prompt_ids),
            Stats(prompt_tokens=len(prompt_ids), generated=len(ids)),
        )


class Decoding(Echo):
    """Echo that commits each token to the grammar constraint as the runtime does, so the
    goal check asked when the steps open runs; a plan it cuts ends there with EOS."""

    def generate(
        self, prompt_ids, params, speculation=PLAIN, constraint=None, on_token=None, on_prefill=None
    ):
        text = self.texts[min(self.calls, len(self.texts) - 1)]
        self.calls += 1
        ids = []
        for t in self.tok.encode(text, add_special=False):
            if constraint.cut:
                break
            constraint.advance(t)
            ids.append(t)
        ids.append(self.tok.eos_token_ids[0])
        constraint.advance(ids[-1])
        return Result(
            ids,
            self.tok.decode(ids),
            "eos",
            len(prompt_ids),
            Stats(prompt_tokens=len(prompt_ids), generated=len(ids)),
        )
