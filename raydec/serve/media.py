"""Load the images of an OpenAI-style chat request (`image_url` parts) safely.

Accepted URLs: `data:image/<type>;base64,...` always; `https://` only to hosts on
`MediaConfig.allowed_domains`; `s3://bucket/key` only with `allow_s3`. Every image is size-checked
(bytes, then header-declared pixels) before it is decoded.

The https fetcher guards against server-side request forgery: it resolves the host once, refuses
the request if any address is not public (loopback, private, link-local, ...), connects to the
checked address itself (so a second DNS answer cannot point elsewhere), sends the original name
for TLS (SNI, certificate check) and Host, follows no redirects and caps time and bytes.

Every failure is a `MediaError` carrying the HTTP status, the request field (`param`) and a short
code; its message never repeats more than the first few dozen characters of a URL.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
from typing import Optional
from urllib.parse import urlsplit

from PIL import Image
from pydantic import Field, field_validator

from raydec.io.config import S3Config
from raydec.io.images import ImageError, ImageTooLargeError, check_image_pixels, decode_image, load_image_bytes
from raydec.validation import StrictModel

ACCEPTED_URLS = "data:image/<type>;base64,... URLs, https:// URLs to hosts on media.allowed_domains, s3:// with media.allow_s3"
_CHUNK_BYTES = 64 * 1024
_DOMAIN_PATTERN = re.compile(r"^(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*$")
_DATA_URL_HEADER = re.compile(r"^data:image/[a-z0-9.+-]+(;[^;,]*)*;base64$", re.IGNORECASE)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class MediaConfig(StrictModel):
    """Which image URLs a chat request may use, and the limits on each image."""

    allowed_domains: list[str] = Field(
        default_factory=list,
        description="Hosts https:// image URLs may name: exact names or '*.example.com' (any subdomain); "
        "empty turns https fetching off.",
    )
    allow_s3: bool = Field(False, description="Accept s3://bucket/key image URLs, read with the `s3` settings.")
    s3: Optional[S3Config] = Field(None, description="S3 access for s3:// image URLs; default the AWS_* environment.")
    fetch_timeout_s: float = Field(
        5.0, gt=0, le=120, description="Seconds allowed for one https fetch: DNS, connect and the whole body."
    )
    max_image_bytes: int = Field(10 * 1024 * 1024, ge=1, description="Largest encoded image accepted, in bytes.")
    max_image_pixels: int = Field(
        16_777_216, ge=1, description="Largest width * height an image header may declare; checked before decoding."
    )
    max_images_per_request: int = Field(4, ge=1, le=64, description="Most images one chat request may carry.")

    @field_validator("allowed_domains")
    @classmethod
    def _host_patterns(cls, value: list[str]) -> list[str]:
        cleaned = []
        for entry in value:
            host = entry.strip().lower().rstrip(".")
            if not _DOMAIN_PATTERN.match(host):
                raise ValueError(
                    f"allowed_domains: {entry!r} is not a host name or '*.example.com' pattern "
                    "(no scheme, port, path or bare '*')"
                )
            cleaned.append(host)
        return cleaned


class MediaError(ValueError):
    """A request's image cannot be used. `status`: the HTTP status to answer (400, or 413 for too
    large); `param`: the request field, e.g. "messages[0].content[1].image_url.url"; `code`: one of
    invalid_image, image_too_large, media_not_allowed, fetch_failed, too_many_images."""

    def __init__(self, message: str, *, status: int, param: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code


def _short(url: str) -> str:
    """The URL as quoted in errors: at most 40 characters, so a data URL's payload never comes back."""
    return repr(url if len(url) <= 40 else url[:40] + "...")


def check_image_count(count: int, config: MediaConfig, *, param: str) -> None:
    """Refuse (400 too_many_images) a request with more than `max_images_per_request` images."""
    if count > config.max_images_per_request:
        raise MediaError(
            f"{param}: {count} images, more than max_images_per_request={config.max_images_per_request}",
            status=400, param=param, code="too_many_images",
        )


def is_public_address(ip: str) -> bool:
    """True when `ip` is a globally routable unicast address; False for loopback, private,
    link-local, multicast, reserved, unspecified or shared addresses, for IPv6 forms that embed
    such an IPv4 address (mapped, 6to4, Teredo, NAT64), and for text that is no address."""
    try:
        address = ipaddress.ip_address(ip.split("%", 1)[0])  # drop an IPv6 zone ("fe80::1%eth0")
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour or (address.teredo[1] if address.teredo else None)
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public_address(str(embedded))
        if address.is_site_local:
            return False
    return address.is_global and not (
        address.is_private or address.is_loopback or address.is_link_local or address.is_multicast
        or address.is_reserved or address.is_unspecified
    )


