"""`thor serve` on an engine backend: the config takes every backend engines offers, and the
service self-tests and serves the very backend object it attached."""

from __future__ import annotations

import pytest

from engines import BACKEND_NAMES
from tests.helpers.serving import config, wait_health
from thor_app.server.app import make_app
from thor_app.server.config import config_from_dict
from thor_runtime.errors import ThorError

MSG = [{"role": "user", "content": "pick up the red cup"}]


def test_config_accepts_every_engine_backend_and_names_the_choices():
    from engines.backend import BACKENDS

    assert BACKEND_NAMES == tuple(BACKENDS)
    for name in BACKENDS:
        assert config_from_dict({"engine": {"backend": name}}).engine.backend == name
        assert (
            config_from_dict({"model": {"backend": name}}).engine.backend == name
        )  # the earlier spelling
    with pytest.raises(ThorError) as e:
        config_from_dict({"engine": {"backend": "openvino"}}, "x.toml")
    msg = str(e.value)
    assert (
        msg.startswith("x.toml") and "'openvino'" in msg and "torch, onnxruntime, tensorrt" in msg
    )


@pytest.mark.asyncio
async def test_onnxruntime_service_selftests_what_it_serves_and_answers_like_torch(
    aiohttp_client, tiny_dirs, tiny_llama, tmp_path, monkeypatch
):
    pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxruntime) is not installed")
    from thor_app.server.host import default_selftest
    from thor_runtime.engine.generate import Runtime
    from thor_runtime.engine.sampling import SamplingParams
    from thor_runtime.speculative import PLAIN

    monkeypatch.setenv("THOR_ENGINE_CACHE", str(tmp_path))
    seen = []

    def selftest(loaded, backend):  # the real self-test, recording what it was given
        seen.append((backend, loaded.model.backend))
        return default_selftest(loaded, backend)

    app = make_app(
        config(model={"name": str(tiny_dirs["llama"]), "backend": "onnxruntime"}),
        selftest=selftest,
        watchdog_s=None,
    )
    client = await aiohttp_client(app)
    status, body = await wait_health(client)
    assert status == 200, body
    body = await (await client.get("/health/report")).json()
    assert body["backend"] == "onnxruntime" and body["selftest_report"]["backend"] == "onnxruntime"
    ((served, attached),) = seen
    assert served is attached and type(served).__name__ == "OrtBackend"
    assert [p.name for p in tmp_path.iterdir()]  # engines went to $THOR_ENGINE_CACHE
    r = await client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 16})
    assert r.status == 200
    got = (await r.json())["choices"][0]["message"]["content"]
    ids = tiny_llama.tokenizer.encode_chat(MSG)
    want = (
        Runtime(tiny_llama.model, tiny_llama.tokenizer)
        .generate(ids, SamplingParams(max_tokens=16), PLAIN)
        .text
    )
    assert got == want and got
