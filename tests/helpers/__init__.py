"""What the tests share: tiny checkpoints (tiny, tiny_hybrid, gguf_writer), stand-in runtimes
and proposers, the sample worlds and plans, the task's reading on the evaluation sets, exactness
and low-bit comparisons, transformers as the oracle, the service's harness (serving), hypothesis
strategies, and the C checks of the row kernel (csrc/). Tests import from here (``from
tests.helpers.tiny import ...``), never from one another."""
