"""raydec.serve.media: data / https / s3 image URLs, size checks before decoding, SSRF guards.

No mocks: the https refusals run the real resolver, and the response reader talks to a real
http.server on 127.0.0.1 over a plain HTTPConnection (the fetcher itself refuses loopback).
"""

from __future__ import annotations

import base64
import http.client
import http.server
import io
import resource
import threading
import time
import zlib
from typing import Iterator

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from raydec.io.images import ImageError, check_image_pixels, image_header_pixels
from raydec.serve.media import (
    MediaConfig,
    MediaError,
    check_image_count,
    is_public_address,
    load_image_url,
    request_image_bytes,
)

PARAM = "messages[0].content[1].image_url.url"


def png_bytes(height: int = 6, width: int = 5, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)  # [H, W, 3]
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def declaring(width: int, height: int, png: bytes) -> bytes:
    """`png` with its IHDR patched to declare width x height (CRC fixed), pixel data unchanged."""
    patched = bytearray(png)
    assert patched[12:16] == b"IHDR"
    patched[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    patched[29:33] = zlib.crc32(bytes(patched[12:29])).to_bytes(4, "big")
    return bytes(patched)


def refusal(url: str, config: MediaConfig) -> MediaError:
    with pytest.raises(MediaError) as caught:
        load_image_url(url, config, param=PARAM)
    assert caught.value.param == PARAM and str(caught.value).startswith(PARAM)
    return caught.value


# ---- data URLs and size checks ----------------------------------------------------------------


def test_png_data_url_round_trips_to_rgb():
    png = png_bytes()
    image = load_image_url(data_url(png), MediaConfig(), param=PARAM)
    assert image.mode == "RGB" and image.size == (5, 6)
    np.testing.assert_array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(png)).convert("RGB")))


def test_bad_base64_is_invalid_image_and_payload_not_echoed():
    error = refusal("data:image/png;base64," + "QUJD!!" * 1000, MediaConfig())
    assert (error.status, error.code) == (400, "invalid_image") and "base64" in str(error)
    assert "QUJD!!" * 5 not in str(error) and len(str(error)) < 200  # at most ~40 chars of the URL


def test_non_base64_or_non_image_data_url_is_refused():
    assert refusal("data:text/plain;base64,QUJD", MediaConfig()).code == "invalid_image"
    assert refusal("data:image/png,rawbytes", MediaConfig()).code == "invalid_image"


def test_base64_of_non_image_bytes_is_invalid_image():
    error = refusal(data_url(b"this is plain text, not a picture"), MediaConfig())
    assert (error.status, error.code) == (400, "invalid_image")
    assert "not a decodable image" in str(error)


def test_header_declaring_20000x20000_is_refused_without_decoding():
    bomb = declaring(20000, 20000, png_bytes(400, 380))  # ~450 KB of real pixel data
    assert 300_000 < len(bomb) < 600_000
    assert image_header_pixels(bomb, field="image") == (20000, 20000)  # past PIL's own bomb limit
    rss_before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    with pytest.raises(ImageError, match=r"image: image declares 20000x20000 = 400000000 pixels, more than max_image_pixels=16777216"):
        check_image_pixels(bomb, 16_777_216, field="image")
    error = refusal(data_url(bomb), MediaConfig())
    assert time.perf_counter() - started < 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kb < 100_000  # a decode would need 1.2 GB
    assert (error.status, error.code) == (413, "image_too_large") and "20000x20000" in str(error)


def test_header_reader_names_field_for_non_images():
    with pytest.raises(ImageError, match=r"^photo: 5 bytes .* are not an image"):
        image_header_pixels(b"hello", field="photo")
    assert check_image_pixels(png_bytes(), 30, field="photo") == (5, 6)


def test_oversized_payload_is_413_before_base64_decoding():
    config = MediaConfig(max_image_bytes=1000)
    error = refusal("data:image/png;base64," + "A" * 4000 + "!", config)  # invalid base64, but too big first
    assert (error.status, error.code) == (413, "image_too_large") and "max_image_bytes=1000" in str(error)


# ---- schemes, allow-list, addresses ------------------------------------------------------------


def test_http_and_other_schemes_are_refused():
    config = MediaConfig(allowed_domains=["example.com"])
    error = refusal("http://example.com/cat.png", config)
    assert (error.status, error.code) == (400, "media_not_allowed") and "http://" in str(error)
    for url in ("file:///etc/passwd", "ftp://example.com/a.png", "gopher://example.com/", "/etc/passwd"):
        error = refusal(url, config)
        assert error.code == "media_not_allowed" and "accepted are" in str(error)


