"""Tokenizer vs. transformers (test-only oracle) on the default SmolLM2 GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import transformers  # the test-only oracle (in requirements.lock)
from tokenizers import pre_tokenizers  # noqa: E402

from thor_runtime.errors import ThorError
from thor_runtime.loading import default_model_path
from thor_runtime.loading.tokenizer import Tokenizer

# Strings where every tokenizer below must agree with transformers' GGUF loader.
TEXTS = [
    "",
    "hello",
    "Hello, world!",
    " leading space",
    "trailing space ",
    "a    b",
    "tabs\tand\t\ttabs",
    "line1\nline2",
    "para\n\n\nnext",
    "\r\n windows \r\n",
    "   ",
    "\n",
    "digits 0 7 42 1234567890",
    "3.14159 and 2e10",
    "v1.2.3-rc4",
    "x=12+34*(56/78)",
    "naïve café résumé",
    "日本語のテキスト",
    "Привет, мир",
    "emoji 🤖🚀 mix",
    "Ελληνικά",
    "١٢٣ arabic digits",
    "def f(x):\n    return x ** 2  # square\n",
    '{"action": "move", "speed": 0.5}',
    "<html><b>bold</b></html>",
    "I'm sure they'll've done it, it's John's",
    "ALLCAPS and MiXeD",
    "<|im_start|>user\nhi<|im_end|>\n",
    "text<|im_end|>",
    "<|endoftext|><|im_start|>",
    "<repo_name>thor<file_sep>",
    "a<|im_start|>b",
]
# Whitespace runs right before a digit: llama.cpp's "smollm" pre-tokenizer (and SmolLM2's own
# tokenizer.json) split digits off first, so "  1" is [ĠĠ, 1]; transformers' GGUF loader does not
# know "smollm" and falls back to GPT-2's regex, giving [Ġ, Ġ, 1]. We follow the model's real
# tokenizer.
DIGIT_AFTER_SPACES = ["  1", "x  42", "a\n\n1", "price:   100", "\t\t9"]

CONVERSATIONS = {
    "system+user": [
        {"role": "system", "content": "You are a robot planner."},
        {"role": "user", "content": "Pick up the red cube."},
    ],
    "user-only": [{"role": "user", "content": "What is 2+2?"}],
    "multi-turn": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "bye"},
    ],
}


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def reader(gguf_path):
    return gguf.GGUFReader(gguf_path)


@pytest.fixture(scope="session")
def tok(reader) -> Tokenizer:
    return Tokenizer.from_gguf_fields(reader)


@pytest.fixture(scope="session")
def oracle(gguf_path):
    return transformers.AutoTokenizer.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name
    )


@pytest.fixture(scope="session")
def smollm_oracle(oracle):
    """transformers' vocab + merges with SmolLM2's published pre-tokenizer (digits split first)."""
    from tokenizers import Tokenizer as HFTok

    backend = HFTok.from_str(oracle.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return backend


def _ids(oracle, text):
    return oracle(text, add_special_tokens=True)["input_ids"]


def test_metadata(tok, oracle):
    assert tok.vocab_size == len(oracle) == 49152
    assert tok.bos_token_id == 1 and tok.add_bos is False
    # eos is <|im_end|> (id 2) in this file already; no duplicates when the template adds it again;
    # the control token <|endoftext|> (id 0) ends a reply too, as it does in llama.cpp
    assert tok.eos_token_ids == (2, 0)
    assert tok.token_to_id("<|im_start|>") == 1 and tok.id_to_token(2) == "<|im_end|>"
    assert tok.token_to_id("definitely-not-a-token") is None


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tok, oracle, text):
    assert tok.encode(text) == _ids(oracle, text)
    assert (
        tok.encode(text, add_special=False) == oracle(text, add_special_tokens=False)["input_ids"]
    )


@pytest.mark.parametrize("text", TEXTS + DIGIT_AFTER_SPACES)
def test_encode_matches_smollm_pretokenizer(tok, smollm_oracle, text):
    assert tok.encode(text) == smollm_oracle.encode(text).ids


def test_digit_after_spaces_follows_llama_cpp(tok):
    assert tok.encode("  1") == [tok.token_to_id("ĠĠ"), tok.token_to_id("1")]


def test_special_tokens_are_single_ids(tok):
    assert tok.encode("<|im_start|>user<|im_end|>") == [1, tok.encode("user")[0], 2]


@pytest.mark.parametrize("text", [t for t in TEXTS if "<|" not in t and "<repo" not in t])
def test_decode_round_trip(tok, oracle, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids) == oracle.decode(ids, skip_special_tokens=True)


def test_decode_skips_special(tok):
    ids = tok.encode("<|im_start|>hi<|im_end|>")
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special=False) == "<|im_start|>hi<|im_end|>"


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("gen", [True, False])
def test_render_chat_matches_transformers(tok, oracle, name, gen):
    msgs = CONVERSATIONS[name]
    want = oracle.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    assert tok.render_chat(msgs, add_generation_prompt=gen) == want
    assert (
        tok.encode_chat(msgs, add_generation_prompt=gen)
        == oracle(want, add_special_tokens=False)["input_ids"]
    )


def test_token_bytes(tok):
    tb = tok.token_bytes()
    assert len(tb) == tok.vocab_size
    assert tb[tok.token_to_id("Ġthe")] == b" the"
    assert tb[tok.token_to_id("Ċ")] == b"\n"
    assert tb[1] == b"<|im_start|>"
    # concatenated token bytes reproduce the UTF-8 text, even where a token is half a character
    for text in ["日本語のテキスト", "emoji 🤖🚀 mix", "naïve\n\tcafé  42"]:
        assert b"".join(tb[i] for i in tok.encode(text)) == text.encode("utf-8")


def test_byte_level_pieces_spelled_as_char_by_char():
    """The translate-table spelling of a byte-level piece is the per-char one: alphabet chars
    as their byte, every other char as its UTF-8 (below 256 through the table, past it through
    the fallback)."""
    from thor_runtime.loading.tokenizer import _BYTE_TO_CHAR, _CHAR_TO_BYTE, _byte_level_bytes

    def by_char(piece):
        return b"".join(
            bytes([_CHAR_TO_BYTE[c]]) if c in _CHAR_TO_BYTE else c.encode("utf-8") for c in piece
        )

    outside = [chr(cp) for cp in range(0x250) if chr(cp) not in _CHAR_TO_BYTE]
    assert any(ord(c) < 256 for c in outside) and any(ord(c) > 255 for c in outside)
    pieces = [
        "".join(_BYTE_TO_CHAR.values()),
        "".join(outside),
        "\u0120the\u00a0caf\u00e9",
        "\u65e5\u672c",
        "\U0001f916x",
        "",
    ] + [_BYTE_TO_CHAR[b] + c for b in (0, 65, 255) for c in outside]
    for p in pieces:
        assert _byte_level_bytes(p) == by_char(p), p


def _write_tokenizer_gguf(path: Path, src, *, model="gpt2", pre="smollm", add_bos=False, bos=1):
    """A tokenizer-only GGUF: the default model's vocab under another tokenizer model / pre type."""

    def c(k):
        return src.fields[k].contents()

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(c("tokenizer.ggml.tokens"))
    w.add_token_types(c("tokenizer.ggml.token_type"))
    w.add_token_merges(c("tokenizer.ggml.merges"))
    w.add_bos_token_id(bos)
    w.add_eos_token_id(0)  # <|endoftext|>, like Qwen2's GGUFs
    w.add_add_bos_token(add_bos)
    w.add_chat_template(c("tokenizer.chat_template"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_other_pre_types_match_transformers(tmp_path, reader, pre):
    path = _write_tokenizer_gguf(tmp_path / f"{pre}.gguf", reader, pre=pre, add_bos=True, bos=0)
    ours = Tokenizer.from_gguf_fields(gguf.GGUFReader(path))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in TEXTS + DIGIT_AFTER_SPACES:
        assert ours.encode(text) == _ids(theirs, text), (pre, text)
    assert ours.encode("hi")[0] == 0  # add_bos honoured
    # eos is <|endoftext|> here; <|im_end|> is still a stop id because the ChatML template writes it
    assert ours.eos_token_ids == (0, 2)
    assert ours.encode_chat(CONVERSATIONS["user-only"])[:3] == [
        0,
        1,
        ours.encode("system", False)[0],
    ]


def test_encode_chat_never_doubles_bos(tmp_path, reader):
    # bos is <|im_start|> here, which the template already writes first: no second one is added
    path = _write_tokenizer_gguf(tmp_path / "bos.gguf", reader, add_bos=True, bos=1)
    ids = Tokenizer.from_gguf_fields(gguf.GGUFReader(path)).encode_chat(CONVERSATIONS["user-only"])
    assert ids[0] == 1 and ids[1] != 1


def _tiny_gguf(path: Path, model: str, pre: str) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tiny_gguf_builds(tmp_path):
    t = Tokenizer.from_gguf_fields(
        gguf.GGUFReader(_tiny_gguf(tmp_path / "ok.gguf", "gpt2", "gpt2"))
    )
    assert t.encode("abba") == [2, 1, 0] and t.eos_token_ids == () and t.bos_token_id is None


def test_unknown_tokenizer_model_is_a_clear_error(tmp_path):
    path = _tiny_gguf(tmp_path / "bad.gguf", "unknown", "gpt2")
    with pytest.raises(ThorError, match="unsupported tokenizer.ggml.model 'unknown'"):
        Tokenizer.from_gguf_fields(gguf.GGUFReader(path))


def test_unknown_pre_type_is_a_clear_error(tmp_path):
    path = _tiny_gguf(tmp_path / "bad.gguf", "gpt2", "mystery")
    with pytest.raises(ThorError, match="unsupported tokenizer.ggml.pre 'mystery'"):
        Tokenizer.from_gguf_fields(gguf.GGUFReader(path))


def test_template_errors_are_thor_errors(tok):
    bad = Tokenizer.__new__(Tokenizer)
    bad.__dict__.update(
        tok.__dict__, chat_template="{{ raise_exception('no tools here') }}", _compiled=None
    )
    with pytest.raises(ThorError, match="no tools here"):
        bad.render_chat([{"role": "user", "content": "x"}])


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory, oracle):
    d = tmp_path_factory.mktemp("hf_tok")
    oracle.save_pretrained(str(d))
    return d


def test_from_hf_dir_matches(hf_dir, oracle, tok):
    hf = Tokenizer.from_hf_dir(hf_dir)
    assert hf.vocab_size == tok.vocab_size
    assert hf.eos_token_ids == (2,) and hf.bos_token_id == 1 and hf.add_bos is False
    for text in TEXTS:
        assert hf.encode(text) == _ids(oracle, text), text
    msgs = CONVERSATIONS["system+user"]
    assert hf.render_chat(msgs) == oracle.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )
    assert hf.token_bytes() == tok.token_bytes()


def test_from_hf_dir_generation_config_eos(tmp_path, hf_dir):
    for f in hf_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert Tokenizer.from_hf_dir(tmp_path).eos_token_ids == (2, 0)


def test_from_hf_dir_errors(tmp_path, hf_dir):
    with pytest.raises(ThorError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ThorError, match="broken json"):
        Tokenizer.from_hf_dir(tmp_path)
