"""`thor generate PROMPT` — stream a completion, or print one JSON object with --json."""

from __future__ import annotations

import json
import sys

from thor_app.assembly import build_runtime
from thor_app.commands.common import positive_int
from thor_app.flags import add_config_args, config_from_args


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt")
    p.add_argument("prompt")
    p.add_argument(
        "--chat", action="store_true", help="wrap the prompt as a user turn in the chat template"
    )
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    # Plain decoding unless asked: generate is where plain speed is measured and compared.
    add_config_args(
        p, ("model", "engine", "speculation", "sampling"), defaults={"speculation.method": "none"}
    )
    p.set_defaults(func=run)


def encode_prompt(tokenizer, prompt: str, chat: bool, system: str | None = None) -> list[int]:
    if chat:
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        return tokenizer.encode_chat(msgs)
    return tokenizer.encode(prompt)


class _Streamer:
    """Prints text as tokens commit; decodes the whole output so multi-byte chars come out whole."""

    def __init__(self, tokenizer):
        self.tok, self.ids, self.shown = tokenizer, [], 0

    def __call__(self, t: int) -> None:
        self.ids.append(t)
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):
            return  # half a UTF-8 character: wait for the rest
        sys.stdout.write(text[self.shown :])
        sys.stdout.flush()
        self.shown = len(text)


def run(args) -> int:
    from thor_runtime.engine import SamplingParams

    config = config_from_args(args)
    s = config.sampling
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        seed=s.seed,
        stop=tuple(args.stop),
    )
    a = build_runtime(
        config, plans=False
    )  # free text: a planner drafter's plan format does not matter
    loaded, rt, spec = a.loaded, a.runtime, a.speculation
    ids = encode_prompt(loaded.tokenizer, args.prompt, args.chat, args.system)
    streamer = None if args.json or params.stop else _Streamer(loaded.tokenizer)
    res = rt.generate(ids, params, spec, on_token=streamer)
    if args.json:
        print(
            json.dumps(
                {
                    "text": res.text,
                    "token_ids": res.token_ids,
                    "prompt_tokens": res.prompt_tokens,
                    "finish_reason": res.finish_reason,
                    "spec": config.speculation.method,
                    "stats": res.stats.to_dict(),
                }
            )
        )
    else:
        if streamer is None:
            sys.stdout.write(res.text)
        sys.stdout.write("\n")
        s = res.stats.to_dict()
        print(
            f"[{s['prompt_tokens']} prompt tokens, {s['generated_tokens']} generated, "
            f"ttft {s['ttft_s']:.3f}s, "
            f"decode {s['decode_tok_s']} tok/s, finish={res.finish_reason}]",
            file=sys.stderr,
        )
    return 0
