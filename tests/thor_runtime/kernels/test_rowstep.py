"""The row kernel (thor_runtime/kernels/rowstep.py, csrc/rowstep.c): decode steps and verifies of
MatMulNBits models, each row on its own. Its math is the step graph's to int8-activation
rounding, its verify rows are 1-row steps bit for bit, speculation is plain decoding, and the
compiled library is loaded only when its hash is the manifest's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.exactness import PROMPT, assert_same, steps_vs_verify
from tests.helpers.lowbit import int4_ort_model, with_rows
from tests.helpers.paths import CSRC, ROOT
from tests.helpers.tiny import random_drafter
from thor_runtime.cache.kv_cache import KVCache
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.kernels.lowbit_kernels import int4_kernels
from thor_runtime.kernels.rowstep import build_library
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.dflash import DFlashProposer
from thor_runtime.speculative.ngram import NgramProposer

pytestmark = pytest.mark.skipif(
    not int4_kernels()["ort"].available(), reason="onnxruntime (the onnx extra) is not installed"
)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rows_are_the_step_graph_math(arch, request):
    """Logits, taps and cached K/V of a verify on the row kernel against the same verify on
    ONNX Runtime's step graph: equal up to the int8 rounding of activations."""
    tiny = request.getfixturevalue(f"tiny_{arch}")
    m = with_rows(tiny)
    ids = torch.tensor(tiny.tokenizer.encode(PROMPT))[:24]
    outs, kernel = [], m.runner.rows
    m.runner.prefill_on_rows = False  # both prompts on the graph
    for rows in (kernel, None):
        m.runner.rows = rows
        cache = KVCache(m.cfg, len(ids) + 2, "fp32", m.dtype)
        m.prefill(ids[:8], cache)
        outs.append((m.verify(ids[8:], cache, taps=(0, 1)), cache))
    (a, ca), (b, cb) = outs
    n = len(ids)
    # both round activations to int8 per block of 32, an element's code may differ by one: on
    # random tiny weights ~0.3% on the first layer's K, ~2% after three layers
    assert (a.logits - b.logits).abs().max() <= 2e-2 * b.logits.abs().max()
    assert (a.logits.argmax(-1) == b.logits.argmax(-1)).float().mean() >= 0.9
    for i in (0, 1):
        assert (a.taps[i] - b.taps[i]).abs().max() <= 3e-2 * b.taps[i].abs().max()
    assert torch.equal(ca.k[:, :, :8], cb.k[:, :, :8])  # the prompt: the graph's, both
    assert (ca.k[0, :, :n] - cb.k[0, :, :n]).abs().max() <= 1e-2 * cb.k[0, :, :n].abs().max()
    for t in (ca.k, ca.v):
        ref = cb.k if t is ca.k else cb.v
        assert (t[:, :, :n] - ref[:, :, :n]).abs().max() <= 5e-2 * ref[:, :, :n].abs().max()
    assert not torch.equal(ca.k[:, :, 8:n], cb.k[:, :, 8:n])  # the rows really ran elsewhere


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_verify_rows_are_one_row_steps(arch, request):
    """21 rows (two calls of at most 16), and 7 and 6, against as many steps: logits, taps and
    K/V bit for bit, whatever tiles the kernel cuts the rows into (narrow, wide, both)."""
    tiny = request.getfixturevalue(f"tiny_{arch}")
    m = with_rows(tiny)
    ids = torch.tensor(tiny.tokenizer.encode(PROMPT))[:30]
    for start in (9, 23, 24):
        assert_same(*steps_vs_verify(m, ids, start, "fp32", taps=(0, 2)))


@pytest.fixture(scope="module")
def tiny_gqa7(tmp_path_factory):
    """A qwen2 with the planner model's attention shape (Qwen2.5-0.5B): 14 query heads on 2 KV
    heads, 7 to a group, head_dim 64."""
    from tests.helpers import tiny
    from thor_runtime.loading import load

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(
            tiny.ARCH_CONFIGS,
            "qwen2_gqa7",
            dict(
                tiny.ARCH_CONFIGS["qwen2"],
                num_hidden_layers=2,
                num_attention_heads=14,
                num_key_value_heads=2,
                head_dim=64,
            ),
        )
        path = tiny.make_tiny_dir(tmp_path_factory.mktemp("tiny") / "gqa7", "qwen2_gqa7", seed=3)
    return load(str(path))


