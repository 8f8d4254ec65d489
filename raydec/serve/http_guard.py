"""A deadline for a request's head, in Ray Serve's HTTP proxy.

Ray Serve's proxy runs uvicorn, which has no timeout for reading a request's line and headers:
its keep-alive timer restarts on every byte, so a client that sends its headers one byte a
second holds a connection (and a file descriptor) for as long as it likes. ASGI middleware
cannot help, since the app is called only once the head is complete.

``proxy_callback`` is a Ray Serve HTTP proxy callback (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``
names it; ``raydec serve`` sets it for the Serve instance it starts, through the controller's
environment, which the proxies inherit). It runs in each proxy before the proxy builds its
server and makes uvicorn's default HTTP protocol a subclass with one timer per connection:

    armed     when the connection opens, and at the first byte of each later request
    disarmed  when the request's head is complete (the request's body is the app's business:
              the ingress reads it under ``limits.body_timeout_s``)
    expired   the head did not arrive within ``RAYDEC_HTTP_HEADER_TIMEOUT_S`` seconds: a 408 in
              OpenAI's error envelope, then the connection is closed

Everything else (parsing, keep-alive, streaming responses) is uvicorn's own code.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

logger = logging.getLogger("raydec.serve")

HEADER_TIMEOUT_ENV = "RAYDEC_HTTP_HEADER_TIMEOUT_S"
#: the import path Ray Serve's proxies call (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``)
PROXY_CALLBACK = "raydec.serve.http_guard:proxy_callback"
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"


def proxy_environment(header_timeout_s: float) -> dict[str, str]:
    """The environment variables that give a Serve instance's proxies the head deadline."""
    return {PROXY_CALLBACK_ENV: PROXY_CALLBACK, HEADER_TIMEOUT_ENV: repr(float(header_timeout_s))}


def _timeout_response(seconds: float) -> bytes:
    body = json.dumps({"error": {"message": f"the request's headers took more than limits.header_timeout_s={seconds:g} s",
                                 "type": "timeout_error", "param": None, "code": "timeout"}}).encode()
    head = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n")
    return head + body


def with_header_deadline(base: type, header_timeout_s: float) -> type:
    """``base`` (one of uvicorn's HTTP protocol classes) with a deadline for each request's head."""

    class HeaderDeadlineProtocol(base):  # type: ignore[misc, valid-type]
        header_timeout = header_timeout_s

        def connection_made(self, transport: Any) -> None:
            self._head_timer: Any = None
            self._head_of: Any = None  # the request whose head arrived last (uvicorn's cycle)
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # the first byte of the connection's next request
            super().data_received(data)
            if self.cycle is not self._head_of or self.transport.get_protocol() is not self:  # head complete, or upgraded
                self._head_of = self.cycle
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_expired(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            peer = self.transport.get_extra_info("peername")
            logger.info("closed a connection from %s: its request's head took more than %g s", peer, self.header_timeout)
            self.transport.write(_timeout_response(self.header_timeout))
            self.transport.close()

    HeaderDeadlineProtocol.__name__ = HeaderDeadlineProtocol.__qualname__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadlineProtocol


def install(header_timeout_s: float) -> type:
    """Make uvicorn's ``http="auto"`` protocol (the one Ray Serve's proxy uses) keep the head
    deadline, for every server built after this call in this process. Returns the class."""
    import uvicorn.config
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    guarded = with_header_deadline(AutoHTTPProtocol, header_timeout_s)
    globals()["GuardedHTTPProtocol"] = guarded
    uvicorn.config.HTTP_PROTOCOLS["auto"] = f"{__name__}:GuardedHTTPProtocol"
    return guarded


def proxy_callback() -> list:
    """Ray Serve's HTTP proxy callback: installs the head deadline; adds no middleware."""
    seconds = float(os.environ.get(HEADER_TIMEOUT_ENV, "0") or 0)
    if seconds > 0:
        install(seconds)
        logger.info("raydec: HTTP request heads must arrive within %g s", seconds)
    return []
