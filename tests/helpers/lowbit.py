"""Low-bit models in the tests: int4 on the ORT kernels with the row kernel beside them, a drafter
with a short draft vocabulary, int4's stated tolerance against fp32, and the end of the context."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.exactness import PROMPT, assert_same, steps_vs_verify
from tests.helpers.tiny import random_drafter
from thor_runtime.speculative.draft_vocab import DraftVocab

# Stated tolerance for int4 (the file's Q4_1 scales, bf16 activations) against fp32 on the
# default model: max |logit difference| at most 5% of the largest |logit| (measured 2.8%; bf16
# weights 2.4%, int8 5.8%), and int4's greedy pick at every position is a token fp32 scores
# within REGRET logits of its own best (a flip only between near-ties, as bf16 weights flip too).
REL_TOL, REGRET = 0.05, 1.0


def int4_ort_model(tiny):
    from thor_runtime.engine.runner import attach
    from thor_runtime.loading.hf_weights import hf_weights
    from thor_runtime.models.dense import TargetModel

    weights = hf_weights(Path(tiny.source))
    return attach(TargetModel(tiny.cfg, weights, quant="int4", int4_kernel="ort"))


def with_rows(tiny):
    m = int4_ort_model(tiny)
    if m.runner.rows is None:
        pytest.skip(f"the row kernel does not run here: {m.runner.rows_why}")
    return m


def row_drafter(loaded, ids):
    d = random_drafter(loaded.cfg, block_size=5, num_taps=2, seed=3, std=0.2)
    d.draft_vocab = DraftVocab(tuple(ids), loaded.cfg.vocab_size)
    return d


def assert_end_of_context(m, tokenizer):
    """Steps at the model's last positions are a verify's rows; one token more is refused."""
    from thor_runtime.errors import ThorError

    n = m.cfg.max_position_embeddings
    ids = torch.tensor(tokenizer.encode(PROMPT) * n)[:n]
    steps, verify = steps_vs_verify(m, ids, n - 5, "fp32")
    assert_same(steps, verify)
    with pytest.raises(ThorError, match="exceeds the model context"):
        m.forward(ids[:1], steps[2])
    return ids
