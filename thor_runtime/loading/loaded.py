"""What a loader returns, and a GGUF's config and tokenizer: shared by the loaders and the
weight cache, apart from the package so the weight cache does not import its own importer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from thor_runtime.models.config import ModelConfig


@dataclass
class Loaded:
    model: object  # TargetModel or HybridModel (thor_runtime.models.target.Target)
    tokenizer: "object"  # thor_runtime.loading.tokenizer.Tokenizer
    cfg: ModelConfig
    source: str


def gguf_config_and_tokenizer(p: Path):
    """-> (reader, ModelConfig, Tokenizer) of a GGUF file."""
    from thor_runtime.loading.gguf_weights import gguf_config, open_reader
    from thor_runtime.loading.tokenizer import Tokenizer

    reader = open_reader(p)
    return reader, gguf_config(reader, p), Tokenizer.from_gguf_fields(reader)
