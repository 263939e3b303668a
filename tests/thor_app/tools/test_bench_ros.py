"""`thor bench --ros`: the action's cost per plan and the feedback's spacing, summarized from its
rows; and one real run of the node in-process (slow: it loads the default model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT
from thor_app.tools.bench_ros import gaps, markdown, median_interval, summarize


def _row(direct, action, same=True, stamps=(0.0, 0.1, 0.35), ends=(0.012, 0.001)):
    return {
        "direct_s": direct,
        "action_s": action,
        "same_plan": same,
        "feedback_gaps_s": gaps(list(stamps)),
        "to_first_feedback_s": ends[0],
        "after_last_feedback_s": ends[1],
    }


def test_the_actions_cost_is_the_median_of_the_differences_per_plan():
    rows = [_row(1.0, 1.01), _row(3.0, 3.02), _row(2.0, 2.5)]
    s = summarize(rows)
    assert s["overhead_p50_ms"] == pytest.approx(20.0)
    assert s["overhead_p90_ms"] == pytest.approx(500.0)
    assert s["direct_p50_s"] == 2.0 and s["action_p50_s"] == 2.5
    assert s["feedback_gap_max_s"] == pytest.approx(0.25) and s["same_plans"]
    assert not summarize(rows + [_row(1.0, 1.0, same=False)])["same_plans"]
    md = markdown(s, {"model": "m", "spec": "none", "plans": 3, "repeats": 1, "rmw": "default"})
    assert "median 20.0 ms" in md and "0.250 s" in md
    # the part outside the plan: goal to first feedback plus last feedback to result
    assert s["outside_plan_p50_ms"] == pytest.approx(13.0) and "median 13.0 ms" in md


def test_the_medians_interval_holds_it_and_widens_with_noise():
    quiet = [0.02 + 0.001 * (i % 3) for i in range(30)]
    noisy = [0.02 + 0.4 * ((i * 7) % 11 - 5) / 5 for i in range(30)]
    lo, hi = median_interval(quiet)
    assert lo <= 0.021 <= hi and hi - lo <= 0.002
    nlo, nhi = median_interval(noisy)
    assert nlo <= sorted(noisy)[15] <= nhi and nhi - nlo > 10 * (hi - lo)
    assert median_interval(noisy) == (nlo, nhi)  # the same rows, the same interval


@pytest.mark.slow
def test_a_real_run_plans_the_same_plans_both_ways(tmp_path):
    from tests.helpers.ros import loopback_env, need_interfaces

    need_interfaces()
    out = tmp_path / "ros.json"
    cmd = [sys.executable, "-m", "thor_app.cli", "bench", "--ros", "--ros-plans", "1"]
    cmd += ["--ros-repeats", "2", "--spec", "none", "--json", str(out)]
    r = subprocess.run(
        cmd, cwd=ROOT, env=loopback_env(dict(os.environ)), capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 2 and doc["summary"]["same_plans"]
    assert all(row["direct_s"] > 0 and row["action_s"] > 0 for row in doc["rows"])
    assert doc["settings"]["spec"] == "none"
    assert out.with_suffix(".md").read_text().startswith("model default")
