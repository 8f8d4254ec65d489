"""Input datasets: list files (file, folder, glob, s3:// prefix), check schemas, read rows.

The usual driver-side sequence is

    files = check_dataset(cfg, "t2i")          # fails fast on a missing column
    rows = load_rows(cfg, "t2i", files)        # validated rows; bad rows carry `error`

and `iter_validated_batches` streams the same rows in batches for large inputs.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from raydec.io.config import DatasetSchemaError, InputConfig, InputFormat, IOConfigError, Task
from raydec.io.filesystem import describe_endpoint, is_s3_uri, resolve_filesystem, to_uri
from raydec.io.validation import (
    derive_row_id,
    derive_seed,
    short_repr,
    validate_caption_rows,
    validate_t2i_rows,
)

logger = logging.getLogger(__name__)

__all__ = [
    "InputFile", "infer_format", "listing_root", "list_input_files", "read_table", "read_rows",
    "input_columns",
    "check_schema", "check_dataset", "iter_validated_batches", "load_rows",
    "validate_t2i_rows", "validate_caption_rows", "derive_row_id", "derive_seed",
]

EXTENSION_FORMATS: Dict[str, InputFormat] = {
    ".parquet": "parquet", ".pq": "parquet",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
    ".csv": "csv",
}
_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class InputFile:
    """One input file: its URI, its path relative to the input root (`key`) and format."""

    uri: str
    key: str
    format: InputFormat


def infer_format(path: str, explicit: Optional[InputFormat] = None) -> Optional[InputFormat]:
    """The explicit format, else the one implied by the extension, else None."""
    if explicit is not None:
        return explicit
    return EXTENSION_FORMATS.get(posixpath.splitext(path.lower())[1])


def _glob_regex(pattern: str) -> re.Pattern:
    """Translate a path glob to a regex: `*` and `?` stay within a segment, `**/` spans segments."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape("["))
                i += 1
            else:
                body = pattern[i + 1:end].replace("\\", "\\\\")
                out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
                i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _file_format(path: str, explicit: Optional[InputFormat], single: bool) -> Optional[InputFormat]:
    """Format of one listed file, or None to skip it.

    A single named file takes the explicit format whatever its extension. In a folder or
    glob, an explicit format keeps files with that format's extensions or no extension at
    all (e.g. Spark's part-00000); otherwise each file's extension decides.
    """
    implied = infer_format(path)
    if explicit is None:
        return implied
    if single or implied == explicit:
        return explicit
    has_extension = "." in posixpath.basename(path)
    return None if has_extension else explicit


def _hidden(relative: str) -> bool:
    """Files or folders starting with '.' or '_' (temp files, _SUCCESS markers) are skipped."""
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def _list(fs: pafs.FileSystem, base: str, where: str) -> List[pafs.FileInfo]:
    """All files (not directories) under `base`, recursively; [] when `base` does not exist."""
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    try:
        return [info for info in fs.get_file_info(selector) if info.type == pafs.FileType.File]
    except OSError as exc:
        raise IOConfigError(f"input.path: cannot list {where}: {exc}") from None


def listing_root(path: str) -> str:
    """The folder (or file) an input path lists below: a glob's fixed prefix, else the path."""
    glob_match = _GLOB_CHARS.search(path)
    return path[: glob_match.start()].rsplit("/", 1)[0] if glob_match else path


def list_input_files(cfg: InputConfig) -> List[InputFile]:
    """All input files for `cfg.path`, sorted, with formats inferred; raises if none match."""
    fs, path = resolve_filesystem(cfg.path, cfg.s3)
    where = f"{cfg.path} (endpoint {describe_endpoint(cfg.s3)})" if is_s3_uri(cfg.path) else cfg.path
    candidates: List[Tuple[str, str]] = []  # (fs path, key relative to root)
    explicit_single = False  # the path names one file
    if _GLOB_CHARS.search(path):
        root = listing_root(path)
        regex = _glob_regex(path[len(root) + 1:])
        for info in _list(fs, root, where):
            relative = info.path[len(root) + 1:]
            if regex.match(relative) and not _hidden(relative):
                candidates.append((info.path, relative))
    else:
        try:
            info = fs.get_file_info(path)
        except OSError as exc:
            raise IOConfigError(f"input.path: cannot reach {where}: {exc}") from None
        if info.type == pafs.FileType.File:
            candidates.append((path, posixpath.basename(path)))
            explicit_single = True
        elif info.type == pafs.FileType.Directory:
            for entry in _list(fs, path, where):
                relative = entry.path[len(path.rstrip("/")) + 1:]
                if not _hidden(relative):
                    candidates.append((entry.path, relative))
        else:
            raise DatasetSchemaError(f"input.path: {where} does not exist")
    files = []
    for fs_path, key in sorted(candidates):
        fmt = _file_format(fs_path, cfg.format, explicit_single)
        if fmt is None:
            if explicit_single:
                raise DatasetSchemaError(
                    f"input.format: cannot infer the format of {cfg.path} from its extension; "
                    f"set format to one of parquet, jsonl, csv"
                )
            logger.debug("skipping %s: not a %s file", fs_path, cfg.format or "known")
            continue
        files.append(InputFile(uri=to_uri(fs, fs_path), key=key, format=fmt))
    if not files:
        raise DatasetSchemaError(f"input.path: {where} matches no .parquet, .jsonl or .csv files")
    logger.info("input %s: %d file(s)", cfg.path, len(files))
    return files


def _csv_convert_options(cfg: InputConfig) -> pacsv.ConvertOptions:
    """Read id and text columns as strings, so '007' stays '007' and '' stays ''."""
    text_columns = [cfg.id_column, cfg.prompt_column, cfg.negative_prompt_column, cfg.image_uri_column]
    return pacsv.ConvertOptions(column_types={name: pa.string() for name in text_columns})


def _read_csv(stream: Any, cfg: InputConfig) -> Tuple[pa.Table, List[Tuple[Optional[int], str]]]:
    """(table of the well-formed rows, [(line number or None, text)] of lines with the wrong
    number of columns): one bad line becomes one bad row, as in JSON lines."""
    bad_lines: List[Tuple[Optional[int], str]] = []

    def skip_and_record(row: Any) -> str:
        bad_lines.append((row.number, row.text))
        return "skip"

    table = pacsv.read_csv(
        stream,
        read_options=pacsv.ReadOptions(use_threads=False),  # single-threaded: bad lines keep their numbers
        parse_options=pacsv.ParseOptions(invalid_row_handler=skip_and_record),
        convert_options=_csv_convert_options(cfg),
    )
    return table, bad_lines


def _read_csv_rows(file: InputFile, cfg: InputConfig) -> List[Dict[str, Any]]:
    """CSV rows as dicts; a line with the wrong number of columns takes its place as a bad row."""
    fs, path = resolve_filesystem(file.uri, cfg.s3)
    try:
        with fs.open_input_stream(path) as stream:
            table, bad_lines = _read_csv(stream, cfg)
    except (OSError, pa.ArrowInvalid) as exc:
        raise IOConfigError(f"input: cannot read {file.uri} as csv: {exc}") from None
    rows = table.to_pylist()
    for number, text in bad_lines:  # ascending line numbers; line 1 is the header
        where = f"line {number} of {file.key}" if number is not None else f"a line of {file.key}"
        error = {"__parse_error__": f"row: {where} has the wrong number of columns ({short_repr(text)})"}
        rows.insert(len(rows) if number is None else min(max(number - 2, 0), len(rows)), error)
    return rows


def read_table(file: InputFile, cfg: InputConfig) -> pa.Table:
    """Read one input file as an Arrow table."""
    fs, path = resolve_filesystem(file.uri, cfg.s3)
    try:
        if file.format == "parquet":
            return pq.read_table(path, filesystem=fs)
        with fs.open_input_stream(path) as stream:
            if file.format == "csv":
                return _read_csv(stream, cfg)[0]
            return pajson.read_json(stream)
    except (OSError, pa.ArrowInvalid) as exc:
        raise IOConfigError(f"input: cannot read {file.uri} as {file.format}: {exc}") from None


def _read_jsonl_rows(file: InputFile, cfg: InputConfig) -> List[Dict[str, Any]]:
    """Parse JSON lines one by one, so one malformed line becomes one bad row.

    Lines end at "\n" only: U+2028 and friends may stand unescaped inside JSON strings.
    """
    fs, path = resolve_filesystem(file.uri, cfg.s3)
    try:
        with fs.open_input_stream(path) as stream:
            data = stream.read()
    except OSError as exc:
        raise IOConfigError(f"input: cannot read {file.uri}: {exc}") from None
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
        data = data[3:]
    rows: List[Dict[str, Any]] = []
    for line_number, raw in enumerate(data.split(b"\n"), start=1):
        where = f"line {line_number} of {file.key}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            rows.append({"__parse_error__": f"row: {where} is not UTF-8 (byte {exc.start})"})
            continue
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            row = {"__parse_error__": f"row: {where} is not valid JSON ({exc.msg})"}
        except (ValueError, RecursionError) as exc:  # e.g. a 5,000-digit number, nesting too deep
            row = {"__parse_error__": f"row: {where} cannot be parsed ({type(exc).__name__})"}
        if not isinstance(row, dict):
            row = {"__parse_error__": f"row: {where} is a {type(row).__name__}, not an object"}
        rows.append(row)
    return rows


def read_rows(file: InputFile, cfg: InputConfig) -> List[Dict[str, Any]]:
    """Read one input file as a list of dicts (unvalidated)."""
    if file.format == "jsonl":
        return _read_jsonl_rows(file, cfg)
    if file.format == "csv":
        return _read_csv_rows(file, cfg)
    return read_table(file, cfg).to_pylist()


def input_columns(file: InputFile, cfg: InputConfig) -> List[str]:
    """Column names of one file (Parquet: from the footer, without reading data)."""
    if file.format == "parquet":
        fs, path = resolve_filesystem(file.uri, cfg.s3)
        try:
            return list(pq.read_schema(path, filesystem=fs).names)
        except (OSError, pa.ArrowInvalid) as exc:
            raise IOConfigError(f"input: cannot read the schema of {file.uri}: {exc}") from None
    fs, path = resolve_filesystem(file.uri, cfg.s3)
    try:
        with fs.open_input_stream(path) as stream:
            if file.format == "csv":  # the header (first block) only
                skip_bad_lines = pacsv.ParseOptions(invalid_row_handler=lambda row: "skip")  # they become bad rows later
                reader = pacsv.open_csv(stream, read_options=pacsv.ReadOptions(use_threads=False), parse_options=skip_bad_lines)
                return list(reader.schema.names)
            return _jsonl_keys(stream)
    except (OSError, pa.ArrowInvalid) as exc:
        raise IOConfigError(f"input: cannot read the columns of {file.uri}: {exc}") from None


def _jsonl_keys(stream: Any, chunk_bytes: int = 1 << 20) -> List[str]:
    """The keys of a JSON-lines stream's objects, in first-seen order, reading it a chunk at a time
    (no rows are kept); lines that do not parse are skipped here (they become bad rows later)."""
    names: Dict[str, None] = {}
    tail = b""
    while True:
        chunk = stream.read(chunk_bytes)
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop() if chunk else b""
        for raw in lines:
            try:
                row = json.loads(raw.removeprefix(b"\xef\xbb\xbf"))
            except (ValueError, RecursionError):
                continue
            if isinstance(row, dict):
                names.update(dict.fromkeys(row))
        if not chunk:
            return list(names)


def check_schema(columns: Sequence[str], task: Task, cfg: InputConfig, where: str) -> None:
    """Raise DatasetSchemaError if the columns cannot feed `task`."""
    if task == "t2i":
        if cfg.prompt_column not in columns:
            raise DatasetSchemaError(
                f"input: {where} has no {cfg.prompt_column!r} column, required for text-to-image "
                f"(found columns: {list(columns)}; set input.prompt_column to rename)"
            )
    elif task == "caption":
        if cfg.image_column not in columns and cfg.image_uri_column not in columns:
            raise DatasetSchemaError(
                f"input: {where} has neither an {cfg.image_column!r} nor an {cfg.image_uri_column!r} "
                f"column, one of which captioning requires (found columns: {list(columns)})"
            )
    else:
        raise IOConfigError(f"task: {task!r} is not one of 't2i', 'caption'")


def check_dataset(cfg: InputConfig, task: Task) -> List[InputFile]:
    """List the input files and check every file's columns for `task`; fails fast."""
    files = list_input_files(cfg)
    named_optional = {f: getattr(cfg, f) for f in ("id_column", "seed_column") if f in cfg.model_fields_set}
    seen: set = set()
    for file in files:
        columns = input_columns(file, cfg)
        check_schema(columns, task, cfg, file.uri)
        seen.update(columns)
    for field, column in named_optional.items():
        if column not in seen:  # a typo here would silently derive every id or seed instead
            raise DatasetSchemaError(
                f"input.{field}: column {column!r} is in none of the {len(files)} input file(s) "
                f"(found columns: {sorted(seen)}); unset it to derive {field[:-7]}s"
            )
    return files


def _validate(
    rows: List[Dict[str, Any]], task: Task, cfg: InputConfig, file: InputFile, first: int
) -> List[Dict[str, Any]]:
    validator = validate_t2i_rows if task == "t2i" else validate_caption_rows
    return validator(rows, cfg, file_key=file.key, first_row_index=first)


def iter_validated_batches(
    cfg: InputConfig, task: Task, files: Optional[List[InputFile]] = None, batch_rows: int = 1024
) -> Iterator[List[Dict[str, Any]]]:
    """Yield validated rows in batches of at most `batch_rows`, file by file.

    Parquet files are streamed by record batch; CSV and JSON lines are read whole.
    Raises IOConfigError when two rows share an id.
    """
    files = files if files is not None else check_dataset(cfg, task)
    seen: Dict[str, str] = {}
    for file in files:
        for first, rows in _iter_file_rows(file, cfg, batch_rows):
            batch = _validate(rows, task, cfg, file, first)
            for offset, row in enumerate(batch):
                location = f"{file.key} row {first + offset}"
                if row["id"] in seen:
                    raise IOConfigError(
                        f"input: id {row['id']!r} appears twice ({seen[row['id']]} and {location}); ids must be unique"
                    )
                seen[row["id"]] = location
            yield batch


def _iter_file_rows(file: InputFile, cfg: InputConfig, batch_rows: int) -> Iterator[Tuple[int, List[Dict[str, Any]]]]:
    """(first row index, rows) chunks of one file."""
    if file.format == "parquet":
        fs, path = resolve_filesystem(file.uri, cfg.s3)
        try:
            with fs.open_input_file(path) as stream:
                first = 0
                for record_batch in pq.ParquetFile(stream).iter_batches(batch_size=batch_rows):
                    yield first, record_batch.to_pylist()
                    first += record_batch.num_rows
        except (OSError, pa.ArrowInvalid) as exc:
            raise IOConfigError(f"input: cannot read {file.uri} as parquet: {exc}") from None
        return
    rows = read_rows(file, cfg)
    for first in range(0, len(rows), batch_rows):
        yield first, rows[first:first + batch_rows]


def load_rows(cfg: InputConfig, task: Task, files: Optional[List[InputFile]] = None) -> List[Dict[str, Any]]:
    """All validated rows of the input, in file order then row order."""
    rows: List[Dict[str, Any]] = []
    for batch in iter_validated_batches(cfg, task, files):
        rows.extend(batch)
    bad = sum(1 for row in rows if row["error"])
    logger.info("input %s: %d row(s), %d with errors", cfg.path, len(rows), bad)
    return rows
