"""Helpers shared by the server tests: a hosted tiny model, self-test doubles, a ready client."""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

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

    hosted = Hosted(loaded, Runtime(loaded.model, loaded.tokenizer), build_speculation(SpecOptions(spec), loaded.model))
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


async def wait_health(client, until=lambda status, body: status == 200 or body.get("status") == "failed",
                      timeout_s: float = 120.0):
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
    return isinstance(e, dict) and isinstance(e.get("message"), str) and e["message"] \
        and isinstance(e.get("type"), str) and "code" in e