def _host_allowed(host: str, allowed_domains: list[str]) -> bool:
    """Exact names match themselves; '*.example.com' matches any subdomain, not example.com itself."""
    host = host.rstrip(".")
    return any(host.endswith(entry[1:]) if entry.startswith("*.") else host == entry for entry in allowed_domains)


def _check_bytes(data: bytes, config: MediaConfig, *, param: str) -> Image.Image:
    """Size-check encoded bytes (413 image_too_large), then decode them to RGB (400 invalid_image).

    A header declaring more than `max_image_pixels` pixels is refused with 413 before decoding.
    """
    if len(data) > config.max_image_bytes:
        raise MediaError(
            f"{param}: image is {len(data)} bytes, more than max_image_bytes={config.max_image_bytes}",
            status=413, param=param, code="image_too_large",
        )
    try:
        check_image_pixels(data, config.max_image_pixels, field=param)
        return decode_image(data, field=param, mode="RGB")
    except ImageTooLargeError as exc:
        raise MediaError(str(exc), status=413, param=param, code="image_too_large") from None
    except ImageError as exc:
        reason = str(exc).removeprefix(f"{param}: ")
        raise MediaError(f"{param}: the bytes are not a decodable image ({reason})", status=400, param=param,
                         code="invalid_image") from None


def _data_url_bytes(url: str, config: MediaConfig, *, param: str) -> bytes:
    """The decoded payload of a `data:image/<type>;base64,` URL; its size is checked before decoding."""
    header, comma, payload = url.partition(",")
    if not comma or not _DATA_URL_HEADER.match(header):
        raise MediaError(f"{param}: data URL {_short(url)} is not data:image/<type>;base64,<payload>",
                         status=400, param=param, code="invalid_image")
    padding = min(2, len(payload) - len(payload.rstrip("=")))
    decoded_size = len(payload) * 3 // 4 - padding  # exact for valid base64
    if decoded_size > config.max_image_bytes:
        raise MediaError(f"{param}: image is about {decoded_size} bytes, more than max_image_bytes={config.max_image_bytes}",
                         status=413, param=param, code="image_too_large")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(f"{param}: data URL {_short(url)} has an invalid base64 payload",
                         status=400, param=param, code="invalid_image") from None


def _fetch_failed(param: str, url: str, reason: str) -> MediaError:
    return MediaError(f"{param}: fetching {_short(url)} failed: {reason}", status=400, param=param, code="fetch_failed")


