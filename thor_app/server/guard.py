"""What keeps a web page in the robot's browser (or any page it visits) from using the service.

A page may POST ``text/plain`` to any origin without a CORS preflight (a "simple request"), so
without a key a page could start generations: every POST must say ``application/json``, which
a browser only sends cross-origin after a preflight this server never answers. A page may also
rebind its own DNS name to 127.0.0.1 and then read the answers as same-origin; its requests
still carry its own name in ``Host``, so only loopback names and the configured ones are served.
"""

from __future__ import annotations

from pathlib import Path

from thor_app.server.errors import ApiError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def host_name(header: str) -> str:
    """``Host`` header -> the lowercase name without the port (``[::1]:8700`` -> ``::1``)."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def allowed_hosts(bind_host: str, extra: tuple[str, ...]) -> frozenset[str]:
    """Loopback names, the configured ones, and the address bound when it is a specific one."""
    names = set(LOOPBACK_NAMES) | set(extra)
    if bind_host not in ("0.0.0.0", "::", ""):
        names.add(host_name(bind_host))
    return frozenset(names)


def check_host(header: str | None, allowed: frozenset[str]) -> None:
    # A request with no Host at all (HTTP/1.0 tools) is no browser's: browsers always send it.
    if header is not None and host_name(header) not in allowed:
        raise ApiError(
            403,
            f"Host {header!r} is not served here (server.allowed_hosts lists the names "
            "besides loopback)",
            "host_not_allowed",
        )


def check_json_type(content_type: str) -> None:
    """``content_type``: the media type without parameters (aiohttp's ``request.content_type``)."""
    if content_type != "application/json":
        raise ApiError(
            415,
            f"POST bodies must be Content-Type: application/json, got {content_type!r}",
            "unsupported_media_type",
        )


def model_names(model_id: str, source) -> frozenset[str]:
    """The names a request's ``model`` may give: the configured name and the served file's name
    (with and without its suffix). Never the path: it does not leave the server."""
    p = Path(str(source))
    return frozenset({model_id, p.name, p.stem} - {""})


def check_model(body: dict, names: frozenset[str]) -> None:
    m = body.get("model")
    if m is None:
        return
    if not isinstance(m, str):
        raise ApiError(400, "model must be a string", "invalid_request", "model")
    if m not in names:
        raise ApiError(
            404,
            f"the model {m[:80]!r} is not served here; GET /v1/models lists the one that is",
            "model_not_found",
            "model",
        )
