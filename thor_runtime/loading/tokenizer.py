"""Tokenizer: text <-> ids, chat templates and stop ids, built from a GGUF or an HF directory.

The heavy lifting is done by the `tokenizers` library; this module only rebuilds the pipeline a
GGUF describes (vocab, merges, split regex, special tokens) and adds what generation needs on top:
the chat template, the set of ids that end a turn, and the raw bytes of every token.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _HFTok

from thor_runtime.errors import ThorError

# Split regexes, keyed by `tokenizer.ggml.pre`. BPE merges were learned on text cut into pieces by
# one specific regex; cutting differently gives valid but different ids than the model saw in
# training, so an unknown pre type is an error rather than a silent guess.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2 = "gpt2"  # ByteLevel's built-in regex is exactly GPT-2's
_SMOLLM = "smollm"  # llama.cpp: split every digit off first, then GPT-2's regex
# No "default": llama.cpp's fallback for a missing pre type is its own odd multi-regex, not GPT-2's.
_PRE_SPLITS = {
    "gpt2": _GPT2,
    "smollm": _SMOLLM,
    "starcoder": _SMOLLM,
    "refact": _SMOLLM,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# Llama 3's tokenizer.json sets ignore_merges (a piece that is already a whole token is taken as
# is); llama.cpp mirrors that for this pre type, so we do too.
_IGNORE_MERGES = {"llama-bpe", "llama3", "smaug-bpe"}

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token_type values
# Markers that close an assistant turn in common templates. Checked against the template text, so a
# model is only given the stop ids its own template actually writes.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")
# end-of-text markers a GGUF keeps only as control tokens: an HF export lists them in
# generation_config's eos_token_id (Qwen2.5-Instruct: <|im_end|> and <|endoftext|>), a GGUF
# names one eos, so without these a reply that ends in <|endoftext|> runs on past it
_END_OF_TEXT = ("<|endoftext|>", "<|end_of_text|>")


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable char table: printable Latin-1 bytes stand for themselves, the other
    68 (controls, space, ...) are shifted to U+0100.. so every byte is one visible char in vocab
    files."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, shift = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


_BYTE_TO_CHAR = _byte_alphabet()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}
# A piece's bytes through str.translate: each alphabet char to its byte, each other char below
# 256 to its UTF-8 bytes, all as latin-1 chars; a char past 255 outside the alphabet is left
# as it is and fails the latin-1 encode (the slow path then spells it)
_PIECE_TO_LATIN1 = {
    **{cp: chr(cp).encode("utf-8").decode("latin-1") for cp in range(256)},
    **{ord(c): chr(b) for c, b in _CHAR_TO_BYTE.items()},
}
_ALPHABET = frozenset(_CHAR_TO_BYTE)


def _byte_level_bytes(piece: str) -> bytes:
    """A byte-level piece's bytes: alphabet chars as their byte, any other char as UTF-8."""
    try:
        return piece.translate(_PIECE_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        return b"".join(
            bytes([_CHAR_TO_BYTE[c]]) if c in _CHAR_TO_BYTE else c.encode("utf-8") for c in piece
        )


def _tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False):
    # Jinja's own tojson HTML-escapes '<' and '&', which would corrupt tool schemas inside prompts.
    return json.dumps(
        value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii
    )


