"""Bad input, missing keys and overload get their 4xx / 503 in OpenAI's error envelope; the key
appears in no log line."""

from __future__ import annotations

import base64
import glob
import http.client
import json
import os
import struct
import threading
import zlib
from urllib.parse import urlparse

import pytest
from PIL import Image

from tests.serve.helpers import assert_envelope, call, chat_image_message, data_url, png_of


def _png_declaring(width: int, height: int) -> bytes:
    """A small real PNG whose header is patched to declare width x height (a decompression bomb's header)."""
    data = bytearray(png_of(Image.new("RGB", (8, 8), (200, 10, 10))))
    ihdr = 8 + 8  # signature, then the IHDR chunk's length and type
    data[ihdr : ihdr + 8] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr - 4 : ihdr + 13]))
    data[ihdr + 13 : ihdr + 17] = struct.pack(">I", crc)
    return bytes(data)


def _chat(image_url: str, **extra) -> dict:
    return {"model": "vlm", "messages": chat_image_message(image_url), "max_tokens": 4, **extra}


GOOD_IMAGE = data_url(png_of(Image.new("RGB", (32, 32), (0, 0, 255))))

CASES = {
    "bad base64": ("/v1/chat/completions", _chat("data:image/png;base64,@@not-base64@@"), 400),
    "bytes that are no image": ("/v1/chat/completions", _chat(data_url(b"just some text, no image" * 10)), 400),
    "gif header declaring a huge canvas": ("/v1/chat/completions", _chat(data_url(b"GIF89a? no, just text" * 10)), 413),
    "png declaring 20000x20000": ("/v1/chat/completions", _chat(data_url(_png_declaring(20000, 20000))), 413),
    "too many images": ("/v1/chat/completions", {"model": "vlm", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": GOOD_IMAGE}}] * 3 + [{"type": "text", "text": "hi"}]}]}, 400),
    "private address after DNS": ("/v1/chat/completions", _chat("https://localhost/cat.png"), 400),
    "address not on the allow-list": ("/v1/chat/completions", _chat("https://10.0.0.7/cat.png"), 400),
    "plain http": ("/v1/chat/completions", _chat("http://example.com/cat.png"), 400),
    "file url": ("/v1/chat/completions", _chat("file:///etc/passwd"), 400),
    "n = 0": ("/v1/images/generations", {"prompt": "a circle", "model": "t2i", "n": 0}, 400),
    "n = 99": ("/v1/images/generations", {"prompt": "a circle", "model": "t2i", "n": 99}, 400),
    "n over the server's max_n": ("/v1/images/generations", {"prompt": "a circle", "model": "t2i", "n": 5}, 400),
    "unknown model": ("/v1/images/generations", {"prompt": "a circle", "model": "dall-e-9"}, 404),
    "chat model on the images route": ("/v1/images/generations", {"prompt": "a circle", "model": "vlm"}, 400),
    "wrong type: n": ("/v1/images/generations", {"prompt": "a circle", "model": "t2i", "n": "two"}, 400),
    "wrong type: prompt": ("/v1/images/generations", {"prompt": 5, "model": "t2i"}, 400),
    "wrong type: messages": ("/v1/chat/completions", {"model": "vlm", "messages": "hello"}, 400),
    "unknown field": ("/v1/images/generations", {"prompt": "a circle", "model": "t2i", "steps": 50}, 400),
    "blank prompt": ("/v1/images/generations", {"prompt": "   ", "model": "t2i"}, 400),
    "url response format": ("/v1/images/generations", {"prompt": "a circle", "model": "t2i", "response_format": "url"}, 400),
    "size the model cannot make": ("/v1/images/generations", {"prompt": "a circle", "model": "t2i", "size": "1024x1024"}, 400),
    "seed out of range": ("/v1/images/generations", {"prompt": "a circle", "model": "t2i", "seed": -1}, 400),
    "max_tokens over the limit": ("/v1/chat/completions", _chat(GOOD_IMAGE, max_tokens=10**6), 400),
    "n = 2 for chat": ("/v1/chat/completions", _chat(GOOD_IMAGE, n=2), 400),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_request_gets_its_4xx_in_the_openai_envelope(serve_app, name):
    path, body, expected = CASES[name]
    status, answer, _ = call(serve_app["url"], path, body, key=serve_app["key"])
    assert_envelope(status, answer, expected)


def test_bad_json_and_oversized_bodies(serve_app):
    url, key = serve_app["url"], serve_app["key"]
    status, body, _ = call(url, "/v1/images/generations", raw=b"{not json", key=key)
    assert_envelope(status, body, 400)
    big = json.dumps({"prompt": "x" * (3 * 2**20), "model": "t2i"}).encode()
    status, body, _ = call(url, "/v1/images/generations", raw=big, key=key)
    assert_envelope(status, body, 413)
    # the same body without Content-Length (chunked): still refused at the cap
    parsed = urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    chunks = (big[i : i + 65536] for i in range(0, len(big), 65536))
    connection.request("POST", "/v1/images/generations", body=chunks, encode_chunked=True,
                       headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 413, response.read()[:200]
    connection.close()


def test_unknown_route_is_a_404_envelope(serve_app):
    status, body, _ = call(serve_app["url"], "/v1/embeddings", {"input": "x"}, key=serve_app["key"])
    assert_envelope(status, body, 404)


def test_keys_are_required_and_never_logged(serve_app):
    url, key = serve_app["url"], serve_app["key"]
    wrong = "rk-wrong-Qz81vB6nX0"
    for given in (None, wrong):
        status, body, _ = call(url, "/v1/models", key=given)
        assert_envelope(status, body, 401)
        assert body["error"]["type"] == "authentication_error"
    status, body, _ = call(url, "/v1/models", headers={"Authorization": f"Basic {base64.b64encode(key.encode()).decode()}"})
    assert status == 401
    status, body, _ = call(url, "/v1/models", key=key)
    assert status == 200 and {m["id"] for m in body["data"]} == {"t2i", "vlm", "emu3", "t2i-auto", "t2i-gumbel"}
    assert call(url, "/health")[0] == 200  # health needs no key
    import ray

    logs = ray._private.worker._global_node.get_logs_dir_path()
    files = [f for f in glob.glob(os.path.join(logs, "**", "*"), recursive=True) if os.path.isfile(f)]
    assert files
    for path in files:
        with open(path, "rb") as handle:
            text = handle.read()
        assert key.encode() not in text and wrong.encode() not in text, path


def test_overload_answers_503_with_retry_after(serve_app):
    """The vlm model takes 2 requests and queues 2: ten at once overflow it."""
    image = data_url(png_of(Image.new("RGB", (32, 32), (0, 200, 0))))
    results: list = []

    def one() -> None:
        results.append(call(serve_app["url"], "/v1/chat/completions", _chat(image, max_tokens=64, temperature=1.0),
                            key=serve_app["key"]))

    threads = [threading.Thread(target=one) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    statuses = sorted(status for status, _, _ in results)
    assert len(statuses) == 10 and set(statuses) <= {200, 503}, statuses
    assert 200 in statuses and 503 in statuses, statuses
    status, body, headers = next(r for r in results if r[0] == 503)
    assert_envelope(status, body, 503)
    assert int(headers["retry-after"]) >= 1
