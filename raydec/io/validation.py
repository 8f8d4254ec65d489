"""Row validation and normalisation for text-to-image and captioning inputs.

A validated row always has a string `id`, an int `seed` and an `error` that is None for a
good row or a message naming the field and value ("prompt: empty"). Bad rows are kept, so
a job writes exactly one result per input row. Ids and seeds are derived with stable
hashes (blake2b), never Python's `hash()`, so they match across processes and machines.
"""

from __future__ import annotations

import hashlib
import io
import math
from typing import Any, Dict, List, Optional, Tuple

from PIL import Image, UnidentifiedImageError

from raydec.io.config import RowFormat
from raydec.io.images import ImageError, ImageTooLargeError, check_image_pixels, pil_reason

MAX_ID_CHARS = 512
SEED_LIMIT = 2**63


def derive_row_id(file_key: str, row_index: int) -> str:
    """The id of a row that has none: its file (relative to the input root) and row index."""
    return f"{file_key}#{row_index}"


def derive_seed(row_id: str, job_seed: int) -> int:
    """A seed in [0, 2**63) from a row id and the job seed, stable across runs and hosts."""
    digest = hashlib.blake2b(f"{job_seed}\x1f{row_id}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % SEED_LIMIT


def short_repr(value: Any, limit: int = 60) -> str:
    """repr() of a value, cut to `limit` characters for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_null(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _normalise_id(value: Any) -> Tuple[Optional[str], Optional[str]]:
    """(id, error). A null id yields (None, None): the caller derives one."""
    if _is_null(value):
        return None, None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None, f"id: {short_repr(value)} is not a string or integer"
    if isinstance(value, float):
        if not value.is_integer():
            return None, f"id: {value!r} is not a string or integer"
        value = int(value)
    text = str(value)
    if not text.strip():
        return None, "id: empty"
    if len(text) > MAX_ID_CHARS:
        return None, f"id: {len(text)} characters exceeds {MAX_ID_CHARS}"
    return text, None


def _normalise_seed(value: Any) -> Tuple[Optional[int], Optional[str]]:
    """(seed, error). A null seed yields (None, None): the caller derives one."""
    if _is_null(value):
        return None, None
    if isinstance(value, bool):
        return None, f"seed: {value!r} is not an integer"
    if isinstance(value, float):
        if not value.is_integer():
            return None, f"seed: {value!r} is not an integer"
        value = int(value)
    if isinstance(value, str):
        digits = value.strip()
        # isascii: int() rejects digits such as '²' that isdigit() accepts; 19 digits hold any seed
        if not (digits.isascii() and digits.isdigit()):
            return None, f"seed: {short_repr(value)} is not an integer"
        if len(digits.lstrip("0")) > len(str(SEED_LIMIT)):
            return None, f"seed: {short_repr(value)} is outside [0, 2**63)"
        value = int(digits)
    if not isinstance(value, int):
        return None, f"seed: {short_repr(value)} is not an integer"
    if not 0 <= value < SEED_LIMIT:
        return None, f"seed: {value} is outside [0, 2**63)"
    return value, None


def _text_errors(field: str, value: Any, cfg: RowFormat, *, required: bool) -> Tuple[Optional[str], List[str]]:
    """(text, errors) for a prompt-like field, checking type, emptiness and length limits."""
    if _is_null(value):
        return None, ([f"{field}: missing (null)"] if required else [])
    if not isinstance(value, str):
        return None, [f"{field}: {short_repr(value)} is a {type(value).__name__}, not a string"]
    if not value.strip():
        return None, ([f"{field}: empty"] if required else [])
    errors: List[str] = []
    words = len(value.split())
    if words > cfg.max_prompt_words:
        errors.append(f"{field}: {words} words exceeds max_prompt_words={cfg.max_prompt_words}")
    elif len(value) > cfg.max_prompt_chars:
        errors.append(f"{field}: {len(value)} characters exceeds max_prompt_chars={cfg.max_prompt_chars}")
    return value, errors


def _row_id_and_error(value: Any, file_key: str, row_index: int) -> Tuple[str, Optional[str]]:
    """(id, error): the id column's value normalised, or, when absent or invalid, an id derived
    from the row's file and index."""
    normalised, error = _normalise_id(value)
    return (normalised if normalised is not None else derive_row_id(file_key, row_index)), error


def row_id(value: Any, file_key: str, row_index: int) -> str:
    """A row's id from its id column's value, as the validators give it (the id scan reads ids alone)."""
    return _row_id_and_error(value, file_key, row_index)[0]


def _id_and_seed(row: Dict[str, Any], cfg: RowFormat, file_key: str, row_index: int) -> Tuple[str, int, List[str]]:
    """Normalised id and seed of a row, deriving either when absent or invalid."""
    row_id_, id_error = _row_id_and_error(row.get(cfg.id_column), file_key, row_index)
    seed, seed_error = _normalise_seed(row.get(cfg.seed_column))
    seed = seed if seed is not None else derive_seed(row_id_, cfg.seed)
    return row_id_, seed, [e for e in (id_error, seed_error) if e]


def _join(errors: List[str]) -> Optional[str]:
    return "; ".join(errors) if errors else None


def validate_t2i_rows(
    rows: List[Dict[str, Any]], cfg: RowFormat, *, file_key: str = "rows", first_row_index: int = 0
) -> List[Dict[str, Any]]:
    """Normalise text-to-image rows read from one file, starting at `first_row_index`.

    Returns dicts with keys id, source, prompt, negative_prompt, seed, error.
    """
    validated = []
    for offset, row in enumerate(rows):
        if "__parse_error__" in row:
            row_id = derive_row_id(file_key, first_row_index + offset)
            validated.append(dict(id=row_id, source="", prompt=None, negative_prompt=None,
                                  seed=derive_seed(row_id, cfg.seed), error=row["__parse_error__"]))
            continue
        row_id, seed, errors = _id_and_seed(row, cfg, file_key, first_row_index + offset)
        prompt, prompt_errors = _text_errors("prompt", row.get(cfg.prompt_column), cfg, required=True)
        negative, negative_errors = _text_errors(
            "negative_prompt", row.get(cfg.negative_prompt_column), cfg, required=False
        )
        raw_prompt = row.get(cfg.prompt_column)
        validated.append(dict(
            id=row_id,
            source=raw_prompt if isinstance(raw_prompt, str) else "",
            prompt=prompt,
            negative_prompt=negative,
            seed=seed,
            error=_join(errors + prompt_errors + negative_errors),
        ))
    return validated


def _image_bytes_error(value: Any, cfg: RowFormat) -> Optional[str]:
    """Cheap checks on inline image bytes: type, size and a recognisable header."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        return f"image: {short_repr(value)} is a {type(value).__name__}, not bytes"
    if len(value) == 0:
        return "image: empty bytes"
    if len(value) > cfg.max_image_bytes:
        return f"image: {len(value)} bytes exceeds max_image_bytes={cfg.max_image_bytes}"
    try:
        check_image_pixels(bytes(value), cfg.max_image_pixels, field="image")  # from the header: before any decoding
    except ImageTooLargeError as exc:
        return str(exc)
    except ImageError:
        pass  # not identifiable: the open below says how
    try:
        with Image.open(io.BytesIO(bytes(value))):
            pass
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        return f"image: corrupt bytes ({len(value)} bytes starting {bytes(value[:8])!r}: {pil_reason(exc)})"
    return None


def _image_uri_error(value: Any) -> Optional[str]:
    if not isinstance(value, str):
        return f"image_uri: {short_repr(value)} is a {type(value).__name__}, not a string"
    if not value.strip():
        return "image_uri: empty"
    if "://" in value and not value.startswith(("s3://", "file://")):
        return f"image_uri: {short_repr(value)} has an unsupported scheme (use a local path or s3://)"
    return None


def validate_caption_rows(
    rows: List[Dict[str, Any]], cfg: RowFormat, *, file_key: str = "rows", first_row_index: int = 0
) -> List[Dict[str, Any]]:
    """Normalise captioning rows read from one file, starting at `first_row_index`.

    Returns dicts with keys id, source, image (bytes or None), image_uri, prompt, seed,
    error. Inline bytes are checked for a readable header here; full decoding and fetching
    of URIs happen in `attach_caption_images`, which turns failures into row errors too.
    """
    validated = []
    for offset, row in enumerate(rows):
        row_index = first_row_index + offset
        if "__parse_error__" in row:
            row_id = derive_row_id(file_key, row_index)
            validated.append(dict(id=row_id, source="", image=None, image_uri=None, prompt=None,
                                  seed=derive_seed(row_id, cfg.seed), error=row["__parse_error__"]))
            continue
        row_id, seed, errors = _id_and_seed(row, cfg, file_key, row_index)
        image, uri = row.get(cfg.image_column), row.get(cfg.image_uri_column)
        image = None if _is_null(image) else image
        uri = None if _is_null(uri) else uri
        if image is None and uri is None:
            errors.append(f"image: missing (row has neither {cfg.image_column!r} nor {cfg.image_uri_column!r})")
        elif image is not None:
            error = _image_bytes_error(image, cfg)
            errors += [error] if error else []
        else:
            error = _image_uri_error(uri)
            errors += [error] if error else []
        prompt, prompt_errors = _text_errors("prompt", row.get(cfg.prompt_column), cfg, required=False)
        validated.append(dict(
            id=row_id,
            source=uri if isinstance(uri, str) else f"inline:{file_key}#{row_index}",
            image=bytes(image) if isinstance(image, (bytes, bytearray, memoryview)) else None,
            image_uri=uri if isinstance(uri, str) else None,
            prompt=prompt,
            seed=seed,
            error=_join(errors + prompt_errors),
        ))
    return validated