def test_grouped_attention_rows_are_one_row_steps(tiny_gqa7):
    """The kernel's attention runs a (row, KV head) at a time, its 7 query heads together on
    each block of keys: each head's scores, softmax and weighed values must stay the operations
    of that head alone. 16 verify rows at 78..93 keys (blocks of 16 and 8 keys, every remainder
    of 16) against 16 one-row steps, on 1 thread and on 2: logits, taps and K/V bit for bit."""
    from thor_runtime.kernels.rowstep import RowStep, kernel_dir

    m = with_rows(tiny_gqa7)
    assert (m.cfg.num_heads, m.cfg.num_kv_heads, m.cfg.head_dim) == (14, 2, 64)
    ids = (torch.arange(93) * 7919 + 13) % m.cfg.vocab_size
    one = steps_vs_verify(m, ids, 77, "fp32", taps=(0, 1))
    assert_same(*one)
    kernel = m.runner.rows
    try:
        m.runner.rows = RowStep(m, build_library(kernel_dir())[0], threads=2)
        two = steps_vs_verify(m, ids, 77, "fp32", taps=(0, 1))
    finally:
        m.runner.rows = kernel
    assert_same(*two)
    assert_same(one[0], two[0])


def test_speculation_on_rows_is_plain_decoding(tiny_llama):
    m = with_rows(tiny_llama)
    rt = Runtime(m, tiny_llama.tokenizer, kv_dtype="fp32")
    ids = tiny_llama.tokenizer.encode(PROMPT)[:20]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    plain = rt.generate(ids, params, Speculation())
    drafter = DFlashProposer(random_drafter(m.cfg, num_layers=1, seed=0), m, window=16)
    for spec in (Speculation(drafter, 7), Speculation(NgramProposer(), 8)):
        assert rt.generate(ids, params, spec).token_ids == plain.token_ids


def test_last_position_and_other_caches_fall_back(tiny_llama):
    """The last position of the context runs on the rows; one more is refused; an fp8 cache
    (not the kernel's) runs the layer path, exact there too."""
    from tests.helpers.lowbit import assert_end_of_context

    m = with_rows(tiny_llama)
    ids = assert_end_of_context(m, tiny_llama.tokenizer)
    assert not m.runner.rows.fits(KVCache(m.cfg, 8, "fp8", m.dtype), 1)
    assert_same(*steps_vs_verify(m, ids[:30], 9, "fp8"))


def test_models_the_kernel_does_not_take(tiny_qwen3):
    m = int4_ort_model(tiny_qwen3)
    assert m.runner.rows is None and "q/k norms" in m.runner.rows_why


def test_library_is_loaded_only_with_its_manifest_hash(tmp_path):
    import hashlib

    lib, why = build_library(tmp_path)
    assert lib is not None, why
    manifest, size = lib.with_suffix(".json"), lib.stat().st_size
    assert build_library(tmp_path) == (lib, "")  # a hit
    lib.write_bytes(lib.read_bytes() + b"tampered")  # not the manifest's hash: rebuilt
    assert build_library(tmp_path) == (lib, "")
    assert lib.stat().st_size == size
    assert (
        json.loads(manifest.read_text())["sha256"] == hashlib.sha256(lib.read_bytes()).hexdigest()
    )
    manifest.unlink()  # no manifest: rebuilt too
    assert build_library(tmp_path) == (lib, "") and manifest.exists()


