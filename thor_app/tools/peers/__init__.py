"""Peers benchmark: llama.cpp, transformers and thor side by side on the same GGUF and prompts.

``driver`` runs every peer configuration in its own process (clean load time and peak RSS)
and interleaves the repeats; ``worker`` is what each process runs. Requests (prompt token ids,
the plan requests' specialized JSON schemas) are made once by the driver with our tokenizer,
so every engine decodes the very same tokens.
"""
