"""Image codecs and loaders: PNG encoding, safe decoding, and fetching `image_uri`s.

Every failure raises `ImageError` whose message names the field and the value, so a batch
job can store the message in a row's `error` column and move on.
"""

from __future__ import annotations

import io
import logging
import os
import re
import struct
import warnings
from typing import Any, Dict, List, Optional, Union

import numpy as np
from PIL import Image, UnidentifiedImageError

from raydec.io.config import S3Config
from raydec.io.filesystem import describe_endpoint, is_s3_uri, s3_client, split_s3_uri

logger = logging.getLogger(__name__)

ImageLike = Union[np.ndarray, Image.Image]


class ImageError(ValueError):
    """An image could not be encoded, decoded or fetched; the message names field and value."""


def to_pil(image: ImageLike) -> Image.Image:
    """Convert a PIL image or a numpy array to a PIL image.

    Arrays are `[H, W]`, `[H, W, 1]`, `[H, W, 3]` or `[H, W, 4]`; uint8 is taken as is,
    floats are read as values in [0, 1] and clipped.
    """
    if isinstance(image, Image.Image):
        return image
    if not isinstance(image, np.ndarray):
        raise ImageError(f"image: expected a numpy array or PIL image, got {type(image).__name__}")
    array = image
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
        raise ImageError(f"image: array shape {tuple(image.shape)} is not [H, W], [H, W, 3] or [H, W, 4]")
    if array.size == 0:
        raise ImageError(f"image: array shape {tuple(image.shape)} is empty")
    if np.issubdtype(array.dtype, np.floating):
        array = (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    elif array.dtype != np.uint8:
        raise ImageError(f"image: array dtype {array.dtype} is not uint8 or floating point")
    return Image.fromarray(np.ascontiguousarray(array))


def encode_png(image: ImageLike) -> bytes:
    """Encode a numpy array or PIL image as PNG bytes."""
    buffer = io.BytesIO()
    to_pil(image).save(buffer, format="PNG")
    return buffer.getvalue()


def pil_reason(exc: BaseException) -> str:
    """PIL's error text without object reprs (memory addresses), so error rows are reproducible."""
    return re.sub(r"<[^<>]* at 0x[0-9a-f]+>", "the data", str(exc))


SIXTEEN_BIT_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N")
"""Integer grey modes PIL gives 16-bit images; ``convert("RGB")`` would clip them, not scale."""


def to_rgb(image: Image.Image, *, field: str = "image") -> Image.Image:
    """An 8-bit RGB copy of any PIL image. 16-bit grey is scaled (65535 -> 255), not clipped;
    float pixels (mode 'F') have no fixed range and are refused with an ImageError."""
    if image.mode in SIXTEEN_BIT_MODES:
        grey = np.asarray(image, dtype=np.float64) / 257.0  # [H, W]
        return Image.fromarray(np.clip(np.rint(grey), 0, 255).astype(np.uint8), mode="L").convert("RGB")
    if image.mode == "F":
        raise ImageError(f"{field}: float pixels (PIL mode 'F') have no fixed range; convert the image to 8-bit first")
    return image.convert("RGB")


def decode_image(data: bytes, *, field: str = "image", mode: Optional[str] = "RGB") -> Image.Image:
    """Decode encoded image bytes (PNG, JPEG, ...) into a fully loaded PIL image.

    Raises `ImageError("image: corrupt bytes (...)")` for empty, truncated or unknown data.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageError(f"{field}: expected bytes, got {type(data).__name__}")
    if len(data) == 0:
        raise ImageError(f"{field}: empty bytes")
    try:
        with Image.open(io.BytesIO(bytes(data))) as opened:
            opened.load()
            if mode is None:
                image = opened.copy()
            else:
                image = to_rgb(opened, field=field) if mode == "RGB" else opened.convert(mode)
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        head = bytes(data[:8])
        raise ImageError(f"{field}: corrupt bytes ({len(data)} bytes starting {head!r}: {pil_reason(exc)})") from None
    return image


class ImageTooLargeError(ImageError):
    """An image's header declares more pixels than allowed; raised before any decoding."""


def _open_header_only(data: bytes) -> Optional[Image.Image]:
    """Open `data` with PIL's registered format readers, skipping PIL's decompression-bomb check.

    Each reader's constructor parses the header only (no pixel data), so this is safe for any
    declared size; `Image.open` would raise `DecompressionBombError` instead of telling the size.
    Returns None when no reader recognises the bytes.
    """
    Image.init()  # registers every plugin (once)
    for format_id in Image.ID:
        factory, accept = Image.OPEN[format_id]
        accepted = True if accept is None else accept(data[:16])
        if not accepted or isinstance(accepted, str):  # str: "looks like X, but unsupported"
            continue
        try:
            return factory(io.BytesIO(data), None)
        except (SyntaxError, IndexError, TypeError, ValueError, OSError, EOFError, struct.error):
            continue
    return None


def image_header_pixels(data: bytes, *, field: str) -> tuple[int, int]:
    """(width, height) as declared by the image header; the pixel data is never decoded.

    Raises `ImageError("<field>: ... bytes are not an image ...")` for bytes PIL cannot identify.
    """
    data = bytes(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as opened:  # reads the header; no load()
                return opened.size
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):  # over PIL's limit: still tell the size
        try:
            opened = _open_header_only(data)
        except Image.DecompressionBombError as exc:  # a reader that checks in its constructor (GIF)
            raise ImageTooLargeError(f"{field}: image declares too many pixels ({pil_reason(exc)})") from None
        if opened is not None:
            with opened:
                return opened.size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError):
        pass
    raise ImageError(f"{field}: {len(data)} bytes starting {data[:8]!r} are not an image PIL can identify")