def test_no_compiler_runs_the_step_graph(tiny_llama, monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("THOR_CACHE_DIR", str(tmp_path / "cache"))
    m = int4_ort_model(tiny_llama)
    assert (
        m.runner.rows is None
        and "no-such-cc" in m.runner.rows_why
        and m.decode_kernel == "ort-step-graph"
    )
    ids = torch.tensor(tiny_llama.tokenizer.encode(PROMPT))[:20]
    assert_same(*steps_vs_verify(m, ids, 9, "fp32"))


@pytest.mark.slow
def test_default_model_runs_on_rows(default_model, tmp_path_factory):
    """The default model's steps run on the row kernel, within the int4 tolerance of fp32."""
    from tests.helpers.lowbit import REGRET, REL_TOL
    from thor_runtime.loading import load

    m = load(
        "default", "int4", cache_dir=str(tmp_path_factory.mktemp("wcache")), int4_kernel="ort"
    ).model
    assert m.runner.rows is not None, m.runner.rows_why
    assert m.decode_kernel == "rowstep"
    ids = torch.tensor(default_model.tokenizer.encode(PROMPT))
    cache = KVCache(m.cfg, len(ids) + 1, "fp32", m.dtype)
    m.prefill(ids[:4], cache)
    a = m.verify(ids[4:], cache).logits
    b = default_model.model.forward(
        ids, KVCache(m.cfg, len(ids) + 1, "fp32", torch.float32)
    ).logits[4:]
    assert (a - b).abs().max() <= REL_TOL * b.abs().max()
    picked = b.gather(-1, a.argmax(-1, keepdim=True))[:, 0]
    assert (b.amax(-1) - picked).max() <= REGRET


CHECK = CSRC / "rowstep_check.c"
# (name, compiler, flags, runner): the kernel's code paths for the CPUs it is built on
BUILDS = [
    ("native", "cc", ["-march=native"], []),
    ("x86-avx2", "cc", ["-march=haswell"], []),  # AVX2 without VNNI: maddubs paths
    ("portable", "cc", ["-march=x86-64"], []),  # no vector extension: the C loops
    (
        "aarch64-dotprod",
        "aarch64-linux-gnu-gcc",
        ["-march=armv8.2-a+dotprod", "-static"],
        ["qemu-aarch64", "-cpu", "max"],
    ),
    ("aarch64", "aarch64-linux-gnu-gcc", ["-march=armv8-a", "-static"], ["qemu-aarch64"]),
]


def _run_check(tmp_path, name, cc, flags, runner, source: Path = CHECK):
    """Compile ``source`` (a check that includes the kernel's C) for one of BUILDS and run it:
    exit 0, or the assertion shows what it wrote to stderr. -> the numbers it printed."""
    import platform
    import shutil
    import subprocess

    if name.startswith("x86") or name == "portable":
        if platform.machine() != "x86_64":
            pytest.skip("an x86-64 build")
    elif name != "native" and (shutil.which(cc) is None or shutil.which(runner[0]) is None):
        pytest.skip(
            f"{cc} and {runner[0]} are not installed (Debian: gcc-aarch64-linux-gnu, qemu-user)"
        )
    if shutil.which(cc) is None:
        pytest.skip("no C compiler (the kernel then runs on the step graph)")
    exe = tmp_path / name
    subprocess.run([cc, "-O3", *flags, "-pthread", "-o", str(exe), str(source), "-lm"], check=True)
    r = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr  # the check's own verdict
    return torch.tensor([float(v) for v in r.stdout.split()])


@pytest.mark.parametrize("build", BUILDS[1:], ids=[b[0] for b in BUILDS[1:]])
def test_kernel_code_paths_agree(build, tmp_path):
    """Each code path (AVX-512/VNNI or whatever this CPU has, AVX2, plain C, NEON dot product
    under qemu, plain C on aarch64): verify rows are 1-row steps bit for bit, heads through a
    row map and a projection's rows keep their bits, and the logits of a random tiny model and
    a projection's outputs equal the native build's to float rounding."""
    ref = _run_check(tmp_path, *BUILDS[0])
    got = _run_check(tmp_path, *build)
    assert got.shape == ref.shape == (80 + 48,)  # the last step's logits, a projection's outputs
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()


# The kernel's attention (attn_task: a job per row and KV head, its query heads, or some of
# them, together on each block of keys) against each (row, query head) computed alone with the
# per-head operations it had before (blocks of score_block8, dot_f32 past them, softmax_parts,
# weigh_values): the bits must be the same, for any row count, part count and thread.
ATTN_CHECK = r"""
#include <stdio.h>
#include "ROWSTEP_C"
static uint32_t rng = 777;
static float urand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.f - 0.5f;
}
int main(void) {
    static const int shapes[][3] = {{14, 2, 64}, {8, 1, 128}, {6, 2, 128}, {4, 2, 16}, {6, 3, 32},
                                    {32, 1, 64}, {5, 1, 64}, {4, 2, 40}, {2, 2, 12}};
    static const int starts[] = {0, 5, 37, 77, 1100};
    enum { S = 1200, T = 16 };
    int bad = 0;
    for (int c = 0; c < (int)(sizeof shapes / sizeof shapes[0]); c++) {
        int H = shapes[c][0], Hkv = shapes[c][1], Dh = shapes[c][2], W = (H + 2 * Hkv) * Dh;
        Engine *e = rowstep_new(2, 64, H, Hkv, Dh, 96, 80, 1e-6f, 2, S);
        float *k = malloc(sizeof(float) * 2 * Hkv * S * Dh),
              *v = malloc(sizeof(float) * 2 * Hkv * S * Dh);
        float *qkv = malloc(sizeof(float) * T * W), *out = malloc(sizeof(float) * T * H * Dh);
        float *ref = malloc(sizeof(float) * Dh), *sc = malloc(sizeof(float) * S);
        for (size_t i = 0; i < (size_t)2 * Hkv * S * Dh; i++) {
            k[i] = 2 * urand();
            v[i] = urand();
        }
        for (int i = 0; i < T * W; i++) qkv[i] = 3 * urand();
        for (int si = 0; si < (int)(sizeof starts / sizeof starts[0]); si++)
            for (int rows = 1; rows <= T; rows += T - 1)
                /* heads a job: all, 1, 2 */
                for (int parts = 1, per = 0; parts <= 5; parts += 2, per++) {
                    int pos[T], Ss[T];
                    float *ks[T], *vs[T];
                    for (int t = 0; t < T; t++) {
                        pos[t] = starts[si] + t; Ss[t] = S; ks[t] = k; vs[t] = v;
                    }
                    AttnTask at = {e, rows, 1, pos, ks, vs, Ss, qkv, out, per};
                    pool_active(&e->pool, 1);
                    pool_run(&e->pool, attn_task, &at, parts);
                    pool_active(&e->pool, 0);
                    for (int t = 0; t < rows; t++)
                        for (int h = 0; h < H; h++) {
                            int n = pos[t] + 1, p = 0;
                            const float *q = qkv + (size_t)t * W + h * Dh;
                            size_t off = ((size_t)1 * Hkv + h / (H / Hkv)) * S * Dh;
                            if (score_blocks(Dh))
                                for (; p + 8 <= n; p += 8)
                                    score_block8(q, k + off + (size_t)p * Dh, Dh, sc + p);
                            for (; p < n; p++) sc[p] = dot_f32(q, k + off + (size_t)p * Dh, Dh);
                            float sum = softmax_parts(sc, n, 1.f / sqrtf((float)Dh)),
                                  inv = 1.f / sum;
                            weigh_values(sc, v + off, n, Dh, ref);
                            for (int i = 0; i < Dh; i++) ref[i] *= inv;
                            if (memcmp(ref, out + (size_t)t * H * Dh + h * Dh,
                                       sizeof(float) * Dh)) {
                                if (bad++ < 10)
                                    fprintf(stderr, "H %d Hkv %d Dh %d: row %d head %d "
                                            "at %d keys differs\n", H, Hkv, Dh, t, h, n);
                            }
                        }
                }
        rowstep_free(e);
        free(k); free(v); free(qkv); free(out); free(ref); free(sc);
    }
    fprintf(stderr, bad ? "%d heads differ\n" : "every head alone\n", bad);
    return bad != 0;
}
"""


def _run_inline_check(source: str, build, tmp_path) -> None:
    """An inline check's text (ROWSTEP_C: where it includes the kernel's source) run as
    _run_check runs the self-check, for ``build`` (one of BUILDS)."""
    src = tmp_path / "check.c"
    src.write_text(
        source.replace("ROWSTEP_C", str(ROOT / "thor_runtime" / "kernels" / "csrc" / "rowstep.c"))
    )
    _run_check(tmp_path, *build, source=src)


@pytest.mark.parametrize("build", BUILDS[:3], ids=[b[0] for b in BUILDS[:3]])
def test_grouped_attention_is_each_head_alone(build, tmp_path):
    _run_inline_check(ATTN_CHECK, build, tmp_path)


# The MLP's activation (silu_mul: SiLU(gate) times up, 16 lanes at a time where AVX-512 is
# built) against its definition element by element, exp_poly's bits: every length (the tails
# run the 8-lane and scalar loops) and inputs past exp's clamps.
SILU_CHECK = r"""
#include <stdio.h>
#include "ROWSTEP_C"
int main(void) {
    enum { N = 4864 };
    static float g[N], up[N], a[N];
    uint32_t r = 99;
    for (int i = 0; i < N; i++) {
        r = r * 1664525u + 1013904223u;
        g[i] = ((float)(r >> 8) / 16777216.f - 0.5f) * (i % 31 ? 16.f : 400.f);
        r = r * 1664525u + 1013904223u; up[i] = (float)(r >> 8) / 16777216.f - 0.5f;
    }
    int bad = 0;
    for (int n = 1; n <= N; n += n < 64 ? 1 : 97) {
        silu_mul(g, up, a, n);
        for (int i = 0; i < n; i++) {
            float want = g[i] / (1.f + exp_poly(-g[i])) * up[i];
            bad += memcmp(&want, &a[i], sizeof want) != 0;
        }
    }
    fprintf(stderr, bad ? "%d elements differ\n" : "every element its definition\n", bad);
    return bad != 0;
}
"""


@pytest.mark.parametrize("build", BUILDS[:3], ids=[b[0] for b in BUILDS[:3]])
def test_the_activation_is_its_definition_bit_for_bit(build, tmp_path):
    _run_inline_check(SILU_CHECK, build, tmp_path)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_runs_the_rows_itself(tiny_llama, tmp_path):
    """The kernel's worker threads do not exist in a forked child: it runs every share in its
    own thread (without this it would wait for them forever), with the parent's bits."""
    import os

    import numpy as np

    from thor_runtime.kernels.rowstep import RowStep, kernel_dir

    m = with_rows(tiny_llama)
    m.runner.rows = RowStep(
        m, build_library(kernel_dir())[0], threads=2
    )  # the suite runs torch on 1
    ids = torch.tensor(tiny_llama.tokenizer.encode(PROMPT))[:12]

    def logits():
        cache = KVCache(m.cfg, len(ids) + 1, "fp32", m.dtype)
        m.prefill(ids[:4], cache)
        return m.verify(ids[4:], cache).logits

    want, out = logits(), tmp_path / "child.npy"
    pid = os.fork()
    if pid == 0:  # the child: no pytest from here on
        try:
            np.save(out, logits().numpy())
        finally:
            os._exit(0)
    import signal
    import time

    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:  # waiting for workers it does not have
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's forward did not return within 60 s")
    assert done[1] == 0 and torch.equal(torch.from_numpy(np.load(out, allow_pickle=False)), want)


def test_threads_in_use_follow_the_idle_cores_and_change_no_bit(tiny_qwen2, monkeypatch):
    """The kernel's pool uses the cores others leave idle (two agreeing readings, or one when
    told to take it as is); a forward on 1 of 3 threads gives the bits of one on all 3, since a
    part's outputs do not depend on the thread that computes it. THOR_ADAPT_THREADS=0 fixes it."""
    from thor_runtime.engine import threads
    from thor_runtime.kernels.rowstep import row_step

    m = with_rows(tiny_qwen2)
    kernel, why = row_step(m, {}, threads=3)
    assert kernel is not None, why
    kernel.fit = threads.FitWatch(3, every=1, min_interval_s=0.0)
    busy = {"others": 0}
    monkeypatch.setattr(threads, "cores", lambda: 3)
    monkeypatch.setattr(threads, "others_running", lambda: busy["others"])
    monkeypatch.delenv(threads.ENV, raising=False)
    m.runner.rows = kernel
    ids = torch.tensor(tiny_qwen2.tokenizer.encode(PROMPT))[:30]
    runs = {}
    for others, used in ((0, 3), (2, 1), (1, 2)):
        busy["others"] = others
        kernel._fit(), kernel._fit()
        assert kernel.threads == used
        runs[used] = steps_vs_verify(m, ids, 9, "fp32", taps=(0, 2))
        assert kernel.threads == used
    for used in (1, 2):
        assert_same(runs[3][0], runs[used][0])  # steps
        assert_same(runs[3][1], runs[used][1])  # verifies
    monkeypatch.setenv(threads.ENV, "0")
    busy["others"] = 2
    kernel._fit(), kernel._fit()
    assert kernel.threads == 3


def test_the_kernel_builds_for_an_avx2_only_cpu(monkeypatch, tmp_path):
    """THOR_CPU_ISA=avx2 (or ATen's AVX2 emulation) compiles for AVX2 + FMA without AVX-512 or
    VNNI, into its own library; a bad value is refused by name."""
    import platform

    from thor_runtime.errors import ThorError
    from thor_runtime.kernels import rowstep

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 only")
    monkeypatch.delenv(rowstep.ISA_ENV, raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert "-march=native" in rowstep._flags()
    native, why = build_library(tmp_path)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert rowstep.cpu_isa() == "avx2" and "-march=x86-64-v3" in rowstep._flags()
    monkeypatch.setenv(rowstep.ISA_ENV, "avx2")
    avx2, why = build_library(tmp_path)
    assert avx2 is not None and native is not None and avx2 != native, why
    import shutil
    import subprocess

    if shutil.which("objdump"):  # no 512-bit register in the AVX2 build
        asm = subprocess.run(["objdump", "-d", str(avx2)], capture_output=True, text=True).stdout
        assert "ymm" in asm and "zmm" not in asm
    monkeypatch.setenv(rowstep.ISA_ENV, "avx9")
    with pytest.raises(ThorError, match="THOR_CPU_ISA"):
        rowstep._flags()


def test_prompt_rows_on_the_row_kernel(tiny_qwen2):
    """Prompt rows run on the row kernel where measured faster (prefill_choice.py, the verdict
    kept with the row-invariance probes). Any split of a prompt, calls past MAX_ROWS rows
    included, gives the same K/V bits, so a stored prefix changes nothing; and they are the
    step graph's math within the int8 rounding of activations."""
    from thor_runtime.kernels.prefill_choice import prefill_on_rows
    from thor_runtime.kernels.rowstep import MAX_ROWS

    m = with_rows(tiny_qwen2)
    rows, step = m.runner.rows, m.runner.step
    key = f"PrefillOnRows:{rows.build}"
    assert m.runner.prefill_on_rows == (rows.group > 0 or m.row_verdicts[key])

    class Build:  # the row kernel as another build
        def __init__(self, group):
            self.group, self.build = group, rows.build

        def __call__(self, *a):
            return rows(*a)

    verdict = {}
    assert prefill_on_rows(m, Build(8), step, verdict) and verdict == {}  # regrouped: not timed
    measured = prefill_on_rows(m, Build(0), step, verdict)  # interleaved: timed once
    assert verdict == {key: measured}
    verdict[key] = not measured  # and kept
    assert prefill_on_rows(m, Build(0), step, verdict) == (not measured)
    assert prefill_on_rows(m, rows, None, {}) and not prefill_on_rows(m, None, step, {})

    T = MAX_ROWS + 20
    ids = torch.arange(T) * 7 % m.cfg.vocab_size

    def prompt(on_rows: bool, splits: tuple[int, ...]):
        m.runner.prefill_on_rows = on_rows
        cache = KVCache(m.cfg, T + 1, "fp32", m.dtype)
        for a, b in zip((0,) + splits, splits + (T,)):
            out = m.prefill(ids[a:b], cache)
        assert m.runner.pick(cache, 1, exact=False).name == (
            "rowstep" if on_rows else "ort-step-graph"
        )
        assert m.prefill_kernel == m.runner.pick(cache, 1, exact=False).name  # what /health reports
        return cache, out.logits

    (one, l1), (split, l2) = prompt(True, ()), prompt(True, (5, 16, MAX_ROWS + 3))
    assert torch.equal(one.k[:, :, :T], split.k[:, :, :T]) and torch.equal(
        one.v[:, :, :T], split.v[:, :, :T]
    )
    assert torch.equal(l1, l2)
    graph, lg = prompt(False, ())
    assert (one.k[:, :, :T] - graph.k[:, :, :T]).abs().max() <= 3e-2 * graph.k[:, :, :T].abs().max()
    assert (l1 - lg).abs().max() <= 3e-2 * lg.abs().max()
