"""Small helpers for the serving tests: PNG bytes, data URLs, raw HTTP calls, the app's stats."""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np
from PIL import Image


def png_of(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def pixels(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def call(url: str, path: str, body: Any = None, key: str | None = None, raw: bytes | None = None,
         headers: dict[str, str] | None = None, method: str | None = None) -> tuple[int, dict, dict]:
    """One HTTP request; returns (status, JSON body, headers with lower-case names)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url + path, data=data, method=method or ("POST" if data is not None else "GET"))
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read() or b"{}"), {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as error:
        text = error.read()
        try:
            payload = json.loads(text)
        except ValueError:
            payload = {"raw": text.decode(errors="replace")}
        return error.code, payload, {k.lower(): v for k, v in error.headers.items()}


def stats(app: dict, model: str) -> dict:
    status, body, _ = call(app["url"], "/v1/raydec/stats", key=app["key"])
    assert status == 200, body
    return body[model]


def chat_image_message(image_url: str, text: str = "describe the image .") -> list[dict]:
    """One user turn: the image, then the question (the order caption_images uses)."""
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": text}]}]


def assert_envelope(status: int, body: dict, expected: int, param: str | None = None) -> None:
    """``status`` is ``expected`` and ``body`` OpenAI's error envelope (naming ``param`` when given)."""
    assert status == expected, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
