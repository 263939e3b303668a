"""Thread pools sized to the idle cores: the governor's decisions from a given machine state,
the /proc readings it uses, and `thor bench --neighbour` end to end on a tiny model."""

from __future__ import annotations

import json
import time

import pytest
import torch

from thor_app.cli import main
from thor_app.tools import bench_neighbour
from thor_runtime.engine import threads
from thor_runtime.engine.threads import ThreadGovernor, fitting_threads


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_fitting_threads():
    assert fitting_threads(2, 0, n_cores=2) == 2
    assert fitting_threads(2, 1, n_cores=2) == 1  # one busy neighbour: its core is not ours
    assert fitting_threads(2, 5, n_cores=2) == 1  # never fewer than one
    assert fitting_threads(4, 1, n_cores=8) == 4  # never more than asked for
    assert fitting_threads(3, None, n_cores=2) == 3  # nothing to read: as asked


def test_proc_readings():
    others = threads.others_running()
    assert others is None or others >= 0
    assert threads.cores() >= 1


def test_governor_follows_the_neighbour(monkeypatch, two_threads):
    busy = {"others": threads.cores()}
    monkeypatch.setattr(threads, "others_running", lambda: busy["others"])
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setenv(threads.ENV, "1")
    g = ThreadGovernor(every=1, min_interval_s=0.0)
    g.start()  # a request starts beside a busy process
    assert torch.get_num_threads() == 1 and g.limit == 2
    busy["others"] = 0
    g.tick()
    assert torch.get_num_threads() == 1  # one quiet reading is not enough
    g.tick()
    assert torch.get_num_threads() == 2  # two in a row: the cores are back
    busy["others"] = 1
    g.tick(), g.tick()
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)  # the caller's choice is the new limit
    busy["others"] = 0
    g.start()
    assert g.limit == 2 and torch.get_num_threads() == 2


def test_a_runnable_task_that_takes_no_cpu_time_takes_no_core(monkeypatch):
    """The run-queue count may show a task that never runs (four sequences sharing rounds saw
    one at a quarter of the readings); a pool gives up a core only where the others' CPU time
    shows them using it, and takes cores back on the count alone."""
    busy = {"others": 1, "share": 0.0}
    monkeypatch.setattr(threads, "others_running", lambda: busy["others"])
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(threads, "others_cpu", lambda since: (busy["share"], since))
    w = threads.FitWatch(2, every=1, min_interval_s=0.0)
    assert [w.poll(), w.poll(), w.poll()] == [None, None, None] and w.current == 2
    busy["share"] = 0.9  # a neighbour that runs
    assert [w.poll(), w.poll()] == [None, 1] and w.current == 1
    busy["others"], busy["share"] = 0, 0.0
    assert [w.poll(), w.poll()] == [None, 2]
    busy["others"] = 1
    assert [w.poll(), w.poll()] == [None, None]  # counted again, still no CPU time: no core given
    monkeypatch.setattr(threads, "others_cpu", lambda since: (None, since))
    w = threads.FitWatch(2, every=1, min_interval_s=0.0)
    assert [w.poll(), w.poll()] == [None, 1]  # no share read yet: the count alone


def test_others_cpu_reads_a_share_over_a_window():
    share, first = threads.others_cpu(None)
    if first is None:
        pytest.skip("no /proc here")
    assert share is None and threads.others_cpu(first) == (None, first)  # too short a window
    t = time.perf_counter()
    while time.perf_counter() - t < threads.SHARE_WINDOW_S * 1.5:
        pass  # our own work: not the others'
    share, later = threads.others_cpu(first)
    assert later is not first and 0.0 <= share < threads.cores()


def test_governor_off_by_default_and_one_thread_left_alone(monkeypatch, two_threads):
    monkeypatch.setattr(threads, "others_running", lambda: 7)
    monkeypatch.delenv(threads.ENV, raising=False)  # off unless asked for
    g = ThreadGovernor(every=1, min_interval_s=0.0)
    g.start(), g.tick(), g.tick()
    assert torch.get_num_threads() == 2 and g.changes == 0
    monkeypatch.setenv(threads.ENV, "1")
    torch.set_num_threads(1)
    g.start(), g.tick(), g.tick()
    assert torch.get_num_threads() == 1 and g.changes == 0