def test_https_off_by_default_and_host_must_be_on_the_allow_list():
    assert "allowed_domains is empty" in str(refusal("https://example.com/a.png", MediaConfig()))
    config = MediaConfig(allowed_domains=["images.example.com", "*.cdn.example.org"])
    for url in ("https://evil.example/a.png", "https://example.com/a.png", "https://cdn.example.org/a.png",
                "https://images.example.com.evil.example/a.png", "https://user:pw@images.example.com/a.png"):
        assert refusal(url, config).code == "media_not_allowed", url


def test_allow_list_entries_are_validated():
    assert MediaConfig(allowed_domains=[" Images.Example.COM. "]).allowed_domains == ["images.example.com"]
    for bad in ("https://example.com", "example.com:443", "*", "example.com/path", ""):
        with pytest.raises(ValidationError, match="allowed_domains"):
            MediaConfig(allowed_domains=[bad])


@pytest.mark.parametrize("ip, public", [
    ("127.0.0.1", False), ("10.0.0.1", False), ("169.254.169.254", False), ("::1", False),
    ("::ffff:127.0.0.1", False), ("0.0.0.0", False), ("192.168.1.1", False), ("100.64.0.1", False),
    ("fe80::1%eth0", False), ("fc00::1", False), ("224.0.0.1", False), ("64:ff9b::a9fe:a9fe", False),
    ("2002:7f00:1::", False), ("not an ip", False), ("8.8.8.8", True), ("2606:4700:4700::1111", True),
])
def test_is_public_address(ip, public):
    assert is_public_address(ip) is public


def test_https_host_resolving_to_loopback_is_refused():
    error = refusal("https://localhost/a.png", MediaConfig(allowed_domains=["localhost"]))
    assert (error.status, error.code) == (400, "media_not_allowed") and "non-public" in str(error)


def test_s3_refused_unless_allowed():
    error = refusal("s3://bucket/cat.png", MediaConfig())
    assert (error.status, error.code) == (400, "media_not_allowed") and "allow_s3" in str(error)


def test_s3_allowed_reads_through_configured_endpoint(s3_config, s3_bucket):
    from raydec.io.filesystem import s3_client

    s3_client(s3_config).put_object(Bucket=s3_bucket, Key="cat.png", Body=png_bytes())
    config = MediaConfig(allow_s3=True, s3=s3_config)
    assert load_image_url(f"s3://{s3_bucket}/cat.png", config, param=PARAM).size == (5, 6)
    error = refusal(f"s3://{s3_bucket}/missing.png", config)
    assert (error.status, error.code) == (400, "fetch_failed") and "not found" in str(error)


def test_check_image_count():
    check_image_count(4, MediaConfig(), param="messages")
    with pytest.raises(MediaError) as caught:
        check_image_count(5, MediaConfig(), param="messages")
    assert (caught.value.status, caught.value.code) == (400, "too_many_images")
    assert "max_images_per_request=4" in str(caught.value)


# ---- reading one response from a real local server -----------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    image = png_bytes()

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.end_headers()
        elif self.path == "/image.png":
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.image)))
            self.end_headers()
            self.wfile.write(self.image)
        elif self.path == "/big-no-length":  # HTTP/1.0 body until close: only the byte cap stops it
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"x" * 50_000)
        elif self.path == "/slow":
            time.sleep(1.0)
        else:
            self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def local_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def fetch(port: int, path: str, max_bytes: int = 10_000, timeout_s: float = 3.0) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    return request_image_bytes(connection, path, max_bytes=max_bytes, deadline=time.monotonic() + timeout_s, param=PARAM)


def test_response_reader_returns_a_200_body(local_server):
    assert fetch(local_server, "/image.png") == _Handler.image


def test_redirect_is_not_followed(local_server):
    with pytest.raises(MediaError, match="redirects are not followed") as caught:
        fetch(local_server, "/redirect")
    assert (caught.value.status, caught.value.code) == (400, "fetch_failed")


def test_non_200_names_the_status(local_server):
    with pytest.raises(MediaError, match="404") as caught:
        fetch(local_server, "/missing")
    assert caught.value.code == "fetch_failed"


def test_body_over_the_cap_is_413(local_server):
    for path, cap in (("/image.png", 10), ("/big-no-length", 20_000)):  # by Content-Length, and by counting
        with pytest.raises(MediaError, match="max_image_bytes") as caught:
            fetch(local_server, path, max_bytes=cap)
        assert (caught.value.status, caught.value.code) == (413, "image_too_large")


def test_deadline_gives_timed_out(local_server):
    started = time.perf_counter()
    with pytest.raises(MediaError, match="timed out") as caught:
        fetch(local_server, "/slow", timeout_s=0.3)
    assert caught.value.status == 400 and time.perf_counter() - started < 0.9
