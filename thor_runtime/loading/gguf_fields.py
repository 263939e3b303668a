"""Reading one GGUF metadata field: shared by the dense and the hybrid GGUF loaders."""

from __future__ import annotations


def field_value(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()
