"""`thor serve [--config FILE] [--host H] [--port P]` — the runtime as a local HTTP service.

The config (TOML; --config, else $THOR_CONFIG, else defaults) is checked before anything
binds: a typo exits 2 in milliseconds. The socket is bound next, so /health answers 503 with
the reason while the model loads, warms up and runs its self-test. SIGTERM (or Ctrl-C) stops
accepting, answers queued requests 503, lets in-flight ones finish for ``server.shutdown_grace_s``
(once), cuts what is left with a proper error and exits 0.
"""

from __future__ import annotations

import logging
import sys


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve plans and OpenAI-compatible chat over a local HTTP API")
    p.add_argument(
        "--config",
        default=None,
        help="TOML config file (default: $THOR_CONFIG, else built-in defaults)",
    )
    p.add_argument(
        "--host", default=None, help="address to bind (default 127.0.0.1; config server.host)"
    )
    p.add_argument("--port", type=int, default=None, help="port (default 8700; config server.port)")
    p.add_argument(
        "--log-requests",
        default=None,
        metavar="DIR",
        help="keep each plan request and the model's answer in DIR, for `thor calib gen-data "
        "--from-log` (default: config planner.log_requests, '' = off)",
    )
    p.set_defaults(func=run)


def serve_config(args):
    """The config file (or the defaults) with the command line over it."""
    from dataclasses import replace

    from thor_app.assembly import with_settings
    from thor_app.server.config import load_config

    cfg = load_config(args.config).with_overrides(args.host, args.port)  # replace() re-validates
    if args.log_requests is not None:
        runtime = with_settings(cfg.runtime, planner__log_requests=args.log_requests)
        cfg = replace(cfg, runtime=runtime)
    return cfg


def run(args) -> int:
    import asyncio

    cfg = serve_config(args)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="thor serve: %(levelname)s %(message)s"
    )
    cfg.auth.load_keys()  # a missing keys file fails now, not at the first request
    return asyncio.run(serve(cfg))


async def serve(cfg) -> int:
    import asyncio
    import signal

    from aiohttp import web

    from thor_app.server.app import drain, make_app
    from thor_runtime.errors import ThorError

    log = logging.getLogger("thor.serve")
    app = make_app(cfg)
    # The drain below does the waiting (once, for shutdown_grace_s); by cleanup every request has
    # been answered, so aiohttp's own shutdown wait only closes idle connections.
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.server.host, cfg.server.port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise ThorError(
            f"cannot listen on {cfg.server.host}:{cfg.server.port}: {e.strerror or e}"
        ) from None
    log.info("listening on http://%s:%d (config: %s)", cfg.server.host, cfg.server.port, cfg.source)
    if cfg.server.host not in ("127.0.0.1", "localhost", "::1") and not cfg.auth.api_keys_file:
        log.warning(
            "listening beyond loopback (%s) with no API keys: anyone who can reach it can plan",
            cfg.server.host,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping: finishing in-flight requests (up to %.0f s)", cfg.server.shutdown_grace_s)
    for s in list(runner.sites):  # stop accepting: new connections are refused from here
        await s.stop()
    await drain(app, cfg.server.shutdown_grace_s)
    await runner.cleanup()
    log.info("stopped")
    return 0
