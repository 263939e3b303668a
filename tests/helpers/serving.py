"""Helpers shared by the server tests: a hosted tiny model, self-test doubles, a ready client, the
plan `thor plan --json` computes for a request, and `thor serve` as a real process."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass

from tests.helpers.paths import ROOT
from thor_app.server.config import config_from_dict
from thor_app.server.host import Hosted


@dataclass
class FakeReport:
    passed: bool
    note: str = "2/2 parity checks"

    def summary(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}: {self.note}"

    def to_dict(self) -> dict:
        return {"passed": self.passed, "note": self.note}


def passing(loaded, backend):
    return FakeReport(True)


def failing(loaded, backend):
    return FakeReport(False, "attention max |diff| 3.1 > 1e-3")


class SlowSelftest:
    """Blocks until released: the server must say it is still self-testing meanwhile."""

    def __init__(self):
        self.release = threading.Event()

    def __call__(self, loaded, backend):
        self.release.wait(120)
        return FakeReport(True)


def hosted_loader(loaded, spec: str = "none"):
    from thor_runtime.engine.generate import Runtime
    from thor_runtime.speculative import SpecOptions, build_speculation

    hosted = Hosted(
        loaded,
        Runtime(loaded.model, loaded.tokenizer),
        build_speculation(SpecOptions(spec), loaded.model),
    )
    return lambda cfg: hosted


def long_context_copy(src, dst):
    """A copy of a tiny checkpoint with a 4k context: its 320-token BPE spells a sample world's
    plan prompt in ~1.5k tokens. -> the copy's directory."""
    import json
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["max_position_embeddings"] = 4096
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def config(**tables):
    doc = {"limits": {"max_tokens": 2048, "queue_size": 4}}
    for k, v in tables.items():
        doc[k] = {**doc.get(k, {}), **v}
    return config_from_dict(doc)


async def wait_health(
    client,
    until=lambda status, body: status == 200 or body.get("status") == "failed",
    timeout_s: float = 120.0,
):
    """Poll /health until ``until(status, body)``; returns (status, body)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while True:
        r = await client.get("/health")
        body = await r.json()
        if until(r.status, body):
            return r.status, body
        if loop.time() > end:
            raise AssertionError(f"/health stayed {r.status}: {body}")
        await asyncio.sleep(0.05)


def is_error_body(body: dict) -> bool:
    e = body.get("error")
    return (
        isinstance(e, dict)
        and isinstance(e.get("message"), str)
        and e["message"]
        and isinstance(e.get("type"), str)
        and "code" in e
    )


def direct_plan(loaded, task, world_name, max_tokens, attempts, share: int = 1):
    """What `thor plan --json` computes for the same request (same runtime, plain greedy).
    ``share``: the runtime set up for that many requests at once, as the service's is (on CUDA
    its decode forwards then take that many sequences' rows: another shape)."""
    from agent.files.loader import AGENT_DIR, load_skills, load_world, resolve_skills_path
    from agent.planner.planner import Planner
    from thor_runtime.config import PlannerSettings
    from thor_runtime.engine.generate import Runtime

    world = load_world(AGENT_DIR / "worlds" / f"{world_name}.json")
    skills = load_skills(resolve_skills_path(world, None))
    rt = Runtime(loaded.model, loaded.tokenizer)
    rt.share(share)
    # the config's goal choice, as the plan session passes it to every planner it makes
    planner = Planner(
        rt,
        loaded.tokenizer,
        max_tokens=max_tokens,
        attempts=attempts,
        goal_choice=PlannerSettings().goal_choice,
    )
    return planner.plan(task, world, skills)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_serve(tmp_path, toml: str, env_extra: dict | None = None) -> subprocess.Popen:
    cfg = tmp_path / "thor.toml"
    cfg.write_text(toml)
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
        **(env_extra or {}),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "thor_app.cli", "serve", "--config", str(cfg)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "serve.log", "w"),
        cwd=tmp_path,
    )


def http_get(port: int, path: str):
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_ready(proc, port: int, tmp_path) -> tuple[int | None, dict | None]:
    """Poll /health until the service is ready or failed (120 s at most). -> (status, body)."""
    import time

    status, body = None, None
    for _ in range(1200):
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        try:
            status, body = http_get(port, "/health")
        except OSError:
            time.sleep(0.1)
            continue
        if status == 200 or body["status"] == "failed":
            break
        time.sleep(0.1)
    return status, body
