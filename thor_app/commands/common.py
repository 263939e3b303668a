"""Argument types shared by the commands. The runtime's own flags come from the config table
(thor_app/flags.py); the runtime is built by thor_app/assembly.py."""

from __future__ import annotations

import argparse


def _int_at_least(low: int, what: str):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
        return v

    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")


def add_engine_build_args(p: argparse.ArgumentParser) -> None:
    """For commands that build engines for a runtime without running a generation (engines
    build, selftest): the model, the backend, and the runtime the engines will serve — its
    prefill chunk and speculation set TensorRT's optimization profiles. The defaults are the
    config table's, which `thor serve` loads, so the service finds the engines built here."""
    from thor_app.flags import add_config_args

    # The graph backends export float weights; fp32 is the reference the self-test compares to.
    add_config_args(
        p,
        ("model",),
        defaults={"model.dtype": "fp32"},
        only={"model.name", "model.dtype", "model.device", "model.prefill_chunk"},
    )
    add_config_args(
        p,
        ("engine", "speculation"),
        titles={"speculation": "the runtime's speculation (K + 1 is TensorRT's verify profile)"},
    )