def check_image_pixels(data: bytes, max_pixels: int, *, field: str) -> tuple[int, int]:
    """(width, height) from the header, after checking width * height <= `max_pixels`.

    Raises `ImageTooLargeError` (an `ImageError`) before any decoding when the header declares
    more pixels, and `ImageError` for bytes that are not an image.
    """
    width, height = image_header_pixels(data, field=field)
    if width * height > max_pixels:
        raise ImageTooLargeError(
            f"{field}: image declares {width}x{height} = {width * height} pixels, more than max_image_pixels={max_pixels}"
        )
    return width, height


def load_image_bytes(uri: str, s3: Optional[S3Config] = None, *, field: str = "image_uri") -> bytes:
    """Read the encoded bytes at a local path or `s3://` URI.

    Raises `ImageError("image_uri: s3://b/k not found ...")` for a missing file, object or
    bucket, and a similar message for other access failures.
    """
    if not isinstance(uri, str) or not uri:
        raise ImageError(f"{field}: empty")
    if is_s3_uri(uri):
        return _load_s3_bytes(uri, s3, field=field)
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    try:
        with open(os.path.expanduser(path), "rb") as stream:
            return stream.read()
    except FileNotFoundError:
        raise ImageError(f"{field}: {uri} not found") from None
    except OSError as exc:
        raise ImageError(f"{field}: {uri} cannot be read ({exc.strerror or exc})") from None


def _load_s3_bytes(uri: str, s3: Optional[S3Config], *, field: str) -> bytes:
    """GET one object with boto3, mapping S3 error codes to clear messages."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        bucket, key = split_s3_uri(uri)
    except ValueError as exc:
        raise ImageError(f"{field}: {exc}") from None
    if not key:
        raise ImageError(f"{field}: {uri} names a bucket, not an object")
    try:
        response = s3_client(s3).get_object(Bucket=bucket, Key=key)
        return response["Body"].read()
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchKey", "404", "NotFound"):
            raise ImageError(f"{field}: {uri} not found") from None
        if code == "NoSuchBucket":
            raise ImageError(f"{field}: {uri} not found (bucket {bucket!r} does not exist)") from None
        raise ImageError(f"{field}: {uri} cannot be read ({code or exc})") from None
    except BotoCoreError as exc:
        raise ImageError(f"{field}: {uri} cannot be read from {describe_endpoint(s3)} ({exc})") from None


def load_image(uri: str, s3: Optional[S3Config] = None, *, mode: Optional[str] = "RGB", max_pixels: Optional[int] = None) -> Image.Image:
    """Fetch and decode the image at a local path or `s3://` URI (refused from its header when it
    declares more than `max_pixels` pixels)."""
    data = load_image_bytes(uri, s3)
    if max_pixels is not None:
        check_image_pixels(data, max_pixels, field=f"image_uri: {uri}")
    return decode_image(data, field=f"image_uri: {uri}", mode=mode)


def attach_caption_images(
    rows: List[Dict[str, Any]], s3: Optional[S3Config] = None, *, mode: Optional[str] = "RGB", max_pixels: Optional[int] = None,
) -> List[Dict[str, Any]]:
    """Decode or fetch the image of every validated captioning row.

    Returns new dicts with a `pil_image` key (None for bad rows). A row whose bytes are
    corrupt or whose URI is missing gets an `error` instead; the other rows go on.
    """
    attached = []
    for row in rows:
        row = dict(row, pil_image=None)
        if not row.get("error"):
            try:
                if row.get("image") is not None:
                    row["pil_image"] = decode_image(row["image"], field="image", mode=mode)
                else:
                    row["pil_image"] = load_image(row["image_uri"], s3, mode=mode, max_pixels=max_pixels)
            except ImageError as exc:
                row["error"] = str(exc)
                logger.warning("row %s: %s", row.get("id"), exc)
        attached.append(row)
    return attached
