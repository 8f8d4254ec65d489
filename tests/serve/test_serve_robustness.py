"""Requests that used to reach a 5xx or leave state behind: each is a 4xx in OpenAI's envelope,
leaves nothing in the replica, and is counted; a slow client is cut off at the configured
deadline while the app keeps answering others; clients that leave log no error."""

from __future__ import annotations

import glob
import http.client
import json
import os
import socket
import threading
import time
from urllib.parse import urlparse

from PIL import Image

from tests.serve.helpers import assert_envelope, call, chat_image_message, data_url, png_of, stats

IMAGE = data_url(png_of(Image.new("RGB", (32, 32), (200, 0, 0))))


def _raw(url: str, request: bytes, timeout_s: float = 60) -> tuple[int, dict]:
    """Send raw request bytes; (status, JSON body)."""
    parsed = urlparse(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout_s) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), None)
            if length is not None and len(body) >= length:
                break
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.partition(b"\r\n\r\n")[2] or b"{}")


def _settled(app: dict, model: str, key: str, value: int, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while (now := stats(app, model))[key] != value and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


def test_a_non_ascii_api_key_is_a_401_not_a_500(serve_app):
    host = urlparse(serve_app["url"]).netloc
    for key in (b"Bearer \xe9", "Bearer clé-\u20ac".encode()):
        status, body = _raw(serve_app["url"], b"GET /v1/models HTTP/1.1\r\nHost: " + host.encode() + b"\r\nAuthorization: " + key
                            + b"\r\nConnection: close\r\n\r\n")
        assert_envelope(status, body, 401)


def test_a_lone_surrogate_in_any_text_is_a_400_naming_its_field(serve_app):
    url, key = serve_app["url"], serve_app["key"]
    broken = "a red circle \ud800 on the left"
    chat = {"model": "vlm", "max_tokens": 4, "messages": chat_image_message(IMAGE, broken)}
    cases = [
        ("/v1/chat/completions", chat, "messages.0.content.1.text"),
        ("/v1/chat/completions", {"model": "vlm", "max_tokens": 4, "messages": [{"role": "user", "content": broken}]}, "messages.0.content"),
        ("/v1/chat/completions", {**chat, "messages": chat_image_message(IMAGE), "stop": [broken]}, "stop.0"),
        ("/v1/images/generations", {"prompt": "a circle", "model": "t2i", "negative_prompt": broken}, "negative_prompt"),
        ("/v1/images/generations", {"prompt": broken, "model": "t2i"}, "prompt"),
    ]
    for path, body, param in cases:
        status, answer, _ = call(url, path, raw=json.dumps(body).encode(), key=key)  # json.dumps writes \ud800 as an escape
        assert_envelope(status, answer, 400, param)
        assert "surrogate" in answer["error"]["message"], answer


def test_a_request_the_engine_refuses_leaves_no_watcher(serve_app):
    before = _settled(serve_app, "t2i", "following", 0)
    negative = " ".join(["red"] * 600)  # too many positions for the model: the replica refuses it at submit
    status, body, _ = call(serve_app["url"], "/v1/images/generations", {"prompt": "a circle", "model": "t2i",
                                                                         "negative_prompt": negative}, key=serve_app["key"])
    assert_envelope(status, body, 400)
    after = _settled(serve_app, "t2i", "following", 0, timeout_s=5)
    assert after["following"] == 0 and after["active_rows"] == 0 and after["queued_rows"] == 0, after
    assert after["rows"] == before["rows"]


def test_a_chat_that_ends_before_any_speculative_step_is_counted(serve_app):
    before = stats(serve_app, "vlm")
    status, body, _ = call(serve_app["url"], "/v1/chat/completions",
                           {"model": "vlm", "messages": chat_image_message(IMAGE), "max_tokens": 1, "seed": 3}, key=serve_app["key"])
    assert status == 200 and body["usage"]["completion_tokens"] == 1, body
    after = _settled(serve_app, "vlm", "rows", before["rows"] + 1)
    assert after["rows"] == before["rows"] + 1 and after["output_tokens"] == before["output_tokens"] + 1, (before, after)
    assert after["following"] == 0


def test_a_client_sending_headers_a_byte_a_second_is_cut_off_while_others_are_answered(serve_app):
    timeout_s = serve_app["config"].limits.header_timeout_s
    parsed = urlparse(serve_app["url"])
    head = f"GET /v1/models HTTP/1.1\r\nHost: {parsed.netloc}\r\nAuthorization: Bearer {serve_app['key']}\r\n\r\n".encode()
    outcome: dict = {}

    def slow_client() -> None:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout_s + 60) as sock:
            started = time.monotonic()
            try:
                for byte in head[:-1]:  # never completes its head
                    sock.sendall(bytes([byte]))
                    time.sleep(1.0)
                    if time.monotonic() - started > timeout_s + 30:
                        break
            except OSError:  # the server closed the connection under a send
                pass
            answer = b""
            try:
                while chunk := sock.recv(4096):
                    answer += chunk
            except OSError:
                pass
            outcome.update(seconds=time.monotonic() - started, answer=answer)

    thread = threading.Thread(target=slow_client)
    thread.start()
    time.sleep(1.0)
    served = []
    while thread.is_alive() and len(served) < 50:  # the app answers others while the slow client trickles
        served.append(call(serve_app["url"], "/v1/models", key=serve_app["key"])[0])
        time.sleep(0.2)
    thread.join(timeout_s + 90)
    assert served and set(served) == {200}, served
    assert timeout_s <= outcome["seconds"] < timeout_s + 20, outcome["seconds"]
    assert outcome["answer"].startswith(b"HTTP/1.1 408"), outcome["answer"][:200]
    assert json.loads(outcome["answer"].partition(b"\r\n\r\n")[2])["error"]["code"] == "timeout"


