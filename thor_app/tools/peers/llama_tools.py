"""llama.cpp answering the function-calling leaderboard's entries, for `thor bench --tools`:
python -m thor_app.tools.peers.llama_tools SPEC.json OUT.json, in the peers' venv.

Like worker.py this imports nothing of ours: the peers' venv has llama_cpp and no torch.
SPEC: {"model": GGUF path, "threads", "max_tokens", "llama_extra_buffers",
"entries": [{"key", "mode", "ids": prompt token ids, "tools": OpenAI tools}]}.
OUT: {"version", "load_s", "answers": [{"key", "text", "latency_s", "completion_tokens"}]}.

Two modes, on the prompt thor's service renders for the same request (token for token):

- ``plain``: greedy decoding, no grammar.
- ``grammar``: llama.cpp's own way for a Hermes-format model such as Qwen2.5 (llama-server's
  lazy grammar): the model writes freely until it opens a call with ``<tool_call>``; from there
  the call is decoded under a grammar that llama.cpp builds from the tools' JSON schemas
  (``json_schema_to_gbnf``), one or more tagged calls, then the end.

Scoring happens in the caller, on the text, as it reads thor's ``plain`` answers.
"""

from __future__ import annotations

import json
import sys
import time

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def call_grammar(tools: list[dict]) -> str:
    """GBNF for what follows ``<tool_call>``: a call to one of the tools, closed, and more calls
    the same way; the calls' JSON is llama.cpp's grammar of their schemas."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    schema = {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t["function"]["name"]},
                    "arguments": t["function"].get("parameters") or {"type": "object"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }
    gbnf = json_schema_to_gbnf(json.dumps(schema), prop_order=["name", "arguments"])
    # the converter's start rule becomes one call; the start here wraps calls in their tags
    rules = [
        ("call ::=" + line[len("root ::=") :]) if line.startswith("root ::=") else line
        for line in gbnf.splitlines()
    ]
    head = f'root ::= "\\n" call "\\n{CLOSE}" ("\\n{OPEN}\\n" call "\\n{CLOSE}")*'
    return "\n".join([head, *rules])


def answer(llm, ids: list[int], mode: str, max_tokens: int, grammar, ends) -> dict:
    """One greedy answer -> {"text", "completion_tokens", "latency_s"}. ``grammar()`` makes the
    calls' grammar (only when the model opens a call); ``ends(tok)``: the token ends the turn."""
    t0 = time.perf_counter()
    out: list[int] = []
    text = ""
    for tok in llm.generate(ids, top_k=1, temp=0.0, reset=True):
        if ends(tok):
            break
        out.append(tok)
        text = llm.detokenize(out, special=True).decode("utf-8", "replace")
        if len(out) >= max_tokens or (mode == "grammar" and text.endswith(OPEN)):
            break
    if mode == "grammar" and text.endswith(OPEN) and len(out) < max_tokens:
        # the prompt and the free part are in the cache: generate() decodes only what is new
        for tok in llm.generate(ids + out, top_k=1, temp=0.0, grammar=grammar(), reset=True):
            if ends(tok):
                break
            out.append(tok)
            if len(out) >= max_tokens:
                break
        text = llm.detokenize(out, special=True).decode("utf-8", "replace")
    return {
        "text": text,
        "completion_tokens": len(out),
        "latency_s": time.perf_counter() - t0,
    }


def run(spec: dict) -> dict:
    import llama_cpp
    from llama_cpp import LlamaGrammar

    from thor_app.tools.peers.worker import load_llama

    longest = max(len(e["ids"]) for e in spec["entries"])
    llm, out = load_llama(spec, n_ctx=max(2048, longest + spec["max_tokens"] + 16))
    vocab = llama_cpp.llama_model_get_vocab(llm.model)

    def ends(tok: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(vocab, tok))

    # a first answer, untimed, as thor's service warms up before its first request
    answer(llm, spec["entries"][0]["ids"], "plain", 8, None, ends)
    answers = []
    for i, e in enumerate(spec["entries"]):
        a = answer(
            llm,
            e["ids"],
            e["mode"],
            spec["max_tokens"],
            lambda: LlamaGrammar.from_string(call_grammar(e["tools"]), verbose=False),
            ends,
        )
        answers.append({"key": e["key"], **a})
        if (i + 1) % 10 == 0:
            print(f"llama.cpp: {i + 1}/{len(spec['entries'])}", file=sys.stderr, flush=True)
    out["answers"] = answers
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(open(argv[0], encoding="utf-8").read())
    with open(argv[1], "w", encoding="utf-8") as f:
        json.dump(run(spec), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
