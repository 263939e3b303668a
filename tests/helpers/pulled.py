"""Models pulled from the catalog: a test that needs one skips, saying how to pull it."""

from __future__ import annotations

import pytest

QWEN_05B = "qwen2.5-coder-0.5b-instruct"


def pulled_or_skip(name: str):
    from thor_runtime.catalog import CATALOG, is_pulled, models_dir

    if not is_pulled(CATALOG[name], models_dir()):
        mb = CATALOG[name].size // 10**6
        pytest.skip(f"{name} is not pulled (thor models pull {name}; ~{mb} MB)")
