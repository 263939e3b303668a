"""The peers harness in its short mode: every configuration runs in its own process, a peer
that is not installed is skipped with its reason, and the outputs (JSON, table, plots) appear."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_peers_short_mode(tmp_path, monkeypatch):
    from thor_app.tools.peers.driver import run_peers

    monkeypatch.setenv("THOR_CACHE_DIR", str(tmp_path / "wcache"))  # workers inherit it
    lines = []
    doc = run_peers(
        "default",
        tmp_path,
        short=True,
        peers_py=str(tmp_path / "no-such-python"),
        threads=1,
        log=lines.append,
    )
    assert "llama.cpp" in doc["skipped"] and any("llama.cpp skipped" in x for x in lines)
    rows = {(r["engine"], r["config"]): r for r in doc["rows"]}
    thor = rows[("thor", "int4/none")]
    assert thor["decode_tok_s"] > 0 and thor["peak_rss_mb"] > 0 and thor["load_s"] > 0
    assert thor["verify16_x_step"] > 0
    assert thor["plan_latency_median_s"] > 0 and thor["plan_warm_median_s"] > 0
    # speculation is also timed against plain in its own process, prompt by prompt; plain is not
    assert (
        rows[("thor", "int4/auto")]["vs_plain_paired_min"] > 0
        and thor["vs_plain_paired_min"] is None
    )
    saved = json.loads((tmp_path / "peers.json").read_text())
    assert saved["machine"]["torch"] and saved["rows"] == doc["rows"]
    assert "| thor | int4/none |" in (tmp_path / "peers.md").read_text()
    assert (tmp_path / "peers-decode.png").stat().st_size > 0


def test_peers_missing_engine_reason(tmp_path, monkeypatch):
    import sys

    from thor_app.tools.peers.driver import _has, peers_python

    monkeypatch.delenv("THOR_PEERS_PYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    assert peers_python(None) is None and peers_python(str(tmp_path / "absent")) is None
    assert peers_python(sys.executable) == sys.executable
    assert _has(sys.executable, "json") is None
    assert "No module named" in _has(sys.executable, "surely_not_a_module_xyz")


def test_llama_cpp_killed_by_a_signal_runs_again_without_extra_buffers(tmp_path):
    """llama.cpp's AMX buffer type crashes some CPUs that report AMX: a llama.cpp worker killed
    by a signal runs once more with ``llama_extra_buffers`` off, and its version says so; a
    worker that fails otherwise is an error, not retried."""
    import stat
    import sys

    from thor_app.tools.peers.driver import _run

    fake = tmp_path / "python"  # stands for the peers' interpreter: -m worker SPEC OUT
    fake.write_text(f"""#!{sys.executable}
import json, os, signal, sys
spec = json.load(open(sys.argv[3]))
if spec.get("fail"):
    sys.exit(3)
if spec.get("llama_extra_buffers", True):
    os.kill(os.getpid(), signal.SIGSEGV)
json.dump({{"version": "llama-cpp-python test"}}, open(sys.argv[4], "w"))
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = _run(str(fake), {"engine": "llama.cpp"}, {})
    assert (
        out["version"]
        == "llama-cpp-python test, extra buffer types off (with them: killed by signal 11)"
    )
    assert _run(str(fake), {"engine": "llama.cpp", "fail": True}, {}) == {"error": "exit status 3"}
    assert "error" in _run(str(fake), {"engine": "thor"}, {})  # only llama.cpp is retried


@pytest.mark.slow
def test_peers_beside_a_neighbour(tmp_path, monkeypatch):
    """--peers --neighbour: each configuration quiet and beside one busy process (started and
    reaped around that run only), its decode speed also as a share of the quiet one."""
    from thor_app.tools import bench_neighbour
    from thor_app.tools.peers.driver import run_peers

    monkeypatch.setenv("THOR_CACHE_DIR", str(tmp_path / "wcache"))
    spawned, real = [], bench_neighbour.start_neighbour

    def counted():
        spawned.append(real())
        return spawned[-1]

    monkeypatch.setattr(bench_neighbour, "start_neighbour", counted)
    doc = run_peers(
        "default",
        tmp_path,
        short=True,
        peers_py=str(tmp_path / "no-such-python"),
        threads=1,
        log=lambda *_: None,
        configs=["int4/none"],
        neighbour=True,
        transformers=False,
        plans=0,
    )
    rows = {(r["config"], r["load"]): r for r in doc["rows"]}
    assert set(rows) == {("int4/none", "quiet"), ("int4/none", "neighbour")}
    assert "transformers" in doc["skipped"] and doc["neighbour"] is True
    quiet, busy = rows[("int4/none", "quiet")], rows[("int4/none", "neighbour")]
    assert quiet["decode_vs_quiet"] == 1.0
    assert busy["decode_vs_quiet"] == round(busy["decode_tok_s"] / quiet["decode_tok_s"], 3)
    assert len(spawned) == 1 and spawned[0].poll() is not None
    assert "| thor | int4/none | neighbour |" in (tmp_path / "peers.md").read_text()


def test_peers_configs_are_checked():
    from thor_app.tools.peers.driver import parse_configs
    from thor_runtime.errors import ThorError

    assert parse_configs(None) is None
    assert parse_configs("int4/none, int4@torch/auto") == ["int4/none", "int4@torch/auto"]
    for bad in ("int3/none", "int4/fast", "fp32@torch/none", "int4@cuda/none", ","):
        with pytest.raises(ThorError):
            parse_configs(bad)
