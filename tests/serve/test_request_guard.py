"""The ingress's request guard on a small Starlette app with hand-made ASGI messages (no Ray):
keys as bytes, the body under its deadline, and a client that leaves as a disconnect rather
than an error (the exception Ray Serve's request proxy raises then included)."""

from __future__ import annotations

import asyncio
import logging
import os

import pytest
from ray.exceptions import TaskCancelledError
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from raydec.serve.request_guard import RequestGuard


async def _stream(request):
    async def ticks():
        for i in range(1000):
            yield f"data: {i}\n\n"
            await asyncio.sleep(0.01)

    return StreamingResponse(ticks(), media_type="text/event-stream")


async def _echo(request):
    return JSONResponse({"bytes": len(await request.body())})


def _app(guarded: bool = True, keys: set[bytes] = frozenset()) -> Starlette:
    app = Starlette(routes=[Route("/v1/stream", _stream, methods=["GET", "POST"]), Route("/v1/echo", _echo, methods=["POST"])])
    app.state.keys, app.state.max_request_bytes, app.state.body_timeout_s = set(keys), 1000, 0.3
    if guarded:
        app.add_middleware(RequestGuard)
    return app


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]] = ()) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1", "method": method,
            "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": list(headers),
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "scheme": "http"}


def _run(app, scope, messages, then=None) -> list[dict]:
    """Call ``app`` with ``messages`` from receive, then ``then()`` (a coroutine function: what the
    receive does after them); returns what the app sent."""
    sent, queue = [], list(messages)

    async def receive():
        if queue:
            return queue.pop(0)
        return await then()

    async def send(message):
        sent.append(message)

    asyncio.run(asyncio.wait_for(app(scope, receive, send), timeout=30))
    return sent


async def _ray_cancels_the_request():
    await asyncio.sleep(0.05)
    raise TaskCancelledError()  # what Ray Serve's receive proxy raises once the proxy cancelled the request


def test_a_streaming_response_ends_quietly_when_ray_cancels_the_receive(caplog):
    caplog.set_level(logging.INFO, logger="raydec.serve")
    sent = _run(_app(), _scope("GET", "/v1/stream"), [], then=_ray_cancels_the_request)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with pytest.raises(BaseException) as raised:  # unguarded, the same receive escapes as an error
        _run(_app(guarded=False), _scope("GET", "/v1/stream"), [], then=_ray_cancels_the_request)
    assert "TaskCancelledError" in repr(raised.value)


def test_keys_are_compared_as_bytes():
    app = _app(keys={"clé".encode()})
    for header, status in ((b"Bearer \xe9", 401), ("Bearer clé".encode(), 200), (b"Bearer cl\xe9", 401), (b"Basic x", 401)):
        sent = _run(app, _scope("POST", "/v1/echo", [(b"authorization", header)]), [{"type": "http.request", "body": b"{}"}])
        assert sent[0]["status"] == status, header


def test_the_body_arrives_whole_or_gets_its_4xx(caplog):
    app = _app()
    parts = [{"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.request", "body": b"cd"}]
    sent = _run(app, _scope("POST", "/v1/echo"), parts)
    assert sent[0]["status"] == 200 and sent[1]["body"] == b'{"bytes":4}'

    async def never():
        await asyncio.sleep(3600)

    sent = _run(app, _scope("POST", "/v1/echo"), parts[:1], then=never)
    assert sent[0]["status"] == 408 and b"body_timeout_s=0.3" in sent[1]["body"]
    sent = _run(app, _scope("POST", "/v1/echo", [(b"content-length", b"5000")]), parts)
    assert sent[0]["status"] == 413
    sent = _run(app, _scope("POST", "/v1/echo"), [{"type": "http.request", "body": b"x" * 1001}])
    assert sent[0]["status"] == 413
    caplog.set_level(logging.INFO, logger="raydec.serve")
    assert _run(app, _scope("POST", "/v1/echo"), parts[:1] + [{"type": "http.disconnect"}]) == []  # nobody to answer
    assert [r.levelname for r in caplog.records] == ["INFO"] and "left before its request body" in caplog.records[0].message


def test_a_uvicorn_server_with_the_head_deadline_cuts_off_a_slow_head(monkeypatch):
    """The proxy callback the manifests name, then a real uvicorn server built as Ray Serve's
    proxy builds it (``http="auto"``): a complete request is answered, a head still arriving
    after the deadline gets a 408 and a closed connection."""
    import importlib
    import socket
    import threading
    import time
    from pathlib import Path

    import uvicorn
    import uvicorn.config
    import yaml

    from raydec.serve import http_guard

    manifest = Path(__file__).resolve().parents[2] / "cluster" / "kuberay" / "rayservice.yaml"
    env = {e["name"]: e.get("value") for e in yaml.safe_load(manifest.read_text())["spec"]["rayClusterConfig"]["headGroupSpec"]
           ["template"]["spec"]["containers"][0]["env"]}
    assert env[http_guard.PROXY_CALLBACK_ENV] == http_guard.PROXY_CALLBACK
    module, _, name = http_guard.PROXY_CALLBACK.partition(":")
    monkeypatch.setitem(uvicorn.config.HTTP_PROTOCOLS, "auto", uvicorn.config.HTTP_PROTOCOLS["auto"])
    monkeypatch.setenv(http_guard.HEADER_TIMEOUT_ENV, "1.0")
    assert getattr(importlib.import_module(module), name)() == []

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app(guarded=False), host="127.0.0.1", port=port, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            time.sleep(1.5)  # an idle keep-alive connection is not a slow head
            sock.sendall(b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            started = time.monotonic()
            for byte in b"GET /v1/stream HTTP/1.1\r\nHost: x\r\n":
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.2)
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 408") and b'"code": "timeout"' in answer, answer
            assert 1.0 <= time.monotonic() - started < 5.0
            assert sock.recv(4096) == b""  # closed
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_proxy_callback_imports_no_torch():
    """Serve's proxies import the callback while they start, under a 5 s readiness check: it must
    stay light (importing the serve package's app pulled torch in, over 4 s on a loaded 2-core machine)."""
    import subprocess
    import sys

    code = ("import sys, raydec.serve.http_guard as g; g.proxy_callback(); "
            "print(sorted(m for m in ('torch', 'transformers', 'raydec.api', 'raydec.serve.app') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAYDEC_HTTP_HEADER_TIMEOUT_S": "5"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
