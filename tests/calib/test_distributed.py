"""calib/ on several workers (torchrun, gloo on loopback): gen-data sharded by rank, distill with
DDP, and a worker lost mid-run that torchrun restarts.

Each launch starts real worker processes (``python -m torch.distributed.run --standalone``) on
the tiny random llama, and compares with one process in this one: the same data, the same loss
trajectory, the same weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from calib.datagen import GenConfig, generate_dataset
from calib.dist import World
from calib.distill import DistillConfig, run_distill
from calib.prompts import PromptSpec
from calib.shards import read_shards
from tests.helpers.paths import ROOT
from thor_runtime.errors import ThorError

SPEC = dict(split="train", seed=0, general_frac=1.0)  # short prompts for the tiny model
GEN = GenConfig(32, 3)
# distill's settings, the same in every run here (a global batch of 4: 2 rows per worker)
DISTILL = dict(
    block_size=8,
    blocks=4,
    batch=4,
    window=16,
    steps=8,
    warmup=2,
    lr=3e-3,
    ckpt_every=2,
    eval_n=0,
    taps="0,2",
    draft_vocab=0,
)


def torchrun(*args: str, workers: int = 2, restarts: int = 0, module="thor_app.cli", env=None):
    """Run ``thor ARGS`` (or another module) as `workers` torchrun workers. -> stdout."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={workers}", f"--max-restarts={restarts}", "-m", module]
    # `--`: torchrun's own options end here (gen-data's --n would read as its --nnodes)
    p = subprocess.run(
        cmd + ["--", *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def distill_args(target, data, out) -> list[str]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in DISTILL.items()]
    return ["calib", "distill", f"--target={target}", f"--data={data}", f"--out={out}", *flags]


def make_data(m, tiny_dirs, n: int, out) -> None:
    """One process's gen-data, stamped with the target as the CLI names it."""
    target = str(tiny_dirs["llama"])
    generate_dataset(m.model, m.tokenizer, PromptSpec(n=n, **SPEC), GEN, out, target, False)


def losses(out) -> list:
    return json.loads((out / "ckpt" / "ckpt.json").read_text())["losses"]


def weights(out) -> dict:
    return load_file(str(out / "model.safetensors"))


@pytest.fixture(scope="module")
def one(tiny_llama, tiny_dirs, tmp_path_factory):
    """One process's data (6 requests) and its distillation: what the workers must match."""
    root = tmp_path_factory.mktemp("one")
    make_data(tiny_llama, tiny_dirs, 6, root / "data")
    run_distill(
        tiny_llama, DistillConfig(str(root / "run"), str(root / "data"), **DISTILL), progress=False
    )
    return root


@pytest.fixture(scope="module")
def two(one, tiny_dirs, tmp_path_factory):
    """The same distillation by two DDP workers, uninterrupted. -> (out dir, stdout)."""
    out = tmp_path_factory.mktemp("two") / "run"
    return out, torchrun(*distill_args(tiny_dirs["llama"], one / "data", out))


def test_world_from_torchruns_environment():
    w = World.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (w.rank, w.size, w.local_rank, w.restart, w.main) == (3, 4, 1, 0, False)
    assert World.from_env({}) == World() and World().main
    assert World.from_env({"TORCHELASTIC_RESTART_COUNT": "2"}).restart == 2
    assert [i for i in range(10) if w.owns(i)] == [3, 7]
    assert w.rows(8) == slice(6, 8) and World().rows(5) == slice(0, 5)
    with pytest.raises(ThorError, match="--batch 6 does not split evenly over 4 workers"):
        w.rows(6)
    with pytest.raises(ThorError, match="not a place"):
        World(rank=2, size=2)
    with pytest.raises(ThorError, match="WORLD_SIZE"):
        World.from_env({"WORLD_SIZE": "two"})
    # torchrun's own store, shared with the workers: where a restarted group keeps its keys
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}
    assert World.from_env({**env, "TORCHELASTIC_USE_AGENT_STORE": "True"}).agent_store == (
        "127.0.0.1:29400"
    )
    assert World.from_env({**env, "TORCHELASTIC_USE_AGENT_STORE": "False"}).agent_store == ""
    lost = World(rank=0, size=4, restart=1, nodes=2, agent_store="127.0.0.1:29400")
    with pytest.raises(ThorError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        lost.start()  # several machines count restarts each on its own


def test_an_uneven_batch_is_refused_before_anything_loads(tmp_path, monkeypatch, capsys):
    from thor_app.cli import main

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = ["calib", "distill", "--out", str(tmp_path), "--batch", "3", "--target", "nowhere"]
    assert main(args) == 2
    assert "--batch 3 does not split evenly over 2 workers" in capsys.readouterr().err


def test_gen_data_workers_make_one_process_data(one, tiny_llama, tiny_dirs, tmp_path):
    """Two workers finish a set one process began: each skips what is there and answers its own
    requests (i % 2), and the union is one process's data, token for token."""
    out = tmp_path / "data"
    make_data(tiny_llama, tiny_dirs, 3, out)
    args = ["calib", "gen-data", f"--target={tiny_dirs['llama']}", "--n", "6", "--general-frac=1"]
    stdout = torchrun(*args, "--max-tokens=32", "--batch=3", f"--out={out}", "--quiet")
    (doc,) = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert doc["generated_now"] == 3 and doc["workers"] == 2 and doc["missing_here"] == 0
    assert read_shards(out) == read_shards(one / "data")
    assert (out / "manifest.json").read_text() == (one / "data" / "manifest.json").read_text()
    # each worker wrote its own shard files, holding its own requests only
    for rank, want in ((0, {4}), (1, {3, 5})):
        files = sorted(out.glob(f"shard-r{rank:04d}-*.safetensors"))
        got = {i for f in files for i in load_file(str(f))["prompt_index"].tolist()}
        assert got == want, (rank, files)


def test_ddp_distill_is_one_process_at_the_same_global_batch(one, two):
    out, stdout = two
    ref = losses(one / "run")
    got = losses(out)
    assert [s for s, _ in got] == list(range(1, 9))
    for (_, a), (_, b) in zip(got, ref):
        assert abs(a - b) <= 1e-5 * abs(b), (got, ref)
    a, b = weights(out), weights(one / "run")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4, msg=k)
    # rank 0 alone reports: one JSON object on stdout
    assert [json.loads(line)["step"] for line in stdout.splitlines() if line.startswith("{")] == [8]


def test_a_lost_worker_is_restarted_and_resumes(one, two, tiny_dirs, tmp_path):
    """Rank 1 dies as step 5 begins; torchrun restarts both workers, which resume from the last
    checkpoint (no --resume on the command line) and end where the uninterrupted run did."""
    out, marker = tmp_path / "run", tmp_path / "crashed"
    torchrun(
        *distill_args(tiny_dirs["llama"], one / "data", out),
        restarts=1,
        module="tests.helpers.crashing_thor",
        env={"CRASH_AT": f"1:5:{marker}"},
    )
    assert marker.exists()  # it did die once
    assert losses(out) == losses(two[0])
    a, b = weights(out), weights(two[0])
    for k in a:
        assert torch.equal(a[k], b[k]), k