def _raise(message):
    raise ThorError(f"chat template refused the conversation: {message}")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ThorError(f"{path}: broken json ({e})") from None


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the chat template and special ids generation needs."""

    def __init__(
        self,
        tok: _HFTok,
        *,
        bos_token_id: int | None,
        eos_token_ids,
        add_bos: bool,
        chat_template: str | None,
        vocab_size: int,
        pieces: list[str] | None = None,
    ):
        self._tok = tok
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos
        self.vocab_size = vocab_size
        self.chat_template = chat_template
        self._pieces = pieces  # GGUF token strings, kept so duplicate entries keep their bytes
        self._compiled = None
        # Stop ids: the explicit ones first (order kept), then end-of-turn markers the template
        # writes.
        ids = [i for i in eos_token_ids if i is not None]
        for marker in _END_OF_TURN:
            mid = tok.token_to_id(marker)
            if chat_template and marker in chat_template and mid is not None:
                ids.append(mid)
        self.eos_token_ids = tuple(dict.fromkeys(int(i) for i in ids))
        if add_bos and bos_token_id is not None:
            # Done by the post-processor rather than by hand so encode_batch behaves the same.
            bos = tok.id_to_token(bos_token_id)
            tok.post_processor = processors.TemplateProcessing(
                single=[bos, "$A"], pair=[bos, "$A", "$B:1"], special_tokens=[(bos, bos_token_id)]
            )

    # -- text <-> ids --------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids, skip_special: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token_to_id(self, tok: str) -> int | None:
        return self._tok.token_to_id(tok)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))

    def token_bytes(self) -> list[bytes]:
        """Raw bytes of every id. A grammar engine matches bytes, and a single byte-level token may
        be half a UTF-8 character, which no str-based decode can represent."""
        added = {i for i in self._tok.get_added_tokens_decoder()}
        byte_level = isinstance(self._tok.decoder, decoders.ByteLevel)
        out = []
        for i in range(self.vocab_size):
            piece = self._pieces[i] if self._pieces is not None else self._tok.id_to_token(i)
            if piece is None:
                out.append(b"")
            elif i in added:  # added tokens are stored as literal text
                out.append(piece.encode("utf-8"))
            elif byte_level:
                out.append(_byte_level_bytes(piece))
            elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                out.append(bytes([int(piece[3:5], 16)]))  # sentencepiece byte-fallback token
            else:
                out.append(piece.replace("\u2581", " ").encode("utf-8"))
        return out

    # -- chat ----------------------------------------------------------------------------------
    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """Render like HF's apply_chat_template(tokenize=False): same Jinja options, same
        variables."""
        if not self.chat_template:
            raise ThorError("this model has no chat template; pass a raw prompt instead")
        if self._compiled is None:
            # Sandboxed because the template comes from the model file, i.e. from a stranger.
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
            )
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            try:
                self._compiled = env.from_string(self.chat_template)
            except jinja2.TemplateError as e:
                raise ThorError(f"chat template does not compile: {e}") from None
        names = {
            "bos_token": self.bos_token_id,
            "eos_token": self.eos_token_ids[0] if self.eos_token_ids else None,
        }
        specials = {k: self.id_to_token(v) if v is not None else "" for k, v in names.items()}
        try:
            return self._compiled.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **specials, **extra
            )
        except jinja2.TemplateError as e:
            raise ThorError(f"chat template failed: {e}") from None

    def encode_chat(self, messages, add_generation_prompt: bool = True, **extra) -> list[int]:
        ids = self.encode(
            self.render_chat(messages, add_generation_prompt, **extra), add_special=False
        )
        # Templates that want BOS write it themselves; add one only when the model wants it and the
        # template did not, so we never feed a double BOS.
        if self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_gguf_fields(cls, reader) -> "Tokenizer":
        def field(key, default=None):
            f = reader.fields.get(key)
            return default if f is None else f.contents()

        kind = field("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ThorError(
                f"unsupported tokenizer.ggml.model {kind!r} in GGUF (only byte-level BPE 'gpt2')"
            )
        pre = field("tokenizer.ggml.pre")
        if pre not in _PRE_SPLITS:
            raise ThorError(
                f"unsupported tokenizer.ggml.pre {pre!r} in GGUF "
                f"(supported: {', '.join(sorted(_PRE_SPLITS))})"
            )
        tokens, merges = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.merges")
        if not tokens or merges is None:
            raise ThorError("GGUF has no tokenizer.ggml.tokens / tokenizer.ggml.merges")
        types = field("tokenizer.ggml.token_type") or [1] * len(tokens)

        # Ordinary tokens must be spelled in the byte alphabet for merges to reach them; a few
        # converters write some in plain UTF-8, so respell those. Added tokens stay literal.
        vocab = {}
        for i, (t, ty) in enumerate(zip(tokens, types)):
            if ty not in (_CONTROL, _USER_DEFINED) and not _ALPHABET.issuperset(t):
                t = "".join(_BYTE_TO_CHAR[b] for b in t.encode("utf-8"))
            vocab[t] = i
        try:
            bpe = models.BPE(
                vocab=vocab,
                merges=[tuple(m.split(" ", 1)) for m in merges],
                ignore_merges=pre in _IGNORE_MERGES,
            )
        except Exception as e:  # tokenizers raises bare Exceptions for bad merges
            raise ThorError(f"GGUF tokenizer merges do not match its vocab: {e}") from None
        tok = _HFTok(bpe)
        split = _PRE_SPLITS[pre]
        if split == _GPT2:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        elif split == _SMOLLM:
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Digits(individual_digits=True),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                ]
            )
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(split), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        tok.decoder = decoders.ByteLevel()

        # Control tokens (<|im_start|>, ...) must match whole in text and vanish on skip_special
        # decode; user-defined ones (<think>) must match whole but are ordinary text on decode.
        tok.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types)
                if ty == _CONTROL
            ]
        )
        tok.add_tokens(
            [
                AddedToken(t, special=False, normalized=False)
                for t, ty in zip(tokens, types)
                if ty == _USER_DEFINED
            ]
        )

        # eos alone is not enough for ChatML: instruct models end a reply with <|im_end|>, while
        # many GGUFs (Qwen2, ...) set eos to <|endoftext|>; stopping on eos only would let the model
        # run on into an invented next turn. __init__ adds the markers the template uses.
        eos = [field(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
        eos += [
            i
            for i, (t, ty) in enumerate(zip(tokens, types))
            if ty == _CONTROL and t in _END_OF_TEXT
        ]
        return cls(
            tok,
            bos_token_id=field("tokenizer.ggml.bos_token_id"),
            eos_token_ids=eos,
            add_bos=bool(field("tokenizer.ggml.add_bos_token", False)),
            chat_template=field("tokenizer.chat_template"),
            vocab_size=len(tokens),
            pieces=list(tokens),
        )

    @classmethod
    def from_hf_dir(cls, path) -> "Tokenizer":
        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise ThorError(
                f"{path}: no tokenizer.json (only fast-tokenizer directories are supported)"
            )
        try:
            tok = _HFTok.from_file(str(tj))
        except Exception as e:
            raise ThorError(
                f"{tj}: cannot be loaded ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
            ) from None
        cfg = (
            _read_json(path / "tokenizer_config.json")
            if (path / "tokenizer_config.json").is_file()
            else {}
        )
        gen = (
            _read_json(path / "generation_config.json")
            if (path / "generation_config.json").is_file()
            else {}
        )

        def special_id(name):
            v = cfg.get(name)
            v = v.get("content") if isinstance(v, dict) else v
            return tok.token_to_id(v) if isinstance(v, str) else None

        # Older configs list added tokens only here; register those that already have their id.
        for sid, info in (cfg.get("added_tokens_decoder") or {}).items():
            if isinstance(info, dict) and tok.token_to_id(info.get("content", "")) == int(sid):
                at = AddedToken(
                    info["content"],
                    special=info.get("special", True),
                    normalized=info.get("normalized", False),
                    lstrip=info.get("lstrip", False),
                    rstrip=info.get("rstrip", False),
                )
                (tok.add_special_tokens if at.special else tok.add_tokens)([at])

        # chat_template.jinja is where current transformers saves it; older ones keep it in the
        # config, sometimes as a list of named templates.
        template = cfg.get("chat_template")
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        elif isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)

        bos = special_id("bos_token")
        gen_eos = gen.get("eos_token_id")
        gen_eos = gen_eos if isinstance(gen_eos, list) else [gen_eos]
        # tokenizer.json's post-processor already adds BOS where the model wants it (Llama 3 does);
        # an explicit add_bos_token in the config overrides it, as it does in transformers.
        probe = tok.encode("a", add_special_tokens=True).ids
        add_bos = cfg.get("add_bos_token", bos is not None and probe[:1] == [bos])
        if not add_bos and bos is not None and probe[:1] == [bos]:
            tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1")
        return cls(
            tok,
            bos_token_id=bos,
            eos_token_ids=[special_id("eos_token"), *gen_eos],
            add_bos=bool(add_bos) and bos is not None,
            chat_template=template,
            vocab_size=tok.get_vocab_size(with_added_tokens=True),
        )