def request_image_bytes(
    connection: http.client.HTTPConnection, target: str, *, max_bytes: int, deadline: float, param: str, url: str = ""
) -> bytes:
    """GET `target` on an open-able connection and return the body of one 200 response.

    Refuses a 3xx (redirects are not followed) or any other non-200 status (400 fetch_failed),
    a body over `max_bytes` (413 image_too_large, read at most `max_bytes + 1`), and anything past
    `deadline` (a `time.monotonic()` value; 400 fetch_failed "timed out").
    """
    url = url or target
    try:
        connection.timeout = max(0.001, deadline - time.monotonic())
        connection.request("GET", target, headers={"Accept": "image/*", "User-Agent": "raydec"})
        sock = connection.sock  # getresponse() may hand it to the response and clear connection.sock
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        response = connection.getresponse()
        if 300 <= response.status < 400:
            raise _fetch_failed(param, url, f"the server answered {response.status} (a redirect); redirects are not followed")
        if response.status != 200:
            raise _fetch_failed(param, url, f"the server answered {response.status} {response.reason}".rstrip())
        too_large = MediaError(f"{param}: image at {_short(url)} is more than max_image_bytes={max_bytes} bytes",
                               status=413, param=param, code="image_too_large")
        declared = response.getheader("Content-Length")
        if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
            raise too_large
        chunks, received = [], 0
        while received <= max_bytes:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise TimeoutError
            sock.settimeout(remaining_s)
            chunk = response.read1(min(_CHUNK_BYTES, max_bytes + 1 - received))  # one recv at most
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            received += len(chunk)
        raise too_large
    except TimeoutError:  # socket.timeout is TimeoutError
        raise _fetch_failed(param, url, "timed out") from None
    except ssl.SSLCertVerificationError as exc:
        raise _fetch_failed(param, url, f"TLS certificate check failed ({exc.verify_message})") from None
    except (OSError, http.client.HTTPException) as exc:
        raise _fetch_failed(param, url, f"{type(exc).__name__}: {exc}") from None
    finally:
        connection.close()


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to an address already resolved and checked, with `host` for SNI, certificate and Host."""

    def __init__(self, host: str, port: int, *, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.checked_address = address
        self.tls_context = ssl.create_default_context()

    def connect(self) -> None:
        sock = socket.create_connection((self.checked_address, self.port), timeout=self.timeout)
        try:
            self.sock = self.tls_context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise


def _resolve(host: str, port: int, timeout_s: float) -> list[str]:
    """The host's addresses from `socket.getaddrinfo`, given up after `timeout_s`."""
    result: dict = {}

    def lookup() -> None:
        try:
            result["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            result["error"] = exc

    worker = threading.Thread(target=lookup, name="raydec-media-dns", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise TimeoutError
    if "error" in result:
        raise result["error"]
    return list(dict.fromkeys(info[4][0] for info in result["infos"]))


def _https_bytes(url: str, config: MediaConfig, *, param: str) -> bytes:
    """Fetch an allow-listed https URL (see the module docstring for the checks)."""
    if not config.allowed_domains:
        raise MediaError(f"{param}: https image URLs are off (media.allowed_domains is empty); got {_short(url)}",
                         status=400, param=param, code="media_not_allowed")
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or 443
    except ValueError:
        raise MediaError(f"{param}: {_short(url)} is not a valid URL", status=400, param=param, code="invalid_image") from None
    if parts.username is not None or parts.password is not None:
        raise MediaError(f"{param}: {_short(url)}: credentials in image URLs are not accepted",
                         status=400, param=param, code="media_not_allowed")
    if not host or not _host_allowed(host, config.allowed_domains):
        raise MediaError(f"{param}: host {host[:40]!r} of {_short(url)} is not on media.allowed_domains",
                         status=400, param=param, code="media_not_allowed")
    deadline = time.monotonic() + config.fetch_timeout_s
    try:
        addresses = _resolve(host, port, config.fetch_timeout_s)
    except TimeoutError:
        raise _fetch_failed(param, url, "timed out resolving the host") from None
    except OSError:
        raise _fetch_failed(param, url, f"cannot resolve host {host[:40]!r}") from None
    if not addresses or not all(is_public_address(address) for address in addresses):
        raise MediaError(f"{param}: host {host[:40]!r} resolves to a non-public (private, loopback, link-local or "
                         "reserved) address", status=400, param=param, code="media_not_allowed")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    last_error: Optional[MediaError] = None
    for address in addresses:  # connect failures try the next address; any answer is final
        connection = _PinnedHTTPSConnection(host, port, address=address, timeout=config.fetch_timeout_s)
        try:
            connection.timeout = max(0.001, deadline - time.monotonic())
            connection.connect()
        except OSError as exc:  # ssl.SSLError included
            connection.close()
            if isinstance(exc, ssl.SSLCertVerificationError):
                raise _fetch_failed(param, url, f"TLS certificate check failed ({exc.verify_message})") from None
            reason = "timed out" if isinstance(exc, TimeoutError) else f"cannot connect ({type(exc).__name__}: {exc})"
            last_error = _fetch_failed(param, url, reason)
            if isinstance(exc, ssl.SSLError) or time.monotonic() >= deadline:
                break
            continue
        return request_image_bytes(connection, target, max_bytes=config.max_image_bytes, deadline=deadline,
                                   param=param, url=url)
    assert last_error is not None
    raise last_error


def _s3_bytes(url: str, config: MediaConfig, *, param: str) -> bytes:
    if not config.allow_s3:
        raise MediaError(f"{param}: s3:// image URLs are off (media.allow_s3 is false); got {_short(url)}",
                         status=400, param=param, code="media_not_allowed")
    try:
        return load_image_bytes(url, s3=config.s3, field=param)
    except ImageError as exc:
        reason = str(exc).removeprefix(f"{param}: ").replace(url, _short(url))
        raise _fetch_failed(param, url, reason) from None


def load_image_url(url: str, config: MediaConfig, *, param: str) -> Image.Image:
    """A fully loaded RGB image from an `image_url` part's URL, or a `MediaError`.

    Statuses: 413 (image_too_large) for more than `max_image_bytes` bytes or a header declaring
    more than `max_image_pixels` pixels (both checked before decoding); 400 for everything else:
    invalid_image (bad data URL, base64 or image bytes), media_not_allowed (scheme, host or
    address refused), fetch_failed (DNS, connect, TLS, non-200, redirect, "timed out", S3 read).
    """
    if not isinstance(url, str) or not url.strip():
        raise MediaError(f"{param}: empty image URL", status=400, param=param, code="invalid_image")
    scheme = url.split(":", 1)[0].strip().lower() if ":" in url else ""
    if scheme == "data":
        data = _data_url_bytes(url, config, param=param)
    elif scheme == "https":
        data = _https_bytes(url, config, param=param)
    elif scheme == "s3":
        data = _s3_bytes(url, config, param=param)
    else:
        refused = "plain http:// is never fetched" if scheme == "http" else "unsupported URL"
        raise MediaError(f"{param}: {_short(url)}: {refused}; accepted are {ACCEPTED_URLS}",
                         status=400, param=param, code="media_not_allowed")
    return _check_bytes(data, config, param=param)
