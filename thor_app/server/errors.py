"""The one error shape every route answers with: OpenAI's
``{"error": {message, type, param, code}}``."""

from __future__ import annotations

import json

from aiohttp import web

# HTTP status -> OpenAI error type
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout",
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        headers: dict | None = None,
        extra: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}
        self.extra = extra or {}  # more top-level keys (the plan report on a 422)


def error_body(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> dict:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(
                status, "server_error" if status >= 500 else "invalid_request_error"
            ),
            "param": param,
            "code": code,
        }
    }


def error_response(e: ApiError) -> web.Response:
    body = {**error_body(e.status, e.message, e.code, e.param), **e.extra}
    return web.json_response(body, status=e.status, headers=e.headers, dumps=json.dumps)


def bad_request(message: str, code: str = "invalid_request", param: str | None = None) -> ApiError:
    return ApiError(400, message, code, param)