def test_a_body_slower_than_its_timeout_is_a_408(serve_app):
    timeout_s = serve_app["config"].limits.body_timeout_s
    parsed = urlparse(serve_app["url"])
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout_s + 60)
    connection.putrequest("POST", "/v1/images/generations")
    for name, value in (("Authorization", f"Bearer {serve_app['key']}"), ("Content-Type", "application/json"),
                        ("Content-Length", "100")):
        connection.putheader(name, value)
    connection.endheaders(b'{"prompt": ')  # 11 of the 100 bytes, then nothing
    started = time.monotonic()
    response = connection.getresponse()
    body = json.loads(response.read())
    assert response.status == 408 and body["error"]["code"] == "timeout", body
    assert timeout_s <= time.monotonic() - started + 1.0 < timeout_s + 20
    connection.close()


def _log_sizes() -> dict[str, int]:
    """Every file of the cluster's logs (Serve's and each worker's stdout and stderr): its size now."""
    import ray

    logs = ray._private.worker._global_node.get_logs_dir_path()
    files = [f for f in glob.glob(os.path.join(logs, "**", "*"), recursive=True) if os.path.isfile(f)]
    return {path: os.path.getsize(path) for path in files}


def _written_since(sizes: dict[str, int]) -> str:
    text = []
    for path in _log_sizes():
        with open(path, "rb") as handle:
            handle.seek(sizes.get(path, 0))
            text.append(handle.read().decode(errors="replace"))
    return "".join(text)


def test_clients_that_leave_log_no_error(serve_app):
    """Clients leave mid-body, while decoding, mid-stream: at most one INFO line each, no error."""
    url, key = serve_app["url"], serve_app["key"]
    parsed = urlparse(url)
    sizes = _log_sizes()
    leaves = 24
    for i in range(leaves):
        streamed = i % 2 == 0
        if i % 4 < 2:
            path, body = "/v1/chat/completions", {"model": "vlm", "max_tokens": 48, "stream": streamed, "seed": i,
                                                  "messages": chat_image_message(IMAGE)}
        else:
            path, body = "/v1/images/generations", {"model": "t2i", "prompt": "a red circle", "stream": streamed,
                                                    "partial_images": 2, "seed": i, "method": "ar"}
        data = json.dumps(body).encode()
        with socket.create_connection((parsed.hostname, parsed.port), timeout=60) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nAuthorization: Bearer {key}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode())
            if i % 6 == 0:
                sock.sendall(data[: len(data) // 2])  # leaves mid-body
            else:
                sock.sendall(data)
                if streamed and i % 3 == 1:
                    sock.recv(4096)  # leaves mid-stream, after the first bytes of the answer
            time.sleep(0.1 * (i % 5))
    for model in ("vlm", "t2i"):
        _settled(serve_app, model, "following", 0)
    time.sleep(2.0)  # log lines reach the files
    text = _written_since(sizes)
    bad = [line for line in text.splitlines() if "unexpected error" in line or "Traceback" in line or " ERROR " in line]
    assert not bad, "\n".join(bad[:20])
    assert text.count("a client left") <= leaves
