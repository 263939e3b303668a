"""Closed to drive-by pages: JSON-only POSTs, Host allowlist, a short open /health, the model
name checked; and the start-up chores (leftover builds cleaned, STATUS= per phase)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT
from tests.helpers.serving import config, hosted_loader, is_error_body, passing, wait_health
from thor_app.server.app import STATE, make_app
from thor_app.server.guard import host_name
from thor_app.server.leftovers import remove_abandoned

MSG = [{"role": "user", "content": "pick up the red cup"}]
KEY = "k-0123456789abcdef"
DEPLOY = ROOT / "deploy"


@pytest.fixture
def start(aiohttp_client, tiny_llama, tmp_path):
    async def go(keys: bool = False, **tables):
        if keys:
            (tmp_path / "keys").write_text(KEY + "\n")
            tables["auth"] = {"api_keys_file": str(tmp_path / "keys")}
        app = make_app(
            config(**tables), loader=hosted_loader(tiny_llama), selftest=passing, watchdog_s=None
        )
        client = await aiohttp_client(app)
        assert (await wait_health(client))[0] == 200
        return client

    return go


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]
)
async def test_a_post_that_is_not_json_is_415_and_starts_nothing(start, ctype):
    """text/plain and forms are what a page may send cross-origin with no preflight."""
    client = await start()
    headers = {"Content-Type": ctype} if ctype else {}
    for route in ("/v1/chat/completions", "/v1/plan"):
        body = json.dumps(
            {"messages": MSG, "max_tokens": 2, "task": "x", "world": "kitchen"}
        ).encode()
        r = await client.post(
            route, data=body, headers=headers, skip_auto_headers=("Content-Type",)
        )
        got = await r.json()
        assert (
            r.status == 415
            and is_error_body(got)
            and got["error"]["code"] == "unsupported_media_type"
        )
    st = client.app[STATE]
    assert st.jobs.completed == 0
    r = await client.post(
        "/v1/chat/completions",
        data=json.dumps({"messages": MSG, "max_tokens": 2}),
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert r.status == 200


@pytest.mark.asyncio
async def test_only_loopback_and_configured_host_names_are_served(start):
    client = await start(server={"allowed_hosts": ["robot.local"]})
    for host in ("evil.example:8700", "attacker.test", "127.0.0.1.nip.io", "192.168.1.9:8700"):
        for method, route in (
            ("GET", "/health"),
            ("GET", "/v1/models"),
            ("POST", "/v1/chat/completions"),
        ):
            r = await client.request(method, route, headers={"Host": host}, json={"messages": MSG})
            got = await r.json()
            assert r.status == 403 and got["error"]["code"] == "host_not_allowed", (host, route)
    for host in ("localhost:8700", "127.0.0.1", "[::1]:8700", "ROBOT.local:8700"):
        r = await client.get("/v1/models", headers={"Host": host})
        assert r.status == 200, host


def test_host_names_lose_their_port():
    assert [host_name(h) for h in ("a:1", "[::1]:80", "[::1]", "::1", "LocalHost")] == [
        "a",
        "::1",
        "::1",
        "::1",
        "localhost",
    ]


@pytest.mark.asyncio
async def test_open_health_is_short_and_the_report_is_behind_the_key(start, tiny_llama):
    client = await start(keys=True)
    r = await client.get("/health")
    body = await r.json()
    assert r.status == 200 and set(body) == {
        "status",
        "model",
        "selftest",
        "queue_depth",
        "generating",
    }
    text = json.dumps(body)
    assert "/" not in text.replace("2/2", "") and len(text) < 300  # no path, no report
    assert str(tiny_llama.source) not in text
    r = await client.get("/health/report")
    assert r.status == 401 and is_error_body(await r.json())
    r = await client.get("/health/report", headers={"Authorization": f"Bearer {KEY}"})
    full = await r.json()
    assert r.status == 200 and full["selftest_report"] and full["runtime"]["kv_dtype"] == "fp32"
    assert str(tiny_llama.source) not in json.dumps(full)  # the path never leaves


@pytest.mark.asyncio
async def test_a_model_that_is_not_served_is_404_model_not_found(start, tiny_llama):

    client = await start()
    for bad in ("/etc/passwd", "gpt-4o", str(tiny_llama.source)):
        for route, body in (
            ("/v1/chat/completions", {"messages": MSG, "max_tokens": 2}),
            ("/v1/plan", {"task": "x", "world": "kitchen"}),
        ):
            r = await client.post(route, json={**body, "model": bad})
            got = await r.json()
            assert (
                r.status == 404
                and got["error"]["code"] == "model_not_found"
                and got["error"]["param"] == "model"
            ), (bad, route)
    r = await client.post(
        "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "model": 7}
    )
    assert r.status == 400
    for good in ("default", Path(str(tiny_llama.source)).name):
        r = await client.post(
            "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "model": good}
        )
        assert r.status == 200, good


@pytest.mark.asyncio
async def test_every_startup_phase_reaches_systemd_status(aiohttp_client, tiny_llama):
    sent = []

    class Recorder:
        def send(self, *lines):
            sent.extend(lines)
            return True

        async def send_reliably(self, *lines, timeout_s=30.0):
            sent.extend(lines)
            return True

        def close(self):
            pass

    app = make_app(
        config(),
        loader=hosted_loader(tiny_llama),
        selftest=passing,
        notifier=Recorder(),
        watchdog_s=None,
    )
    client = await aiohttp_client(app)
    assert (await wait_health(client))[0] == 200
    status = [ln for ln in sent if ln.startswith("STATUS=")]
    for phase in ("loading", "warming_up", "self_test", "ready"):
        assert any(ln.startswith(f"STATUS={phase}") for ln in status), (phase, status)
    assert sent.index("READY=1") > max(
        i for i, ln in enumerate(sent) if ln.startswith("STATUS=self_test")
    )


def test_leftovers_of_killed_builds_are_removed_and_live_ones_kept(tmp_path):
    weights, engines = tmp_path / "weights", tmp_path / "engines"
    old_build = weights / ".build-abc123"
    live_build = engines / ".build-def456"
    entry = weights / "0123-int4"
    dead_old = weights / f".old-0123-int4-{2**22 + 12345}"  # above any pid_max default
    live_old = weights / f".old-0123-int4-{os.getpid()}"
    for d in (old_build, live_build, entry, dead_old, live_old):
        d.mkdir(parents=True)
        (d / "weights.safetensors").write_bytes(b"x" * 16)
    past = time.time() - 7200
    for p in (old_build, old_build / "weights.safetensors"):
        os.utime(p, (past, past))
    gone = remove_abandoned([weights, engines, tmp_path / "absent"])
    assert sorted(gone) == sorted([old_build, dead_old])
    assert live_build.is_dir() and entry.is_dir() and live_old.is_dir() and not old_build.exists()


def test_systemd_analyze_security_exposure_is_at_most_2(tmp_path):
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    unit = tmp_path / "thor-runtime.service"
    unit.write_text((DEPLOY / "thor-runtime.service").read_text())
    r = subprocess.run(
        [exe, "security", "--offline=true", str(unit)], capture_output=True, text=True, timeout=120
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout + r.stderr)
    if m is None:
        pytest.skip(
            f"this systemd-analyze has no offline security check: {(r.stdout + r.stderr)[-200:]}"
        )
    assert float(m.group(1)) <= 2.0, r.stdout
