"""The service around the API: its config, sd_notify and the watchdog, the systemd unit, the
installer, and `thor serve` as a real process (SIGTERM exits 0)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import threading

import pytest
import tomllib

from tests.helpers.paths import ROOT
from tests.helpers.serving import (
    config,
    failing,
    free_port,
    hosted_loader,
    passing,
    spawn_serve,
    wait_ready,
)
from thor_app.cli import main
from thor_app.server.app import STATE, make_app
from thor_app.server.config import ServeConfig, config_from_dict, load_config
from thor_app.server.notify import watchdog_interval
from thor_runtime.errors import ThorError

DEPLOY = ROOT / "deploy"


# ---- config ---------------------------------------------------------------------------------
def test_the_documented_example_is_exactly_the_defaults():
    doc = tomllib.loads((DEPLOY / "thor.toml.example").read_text())
    assert set(doc) == {"server", "model", "engine", "speculation", "limits", "auth", "planner"}
    cfg = config_from_dict(doc, "example")
    assert cfg == ServeConfig(source="example")


@pytest.mark.parametrize(
    "doc, words",
    [
        ({"sever": {}}, "unknown table [sever]"),
        ({"server": {"prot": 1}}, "unknown key server.prot"),
        ({"server": {"port": "8700"}}, "server.port"),
        ({"model": {"dtype": "fp8"}}, "model.dtype"),
        (
            {"engine": {"backend": "openvino"}},
            "engine.backend must be one of torch, onnxruntime, tensorrt",
        ),
        (
            {"model": {"backend": "openvino"}},
            "engine.backend must be one of",
        ),  # the earlier spelling
        (
            {"engine": {"backend": "onnxruntime"}, "model": {"dtype": "int8"}},
            "not model.dtype int8",
        ),
        ({"model": {"backend": "onnxruntime"}, "engine": {"backend": "torch"}}, "both set"),
        ({"model": {"device": "gpu"}}, "model.device"),
        ({"limits": {"queue_size": 0}}, "limits.queue_size"),
        ({"limits": {"default_max_tokens": 4096}}, "limits.max_tokens"),
        ({"speculation": {"method": "magic"}}, "speculation.method"),
        ({"planner": {"attempts": True}}, "planner.attempts"),
        ({"server": []}, "must be a table"),
    ],
)
def test_config_errors_name_the_key(doc, words):
    with pytest.raises(ThorError) as e:
        config_from_dict(doc, "x.toml")
    assert words in str(e.value) and str(e.value).startswith("x.toml")


@pytest.mark.parametrize("dtype", ["auto", "int4", "int8", "bf16"])
def test_every_weight_dtype_of_the_cli_is_a_service_dtype(dtype):
    """The service loads what `thor generate --dtype` loads, low-bit GGUF weights included."""
    assert config_from_dict({"model": {"dtype": dtype}}, "x.toml").model.dtype == dtype


def test_thor_config_env_points_at_the_file(tmp_path, monkeypatch):
    p = tmp_path / "t.toml"
    p.write_text("[server]\nport = 9001\n[limits]\nrequest_timeout_s = 30\n")
    monkeypatch.setenv("THOR_CONFIG", str(p))
    cfg = load_config(None)
    assert cfg.server.port == 9001 and cfg.limits.request_timeout_s == 30.0 and cfg.source == str(p)
    assert load_config(None).with_overrides(port=9002).server.port == 9002


@pytest.mark.parametrize(
    "text, words",
    [
        (None, "config file not found"),
        ("[server\n", "not valid TOML"),
        ('[auth]\napi_keys_file = "/nonexistent/keys"\n', "auth.api_keys_file"),
    ],
)
def test_serve_bad_config_exits_2_with_one_line(tmp_path, capsys, text, words):
    p = tmp_path / "c.toml"
    if text is not None:
        p.write_text(text)
    assert main(["serve", "--config", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_short_or_empty_api_keys_are_refused(tmp_path):
    for text in ("# none\n", "short\n"):
        (tmp_path / "k").write_text(text)
        with pytest.raises(ThorError):
            config_from_dict({"auth": {"api_keys_file": str(tmp_path / "k")}}).auth.load_keys()


# ---- sd_notify and the watchdog -------------------------------------------------------------
def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process():
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert (
        watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}) == 15.0
    )
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, pid=2) is None
    assert watchdog_interval({}) is None and watchdog_interval({"WATCHDOG_USEC": "x"}) is None


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    """The test owns the datagram socket systemd would own."""
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # a ping every 50 ms
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield sock
    sock.close()


async def _recv_until(sock, pred, timeout_s: float = 120.0) -> list[str]:
    got = []
    loop = asyncio.get_running_loop()
    while True:
        msg = (await asyncio.wait_for(loop.sock_recv(sock, 4096), timeout_s)).decode()
        got.append(msg)
        if pred(got):
            return got


def _drain(sock) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


@pytest.mark.asyncio
async def test_ready_then_watchdog_and_a_stalled_generation_stops_the_pings(
    aiohttp_client, tiny_llama, notify_socket
):
    app = make_app(
        config(server={"stall_s": 0.3}), loader=hosted_loader(tiny_llama), selftest=passing
    )
    client = await aiohttp_client(app)
    got = await _recv_until(
        notify_socket,
        lambda g: (
            "READY=1" in "\n".join(g)
            and "WATCHDOG=1" in g[-1]
            and any("READY=1" in m for m in g[:-1])
        ),
    )
    ready_at = next(i for i, m in enumerate(got) if "READY=1" in m)
    assert (await client.get("/health")).status == 200 and ready_at < len(got) - 1
    # A generation that commits no token (a hung kernel, a dead lock) stands in for a stuck loop.
    st = client.app[STATE]
    gate = threading.Event()
    stuck = st.jobs.submit(lambda ctx: gate.wait(60), 120)
    while st.jobs.stalled_for() <= 0.3:
        await asyncio.sleep(0.02)
    _drain(notify_socket)
    await asyncio.sleep(0.5)  # ten ping intervals
    assert "WATCHDOG=1" not in _drain(notify_socket)
    assert (await client.get("/health")).status == 200  # the loop itself still answers
    gate.set()
    await stuck.future
    await _recv_until(notify_socket, lambda g: "WATCHDOG=1" in g[-1])  # pings resume


@pytest.mark.asyncio
async def test_a_blocked_event_loop_sends_no_pings_until_it_turns_again(
    aiohttp_client, tiny_llama, notify_socket
):
    """The pings come from the serving loop itself, not a thread beside it: a handler that
    blocks the loop (a synchronous call where an await belonged) silences them."""
    import time

    from aiohttp import web

    async def stall(request):  # runs on the loop; nothing else on it runs meanwhile
        _drain(notify_socket)
        time.sleep(0.6)  # noqa: ASYNC251 - the point: twelve ping intervals with the loop held
        return web.json_response({"during": _drain(notify_socket)})

    app = make_app(config(), loader=hosted_loader(tiny_llama), selftest=passing)
    app.router.add_get("/stall", stall)
    client = await aiohttp_client(app)
    await _recv_until(
        notify_socket, lambda g: "WATCHDOG=1" in g[-1] and any("READY=1" in m for m in g)
    )
    r = await client.get("/stall")
    assert r.status == 200 and (await r.json())["during"] == []
    await _recv_until(notify_socket, lambda g: "WATCHDOG=1" in g[-1], timeout_s=5)  # pings resume


@pytest.mark.asyncio
async def test_a_failed_selftest_never_sends_ready(aiohttp_client, tiny_llama, notify_socket):
    app = make_app(config(), loader=hosted_loader(tiny_llama), selftest=failing)
    client = await aiohttp_client(app)
    got = await _recv_until(notify_socket, lambda g: "self-test failed" in g[-1])
    assert not any("READY=1" in m for m in got) and "STATUS=" in got[-1]
    assert (await client.get("/health")).status == 503


def test_a_receiver_that_stops_reading_never_blocks_the_sender(tmp_path):
    from thor_app.server.notify import Notifier

    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(str(tmp_path / "n"))
    n = Notifier(str(tmp_path / "n"))
    sent = [n.send("WATCHDOG=1") for _ in range(200)]  # far past the kernel's queue length
    assert sent[0] and not sent[-1]
    assert rx.recv(64) == b"WATCHDOG=1"
    n.close()
    rx.close()


@pytest.mark.asyncio
async def test_ready_waits_for_room_instead_of_being_dropped(tmp_path):
    from thor_app.server.notify import Notifier

    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(str(tmp_path / "n"))
    rx.setblocking(False)
    n = Notifier(str(tmp_path / "n"))
    while n.send("WATCHDOG=1"):  # fill the receiver's queue
        pass
    ready = asyncio.ensure_future(n.send_reliably("READY=1"))
    await asyncio.sleep(0.05)
    assert not ready.done()  # waiting, not dropped, loop still turning
    got = _drain(rx)
    assert await ready and "READY=1" in got + _drain(rx)
    n.close()
    rx.close()


# ---- the job queue: one generation at a time, stopped within one cycle ------------------------
@pytest.mark.parametrize("spec", ["none", "ngram"])
def test_a_cancel_stops_the_generation_at_the_next_committed_token(tiny_llama, spec):
    import time

    from thor_app.server.jobs import Cancelled, Job, JobContext, JobQueue
    from thor_runtime.engine.generate import Runtime
    from thor_runtime.engine.sampling import SamplingParams
    from thor_runtime.speculative import SpecOptions, build_speculation

    jobs = JobQueue(1)
    job = Job(lambda ctx: None, time.monotonic() + 600, None, None)
    ctx = JobContext(job, jobs)
    seen = []

    def on_token(t):
        ctx.check(t)
        seen.append(t)
        if len(seen) == 3:
            job.cancel("disconnect")  # what the event loop does when the client goes

    rt = Runtime(tiny_llama.model, tiny_llama.tokenizer)
    ids = tiny_llama.tokenizer.encode_chat([{"role": "user", "content": "pick up the red cup"}])
    with pytest.raises(Cancelled) as e:
        rt.generate(
            ids,
            SamplingParams(max_tokens=200, ignore_eos=True),
            build_speculation(SpecOptions(spec), tiny_llama.model),
            on_token=on_token,
        )
    assert e.value.reason == "disconnect" and len(seen) == 3 and job.tokens == 4


def test_the_queue_is_bounded_and_deadlines_apply_in_the_loop():
    from thor_app.server.jobs import Cancelled, Job, JobContext, JobQueue, QueueFull

    now = [0.0]
    jobs = JobQueue(2, clock=lambda: now[0])

    async def go():
        jobs.submit(lambda ctx: None, 10)
        jobs.submit(lambda ctx: None, 10)
        with pytest.raises(QueueFull) as e:
            jobs.submit(lambda ctx: None, 10)
        assert e.value.retry_after_s >= 1

    asyncio.run(go())
    job = Job(lambda ctx: None, 5.0, None, None)
    ctx = JobContext(job, jobs)
    ctx.check(1)
    now[0] = 6.0
    with pytest.raises(Cancelled) as e:
        ctx.check(2)
    assert e.value.reason == "timeout"


# ---- the systemd unit and the installer -----------------------------------------------------
def _unit_lines() -> list[tuple[str, str]]:
    out = []
    for line in (DEPLOY / "thor-runtime.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            out.append((k.strip(), v.strip()))
    return out


def test_unit_declares_notify_watchdog_backoff_and_hardening():
    kv = dict(_unit_lines())
    assert kv["Type"] == "notify" and kv["Restart"] == "on-failure" and int(kv["WatchdogSec"]) > 0
    assert kv["RestartMaxDelaySec"] and int(kv["StartLimitBurst"]) > 0
    for k, v in (
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("DynamicUser", "yes"),
        ("StateDirectory", "thor-runtime"),
        ("CacheDirectory", "thor-runtime"),
    ):
        assert kv[k] == v, k
    assert "MemoryDenyWriteExecute" not in kv  # PyTorch's JIT needs W+X pages
    devices = [v for k, v in _unit_lines() if k == "DeviceAllow"]
    assert any("/dev/nvmap" in d for d in devices) and any("/dev/nvhost-" in d for d in devices)
    assert any("nvidia" in d for d in devices)
    assert "thor serve --config /etc/thor-runtime/thor.toml" in kv["ExecStart"]


def test_systemd_analyze_verify_passes(tmp_path):
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    # The unit's ExecStart names the installed venv, absent here: point it at a stand-in.
    fake = tmp_path / "thor"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    unit = tmp_path / "thor-runtime.service"
    unit.write_text(
        (DEPLOY / "thor-runtime.service")
        .read_text()
        .replace("/opt/thor-runtime/venv/bin/thor", str(fake))
    )
    r = subprocess.run([exe, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    version = int(
        re.search(
            r"systemd (\d+)",
            subprocess.run([exe, "--version"], capture_output=True, text=True).stdout,
        ).group(1)
    )
    # RestartSteps / RestartMaxDelaySec (the backoff) arrived in systemd 254; older ones ignore
    # them.
    newer = {"RestartSteps", "RestartMaxDelaySec"} if version < 254 else set()
    problems = [
        ln
        for ln in (r.stdout + r.stderr).splitlines()
        if ln.strip()
        and not any(f"Unknown key '{k}'" in ln or f"Unknown key name '{k}'" in ln for k in newer)
    ]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr


def test_install_dry_run_prints_every_step_and_changes_nothing(tmp_path):
    prefix = tmp_path / "opt"
    r = subprocess.run(
        ["bash", str(DEPLOY / "install.sh"), "--dry-run", "--prefix", str(prefix)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    steps = re.findall(r"^== step (\d+):", out, re.M)
    assert steps == [str(i) for i in range(1, len(steps) + 1)] and len(steps) >= 7
    for words in (
        "venv --system-site-packages",
        "--index-url https://pypi.jetson-ai-lab.io/",
        "engines build",
        "/etc/thor-runtime/thor.toml",
        "systemd-analyze verify",
        "systemctl enable --now",
        "models pull qwen2.5-coder-0.5b-instruct",
    ):
        assert words in out, words
    assert not prefix.exists() and "nothing was changed" in out
    assert (
        subprocess.run(
            ["bash", str(DEPLOY / "install.sh"), "--bogus"], capture_output=True
        ).returncode
        == 2
    )
    # The build names its backend (the default, torch, needs no engines and exits 2) and writes
    # where the unit's service looks for engines.
    build = next(ln for ln in out.splitlines() if "engines build" in ln)
    cache = re.search(
        r"^Environment=THOR_ENGINE_CACHE=(\S+)$",
        (DEPLOY / "thor-runtime.service").read_text(),
        re.M,
    ).group(1)
    assert "--backend tensorrt" in build and f"--engine-cache {cache}" in build, build


# ---- a real process -------------------------------------------------------------------------
def test_thor_serve_process_answers_health_and_exits_0_on_sigterm(tmp_path, tiny_dirs):
    """Ready only with a passing self-test (the real one); either way /health answers, and
    SIGTERM ends the process with exit 0."""
    port = free_port()
    proc = spawn_serve(
        tmp_path,
        f'[server]\nport = {port}\n[model]\nname = "{tiny_dirs["llama"]}"\n'
        '[speculation]\nmethod = "none"\n',
    )
    try:
        status, body = wait_ready(proc, port, tmp_path)
        assert status == 200 or (status == 503 and "self-test" in body["reason"]), body
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    assert rc == 0, (tmp_path / "serve.log").read_text()