def test_one_torch_thread_then_the_callers_count(monkeypatch, two_threads):
    """Inside: one torch thread (nested too); after: the caller's count, in each thread on its
    own; a governor does not take the one for the caller's choice."""
    import threading

    from thor_runtime.engine.threads import one_torch_thread

    # a quiet machine, whatever else runs beside the test: a busy reading would shrink the pool
    # at start(), which is the governor's job and not what this test is about
    monkeypatch.setattr(threads, "others_running", lambda: 0)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setenv(threads.ENV, "1")
    g = ThreadGovernor(every=1, min_interval_s=0.0)
    g.start()
    seen = []
    with one_torch_thread():
        seen.append(torch.get_num_threads())
        with one_torch_thread():
            seen.append(torch.get_num_threads())
        seen.append(torch.get_num_threads())
        g.tick()
    assert seen == [1, 1, 1] and torch.get_num_threads() == 2 and g.limit == 2

    def other():
        torch.set_num_threads(2)
        with one_torch_thread():
            seen.append(torch.get_num_threads())
        seen.append(torch.get_num_threads())

    t = threading.Thread(target=other)
    t.start()
    t.join(5)
    assert seen[3:] == [1, 2] and torch.get_num_threads() == 2


def test_a_drafter_beside_the_row_kernel_drafts_on_one_thread(tiny_llama, monkeypatch, two_threads):
    """On the row kernel a drafter's forwards run at one torch thread (torch's spinning pool
    would take the kernel's cores), the count is the caller's again after, and the tokens are
    the plain decoding's."""
    from tests.helpers.lowbit import with_rows
    from tests.helpers.tiny import random_drafter
    from thor_runtime.engine.generate import Runtime
    from thor_runtime.engine.sampling import SamplingParams
    from thor_runtime.speculative import Speculation
    from thor_runtime.speculative.dflash import DFlashProposer

    m = with_rows(tiny_llama)
    rt = Runtime(m, tiny_llama.tokenizer)
    proposer = DFlashProposer(random_drafter(m.cfg, block_size=5, num_taps=2), m, window=8)
    counts, real = [], DFlashProposer.propose

    def spy(self, seq, k):
        counts.append(torch.get_num_threads())
        return real(self, seq, k)

    monkeypatch.setattr(DFlashProposer, "propose", spy)
    ids = tiny_llama.tokenizer.encode("pick up the red cup")
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    spec = rt.generate(ids, params, Speculation(proposer, 6)).token_ids
    assert counts and set(counts) == {1} and torch.get_num_threads() == 2
    assert spec == rt.generate(ids, params).token_ids


def test_summary_ratios():
    s = bench_neighbour.summarize(
        {
            "quiet": [{"decode_tok_s": 100.0, "threads_after": 2}] * 3,
            "neighbour": [{"decode_tok_s": 50.0, "threads_after": 1}] * 3,
        }
    )
    assert s["neighbour"]["vs_quiet"] == 0.5 and s["quiet"]["vs_quiet"] == 1.0


def test_bench_neighbour_end_to_end(tiny_dirs, tmp_path, capsys, monkeypatch):
    spawned = []
    real = bench_neighbour.start_neighbour

    def counted():
        p = real()
        spawned.append(p)
        return p

    monkeypatch.setattr(bench_neighbour, "start_neighbour", counted)
    out = tmp_path / "n.json"
    rc = main(
        [
            "bench",
            "--neighbour",
            "--model",
            str(tiny_dirs["llama"]),
            "--repeats",
            "1",
            "--max-tokens",
            "4",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["modes"]) == set(bench_neighbour.MODES)
    assert all(m["decode_tok_s_median"] > 0 for m in doc["modes"].values())
    assert len(spawned) == 3 and all(p.poll() is not None for p in spawned)  # started and gone
    out = capsys.readouterr().out
    assert "neighbour-adaptive" in out and "neighbour-fixed" in out
