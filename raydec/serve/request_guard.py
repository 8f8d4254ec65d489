"""What every request passes before a route sees it (a plain ASGI middleware of the ingress app).

- API keys on /v1 routes (``Authorization: Bearer``), compared in constant time as bytes, so a
  header of any bytes is a 401, never an error.
- A POST's body is read here, within ``limits.max_request_bytes`` (a 413, before reading when
  Content-Length says so) and ``limits.body_timeout_s`` (a 408), then handed to the route.
- A client that goes away is a disconnect, not an error: Ray Serve's request proxy raises when
  the proxy cancels a request whose client left; the route (a streaming response listening for
  the disconnect) gets ``http.disconnect`` instead, and one INFO line is all the log says.

The app's state carries the settings (``Ingress`` sets them): ``keys`` (set of UTF-8 bytes,
empty: open access), ``max_request_bytes``, ``body_timeout_s``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any, Awaitable, Callable

from fastapi.responses import JSONResponse
from ray.exceptions import TaskCancelledError
from starlette.requests import ClientDisconnect

from raydec.serve.errors import APIError

logger = logging.getLogger("raydec.serve")

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

#: what a receive raises when the request was cancelled because its client left
CLIENT_GONE = (ClientDisconnect, TaskCancelledError)


def answer(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def known_key(given: bytes, keys: set[bytes]) -> bool:
    """Whether ``given`` is one of ``keys``, in constant time (every key compared)."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key)
    return found


def key_refusal(headers: list[tuple[bytes, bytes]], keys: set[bytes]) -> APIError | None:
    """A 401 unless the raw headers carry ``Authorization: Bearer <one of keys>``."""
    header = next((value for name, value in headers if name == b"authorization"), b"")
    scheme, _, given = header.partition(b" ")
    if scheme.lower() == b"bearer" and known_key(given.strip(), keys):
        return None
    return APIError(401, "no API key given (Authorization: Bearer <key>)" if not header else "the API key is not valid",
                    code="invalid_api_key")


def gone_as_disconnect(receive: Receive) -> Receive:
    """``receive``, where a client that left reads as ``http.disconnect``."""

    async def receive_or_disconnect() -> dict[str, Any]:
        try:
            return await receive()
        except CLIENT_GONE:
            return {"type": "http.disconnect"}

    return receive_or_disconnect


async def read_body(headers: list[tuple[bytes, bytes]], receive: Receive, limit: int) -> bytes | APIError:
    """The whole body (at most ``limit`` bytes), or the 4xx that refuses it; ClientDisconnect
    when the client leaves first."""
    length = next((value for name, value in headers if name == b"content-length"), None)
    if length is not None:
        if not length.isdigit():
            return APIError(400, f"Content-Length: {length[:20].decode('latin-1')!r} is not a number", code="invalid_value")
        if int(length) > limit:
            return APIError(413, f"the request body is {int(length)} bytes, more than limits.max_request_bytes={limit}",
                            code="request_too_large")
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        body += message.get("body", b"")
        if len(body) > limit:
            return APIError(413, f"the request body is more than limits.max_request_bytes={limit} bytes", code="request_too_large")
        if not message.get("more_body", False):
            return bytes(body)


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives ``body`` first, then whatever ``receive`` gives (the disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return replayed


class RequestGuard:
    """ASGI middleware: keys, the body under its limits, clients that leave as disconnects."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        headers = scope["headers"]
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):  # a route prefix
            path = path[len(root):]
        if state.keys and path.startswith("/v1"):
            refused = key_refusal(headers, state.keys)
            if refused is not None:
                await answer(refused)(scope, receive, send)
                return
        receive = gone_as_disconnect(receive)
        if scope["method"] == "POST":
            try:
                body = await asyncio.wait_for(read_body(headers, receive, state.max_request_bytes), timeout=state.body_timeout_s)
            except asyncio.TimeoutError:
                body = APIError(408, f"the request body took more than limits.body_timeout_s={state.body_timeout_s:g} s", code="timeout")
            except ClientDisconnect:
                logger.info("a client left before its request body arrived (POST %s)", scope["path"])
                return
            if isinstance(body, APIError):
                await answer(body)(scope, receive, send)
                return
            receive = replay(body, receive)
        await self.app(scope, receive, send)
