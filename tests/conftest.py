"""Session-scoped fixtures: each model is built or loaded once per test run."""

from __future__ import annotations

import pytest
import torch

# assert statements in the shared helpers report their values as the tests' own do
pytest.register_assert_rewrite("tests.helpers")

# One intra-op thread for the whole suite: the tiny models gain nothing from a second one,
# and on a busy 2-core box an oversubscribed OpenMP pool can slow a decode step 100x.
torch.set_num_threads(1)


def pytest_sessionstart(session):
    """THOR_EXPECT_CPU_CAPABILITY (the CI legs that run as another CPU would): the kernels ATen
    dispatches to must be that CPU's, or a leg meant to run as an AVX2-only CPU silently runs
    as this one (a misspelt or ignored ATEN_CPU_CAPABILITY only warns)."""
    import os

    want = os.environ.get("THOR_EXPECT_CPU_CAPABILITY")
    if want is None:
        return
    got = torch.backends.cpu.get_cpu_capability()
    if got.upper() != want.strip().upper():
        pytest.exit(
            f"THOR_EXPECT_CPU_CAPABILITY={want} but torch.backends.cpu.get_cpu_capability() "
            f"is {got} "
            f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '<unset>')})",
            returncode=1,
        )


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """{"llama": Path, "qwen3": Path} of random-weight HF checkpoints."""
    from tests.helpers.tiny import make_tiny_dir

    root = tmp_path_factory.mktemp("tiny")
    return {
        arch: make_tiny_dir(root / arch, arch, seed=i) for i, arch in enumerate(("llama", "qwen3"))
    }


@pytest.fixture(scope="session")
def tiny_llama(tiny_dirs):
    from thor_runtime.loading import load

    return load(str(tiny_dirs["llama"]))


@pytest.fixture(scope="session")
def tiny_llama_long(tiny_dirs, tmp_path_factory):
    """The tiny llama with a 4k context (a sample world's plan prompt fits)."""
    from tests.helpers.serving import long_context_copy
    from thor_runtime.loading import load

    return load(
        str(long_context_copy(tiny_dirs["llama"], tmp_path_factory.mktemp("tiny_long") / "llama"))
    )


@pytest.fixture(scope="session")
def tiny_qwen3(tiny_dirs):
    from thor_runtime.loading import load

    return load(str(tiny_dirs["qwen3"]))


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory):
    from tests.helpers.tiny import make_tiny_dir

    return make_tiny_dir(tmp_path_factory.mktemp("tiny") / "qwen2", "qwen2", seed=2)


@pytest.fixture(scope="session")
def tiny_qwen2(tiny_qwen2_dir):
    from thor_runtime.loading import load

    return load(str(tiny_qwen2_dir))


@pytest.fixture(scope="session")
def tiny_hybrid_dirs(tmp_path_factory):
    """{"qwen3_5": Path, "qwen3_next": Path} of random-weight hybrid (Gated-DeltaNet)
    checkpoints."""
    from tests.helpers.tiny_hybrid import make_hybrid_dir

    root = tmp_path_factory.mktemp("tiny_hybrid")
    return {
        a: make_hybrid_dir(root / a, a, seed=i) for i, a in enumerate(("qwen3_5", "qwen3_next"))
    }


@pytest.fixture(scope="session")
def tiny_qwen3_5(tiny_hybrid_dirs):
    from thor_runtime.loading import load

    return load(str(tiny_hybrid_dirs["qwen3_5"]))


@pytest.fixture(scope="session")
def tiny_qwen3_next(tiny_hybrid_dirs):
    from thor_runtime.loading import load

    return load(str(tiny_hybrid_dirs["qwen3_next"]))


@pytest.fixture(scope="session")
def default_model():
    """The embedded SmolLM2-135M-Instruct (fp32)."""
    from thor_runtime.loading import load

    return load("default")


@pytest.fixture(scope="session", autouse=True)
def _weight_cache_dir(tmp_path_factory):
    """Low-bit loads in tests write their weight cache under the test run, not the user's cache."""
    import os

    old = os.environ.get("THOR_CACHE_DIR")
    os.environ["THOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("weight-cache"))
    yield
    if old is None:
        os.environ.pop("THOR_CACHE_DIR", None)
    else:
        os.environ["THOR_CACHE_DIR"] = old


# the tiny model's tokenizer and its grammar view (grammar and relaxed-span tests)
@pytest.fixture(scope="module")
def tok(tiny_llama):
    return tiny_llama.tokenizer


@pytest.fixture(scope="module")
def gtok(tok):
    from agent.schema.grammar import GrammarTokenizer

    return GrammarTokenizer(tok)
