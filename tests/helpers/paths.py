"""Where things are, whatever folder a test sits in: the repository's root, the C checks."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CSRC = Path(__file__).resolve().with_name("csrc")  # the C checks of the row kernel
