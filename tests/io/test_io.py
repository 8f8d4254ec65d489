"""raydec.io: datasets, validation, images, writers; local and against a real S3 endpoint (moto)."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from PIL import Image
from pydantic import ValidationError

from raydec.io import (
    RESULT_SCHEMA,
    DatasetSchemaError,
    ImageError,
    InputConfig,
    IOConfigError,
    OutputConfig,
    OutputLocation,
    OutputNotWritableError,
    ResultWriter,
    S3Config,
    attach_caption_images,
    check_dataset,
    check_output_writable,
    completed_ids,
    decode_image,
    derive_seed,
    encode_png,
    error_result,
    list_input_files,
    load_rows,
    read_manifest,
    read_results,
    validate_t2i_rows,
    write_manifest,
)
from raydec.io.filesystem import s3_client
from raydec.io.writers import image_key

PROMPTS = [
    {"id": "a", "prompt": "a red circle", "seed": 7},
    {"id": "b", "prompt": "a blue square", "seed": None},
    {"id": "c", "prompt": "a green triangle on a white background", "seed": 11},
]


def _png(color=(255, 0, 0), size=(8, 6)) -> bytes:
    return encode_png(np.full((size[1], size[0], 3), color, dtype=np.uint8))


def _write(path: str, rows: list, fmt: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if fmt == "parquet":  # from_pylist takes its columns from the first row only: pass them all
        columns = list(dict.fromkeys(key for row in rows for key in row))
        pq.write_table(pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows]), path)
    elif fmt == "jsonl":
        with open(path, "w") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
    else:
        columns = list(rows[0])
        with open(path, "w") as handle:
            handle.write(",".join(columns) + "\n")
            for row in rows:
                handle.write(",".join("" if row[c] is None else str(row[c]) for c in columns) + "\n")
    return path


def _result(row_id: str, error=None, **extra) -> dict:
    return dict(id=row_id, source=f"prompt {row_id}", prompt=f"prompt {row_id}", seed=1, method="sjd_pac",
                target_forwards=3, tokens=12, tokens_per_forward=4.0, latency_s=0.5, error=error, **extra)


# ---------------------------------------------------------------- reading local inputs


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_local_formats_read_the_same_rows(tmp_path, fmt):
    path = _write(str(tmp_path / f"prompts.{fmt}"), PROMPTS, fmt)
    rows = load_rows(InputConfig(path=path, seed=3), "t2i")
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    assert [r["prompt"] for r in rows] == [p["prompt"] for p in PROMPTS]
    assert rows[0]["seed"] == 7 and rows[2]["seed"] == 11
    assert rows[1]["seed"] == derive_seed("b", 3)
    assert all(r["error"] is None for r in rows)


def test_folder_and_glob_listing(tmp_path):
    _write(str(tmp_path / "a.parquet"), PROMPTS[:1], "parquet")
    _write(str(tmp_path / "sub" / "b.jsonl"), PROMPTS[1:2], "jsonl")
    _write(str(tmp_path / "sub" / "deeper" / "c.csv"), PROMPTS[2:], "csv")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / "notes.txt").write_text("not data")
    (tmp_path / ".a.parquet.tmp-123").write_bytes(b"half a file")
    folder = list_input_files(InputConfig(path=str(tmp_path)))
    assert [(f.key, f.format) for f in folder] == [
        ("a.parquet", "parquet"), ("sub/b.jsonl", "jsonl"), ("sub/deeper/c.csv", "csv")]
    assert [r["id"] for r in load_rows(InputConfig(path=str(tmp_path)), "t2i")] == ["a", "b", "c"]
    assert [f.key for f in list_input_files(InputConfig(path=str(tmp_path), format="jsonl"))] == ["sub/b.jsonl"]
    assert [f.key for f in list_input_files(InputConfig(path=str(tmp_path / "*.parquet")))] == ["a.parquet"]
    assert [f.key for f in list_input_files(InputConfig(path=str(tmp_path / "**" / "*.csv")))] == ["sub/deeper/c.csv"]
    with pytest.raises(DatasetSchemaError, match="matches no"):
        list_input_files(InputConfig(path=str(tmp_path / "*.nothing")))
    with pytest.raises(DatasetSchemaError, match="does not exist"):
        list_input_files(InputConfig(path=str(tmp_path / "missing")))
    with pytest.raises(DatasetSchemaError, match="cannot infer the format of .*notes.txt"):
        list_input_files(InputConfig(path=str(tmp_path / "notes.txt")))
    (tmp_path / "rows.txt").write_text('{"prompt": "from a .txt file"}\n')
    assert load_rows(InputConfig(path=str(tmp_path / "rows.txt"), format="jsonl"), "t2i")[0]["id"] == "rows.txt#0"


def test_derived_ids_and_seeds_are_stable(tmp_path):
    path = _write(str(tmp_path / "p.parquet"), [{"prompt": "x"}, {"prompt": "y"}], "parquet")
    first = load_rows(InputConfig(path=path, seed=5), "t2i")
    again = load_rows(InputConfig(path=path, seed=5), "t2i")
    other_job = load_rows(InputConfig(path=path, seed=6), "t2i")
    assert [r["id"] for r in first] == ["p.parquet#0", "p.parquet#1"]
    assert first == again
    assert [r["seed"] for r in first] != [r["seed"] for r in other_job]
    assert all(0 <= r["seed"] < 2**63 for r in first)


def test_csv_ids_stay_strings(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("id,prompt\n007,hello\n8,world\n")
    assert [r["id"] for r in load_rows(InputConfig(path=str(path)), "t2i")] == ["007", "8"]


# ---------------------------------------------------------------- bad rows and bad configs


def test_bad_t2i_rows_get_errors_naming_field_and_value():
    cfg = InputConfig(path="unused", max_prompt_words=256)
    rows = [
        {"id": "ok", "prompt": "fine"},
        {"id": "empty", "prompt": "   "},
        {"id": "null", "prompt": None},
        {"id": "long", "prompt": " ".join(["word"] * 1200)},
        {"id": "seed", "prompt": "fine", "seed": "abc"},
        {"id": 12, "prompt": "fine", "seed": -1},
    ]
    out = {r["id"]: r for r in validate_t2i_rows(rows, cfg, file_key="f.parquet")}
    assert len(out) == len(rows)
    assert out["ok"]["error"] is None
    assert out["empty"]["error"] == "prompt: empty"
    assert out["null"]["error"] == "prompt: missing (null)"
    assert out["long"]["error"] == "prompt: 1200 words exceeds max_prompt_words=256"
    assert out["seed"]["error"] == "seed: 'abc' is not an integer"
    assert out["12"]["error"] == "seed: -1 is outside [0, 2**63)"
    assert isinstance(out["12"]["seed"], int)


def test_malformed_jsonl_line_is_one_bad_row(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "x"}\n{not json\n{"id": "c", "prompt": "z"}\n')
    rows = load_rows(InputConfig(path=str(path)), "t2i")
    assert [r["id"] for r in rows] == ["a", "p.jsonl#1", "c"]
    assert "line 2" in rows[1]["error"] and "not valid JSON" in rows[1]["error"]


def test_jsonl_lines_end_at_newline_only_and_any_unparsable_line_is_one_bad_row(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [
        json.dumps({"id": "sep", "prompt": "a cat\u2028on a mat"}, ensure_ascii=False),  # U+2028 inside a string
        '{"id": "big", "prompt": "x", "seed": ' + "9" * 5000 + "}",  # past Python's int-conversion limit
        "[" * 100_000 + "]" * 100_000,  # nesting too deep for the parser
        '{"id": "crlf", "prompt": "y"}\r',
    ]
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n\xff\xfe\n")
    rows = load_rows(InputConfig(path=str(path)), "t2i")
    assert [r["id"] for r in rows] == ["sep", "p.jsonl#1", "p.jsonl#2", "crlf", "p.jsonl#4"]
    assert rows[0]["error"] is None and rows[0]["prompt"] == "a cat\u2028on a mat"  # the BOM is not an error
    assert rows[1]["error"] == "row: line 2 of p.jsonl cannot be parsed (ValueError)"
    assert rows[2]["error"] == "row: line 3 of p.jsonl cannot be parsed (RecursionError)"
    assert rows[3]["error"] is None
    assert rows[4]["error"] == "row: line 5 of p.jsonl is not UTF-8 (byte 0)"


def test_csv_line_with_wrong_column_count_is_one_bad_row_in_its_place(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("id,prompt\na,a cat\nb,a dog,extra\nc,a cow\n")
    rows = load_rows(InputConfig(path=str(path)), "t2i")
    assert [r["id"] for r in rows] == ["a", "p.csv#1", "c"]
    assert rows[1]["error"] == "row: line 3 of p.csv has the wrong number of columns ('b,a dog,extra')"
    assert rows[0]["error"] is None and rows[2]["error"] is None


def test_odd_ids_and_seeds_are_row_errors_not_crashes():
    cfg = InputConfig(path="unused")
    rows = [
        {"id": {"k": 1}, "prompt": "fine"},
        {"id": "superscript", "prompt": "fine", "seed": "\u00b2"},  # isdigit() but not int()
        {"id": "long", "prompt": "fine", "seed": "9" * 5000},
        {"id": "padded", "prompt": "fine", "seed": " 0007 "},
    ]
    out = validate_t2i_rows(rows, cfg, file_key="f.jsonl")
    assert out[0]["error"] == "id: {'k': 1} is not a string or integer" and out[0]["id"] == "f.jsonl#0"
    assert out[1]["error"] == "seed: '\u00b2' is not an integer"
    assert out[2]["error"].startswith("seed: '99999") and out[2]["error"].endswith("is outside [0, 2**63)")
    assert out[3]["error"] is None and out[3]["seed"] == 7


def test_decompression_bomb_is_a_row_error(tmp_path):
    bomb = io.BytesIO()
    Image.new("1", (20_000, 20_000)).save(bomb, format="PNG")  # 400M pixels, a few KB of PNG
    _write(str(tmp_path / "c.parquet"), [{"id": "bomb", "image": bomb.getvalue()}, {"id": "ok", "image": _png()}],
           "parquet")
    out = {r["id"]: r for r in load_rows(InputConfig(path=str(tmp_path / "c.parquet")), "caption")}
    # refused from its header, before any decoding: 20000x20000 is past max_image_pixels
    assert out["bomb"]["error"] == "image: image declares 20000x20000 = 400000000 pixels, more than max_image_pixels=16777216"
    assert out["ok"]["error"] is None
    # a limit above it leaves PIL's own decompression-bomb check, which still refuses it
    lenient = InputConfig(path=str(tmp_path / "c.parquet"), max_image_pixels=10**9)
    out = {r["id"]: r for r in load_rows(lenient, "caption")}
    assert out["bomb"]["error"].startswith("image: corrupt bytes") and "exceeds limit" in out["bomb"]["error"]


def test_16_bit_images_are_scaled_and_float_images_refused():
    sixteen = io.BytesIO()
    Image.fromarray(np.full((4, 4), 1000, np.uint16)).save(sixteen, format="PNG")
    assert decode_image(sixteen.getvalue()).getpixel((0, 0)) == (4, 4, 4)  # 1000 / 257, not clipped to white
    floating = io.BytesIO()
    Image.fromarray(np.full((4, 4), 0.5, np.float32)).save(floating, format="TIFF")
    with pytest.raises(ImageError, match=r"image: float pixels \(PIL mode 'F'\) have no fixed range"):
        decode_image(floating.getvalue())


def test_a_named_id_or_seed_column_must_exist(tmp_path):
    path = _write(str(tmp_path / "p.jsonl"), [{"id": "x", "prompt": "a", "seed": 1}], "jsonl")
    with pytest.raises(DatasetSchemaError, match=r"input.id_column: column 'ID' is in none of the 1 input file"):
        check_dataset(InputConfig(path=path, id_column="ID"), "t2i")
    with pytest.raises(DatasetSchemaError, match=r"input.seed_column: column 'Seed'.*unset it to derive seeds"):
        check_dataset(InputConfig(path=path, seed_column="Seed"), "t2i")
    assert check_dataset(InputConfig(path=path, id_column="id"), "t2i")
    with pytest.raises(ValidationError, match="id_column"):
        InputConfig(path=path, id_column="")


def test_bad_caption_rows_get_errors(tmp_path, s3_config, s3_bucket):
    good = tmp_path / "good.png"
    good.write_bytes(_png((0, 255, 0)))
    s3_client(s3_config).put_object(Bucket=s3_bucket, Key="imgs/ok.png", Body=_png((0, 0, 255)))
    rows = [
        {"id": "bytes", "image": _png(), "prompt": "Describe."},
        {"id": "corrupt", "image": b"\x89PNG not really an image"},
        {"id": "truncated", "image": _png()[:40]},
        {"id": "local", "image_uri": str(good)},
        {"id": "local-missing", "image_uri": str(tmp_path / "nope.png")},
        {"id": "s3", "image_uri": f"s3://{s3_bucket}/imgs/ok.png"},
        {"id": "s3-missing", "image_uri": f"s3://{s3_bucket}/imgs/missing.png"},
        {"id": "neither"},
    ]
    _write(str(tmp_path / "in" / "c.parquet"), rows, "parquet")
    cfg = InputConfig(path=str(tmp_path / "in"), s3=s3_config)
    out = {r["id"]: r for r in attach_caption_images(load_rows(cfg, "caption"), s3_config)}
    assert len(out) == len(rows)
    for ok in ("bytes", "local", "s3"):
        assert out[ok]["error"] is None and out[ok]["pil_image"].size == (8, 6), ok
    assert out["s3"]["pil_image"].getpixel((0, 0)) == (0, 0, 255)
    assert out["corrupt"]["error"].startswith("image: corrupt bytes")
    assert out["truncated"]["error"].startswith("image: corrupt bytes")
    assert out["local-missing"]["error"] == f"image_uri: {tmp_path / 'nope.png'} not found"
    assert out["s3-missing"]["error"] == f"image_uri: s3://{s3_bucket}/imgs/missing.png not found"
    assert out["neither"]["error"].startswith("image: missing")
    assert out["s3"]["source"] == f"s3://{s3_bucket}/imgs/ok.png"


def test_missing_required_column_fails_fast(tmp_path):
    path = _write(str(tmp_path / "p.parquet"), [{"text": "a prompt", "id": "x"}], "parquet")
    with pytest.raises(DatasetSchemaError, match=r"has no 'prompt' column.*found columns: \['text', 'id'\]"):
        check_dataset(InputConfig(path=path), "t2i")
    assert check_dataset(InputConfig(path=path, prompt_column="text"), "t2i")
    with pytest.raises(DatasetSchemaError, match="neither an 'image' nor an 'image_uri'"):
        check_dataset(InputConfig(path=path), "caption")


def test_preflight_reads_a_csv_header_and_streams_json_lines_keys_without_holding_rows(tmp_path, monkeypatch):
    from raydec.io import datasets

    csv = tmp_path / "p.csv"
    csv.write_text("id,prompt\n" + "".join(f"{i},a red circle\n" for i in range(50_000)))
    lines = tmp_path / "p.jsonl"
    lines.write_text("not json\n" + "\n".join(json.dumps({"id": i}) for i in range(20_000)) + '\n{"prompt": "late"}')
    monkeypatch.setattr(datasets, "read_table", None)  # a whole-file read would fail here
    monkeypatch.setattr(datasets, "_read_jsonl_rows", None)
    assert check_dataset(InputConfig(path=str(csv)), "t2i")
    assert check_dataset(InputConfig(path=str(lines)), "t2i")  # the prompt column comes on the last line

    reads = []

    class Counting(io.BytesIO):
        def read(self, size=-1):
            data = super().read(size)
            reads.append(len(data))
            return data

    assert datasets._jsonl_keys(Counting(lines.read_bytes()), chunk_bytes=1 << 12) == ["id", "prompt"]
    assert len(reads) > 10 and max(reads) == 1 << 12  # a chunk at a time, never the whole file


def test_duplicate_ids_fail(tmp_path):
    path = _write(str(tmp_path / "p.jsonl"), [{"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}], "jsonl")
    with pytest.raises(IOConfigError, match="id 'x' appears twice"):
        load_rows(InputConfig(path=path), "t2i")


def test_unknown_config_keys_are_rejected():
    with pytest.raises(ValidationError, match="promt_column"):
        InputConfig(path="x.parquet", promt_column="text")
    with pytest.raises(ValidationError, match="shard_sise"):
        OutputConfig.model_validate({"path": "out", "shard_sise": 3})
    with pytest.raises(ValidationError, match="endpoint"):
        S3Config.model_validate({"endpoint": "http://x"})
    with pytest.raises(ValidationError, match="http:// or https://"):
        S3Config(endpoint_url="127.0.0.1:9000")
    with pytest.raises(ValidationError, match="names no host"):
        S3Config(endpoint_url="http://")
    with pytest.raises(ValidationError, match=r"shard_size\n.*boolean"):
        OutputConfig(path="out", shard_size=True)


def test_locations_are_local_paths_or_s3_buckets():
    assert OutputConfig(path="s3://bucket/out").path == "s3://bucket/out" and InputConfig(path="data/*.parquet").path
    with pytest.raises(ValidationError, match=r"path\n.*'gs://bucket/x': unsupported scheme gs://"):
        OutputConfig(path="gs://bucket/x")
    with pytest.raises(ValidationError, match=r"path\n.*'s3://': no bucket name"):
        InputConfig(path="s3://")
    with pytest.raises(ValidationError, match=r"'s3:/bucket/out': an S3 location is written s3://bucket/prefix"):
        OutputConfig(path="s3:/bucket/out")
    config = InputConfig(path="x.parquet")
    with pytest.raises(ValidationError, match="unsupported scheme https://"):  # an override is checked as well
        config.path = "https://example.com/x.parquet"


def test_s3_config_falls_back_to_aws_env(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    resolved = S3Config(region="us-west-2").resolved()
    assert resolved.endpoint_url == "http://127.0.0.1:1"
    assert resolved.region == "us-west-2"
    assert resolved.access_key_id == "env-key"
    assert "env-key" not in repr(S3Config(secret_access_key="env-key"))


def test_unreachable_output_fails_fast(tmp_path, s3_config, monkeypatch):
    from raydec.io import storage

    with pytest.raises(OutputNotWritableError, match="bucket 'no-such-bucket' does not exist"):
        check_output_writable(OutputConfig(path="s3://no-such-bucket/out", s3=s3_config))
    dead = s3_config.model_copy(update={"endpoint_url": "http://127.0.0.1:9", "connect_timeout_s": 1.0})
    used = []  # the S3 settings of every client the check builds (the real client is built)
    real_client = storage.s3_client
    monkeypatch.setattr(storage, "s3_client", lambda s3: used.append(s3) or real_client(s3))
    with pytest.raises(OutputNotWritableError, match="cannot reach S3 endpoint http://127.0.0.1:9"):
        check_output_writable(OutputConfig(path="s3://bucket/out", s3=dead))
    # fast = one attempt with the short connect timeout, not the job's retries
    assert [(s3.max_attempts, s3.connect_timeout_s) for s3 in used] == [(1, 1.0)]
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(OutputNotWritableError, match="not a folder"):
        check_output_writable(OutputConfig(path=str(tmp_path / "a-file")))
    check_output_writable(OutputConfig(path=str(tmp_path / "new" / "out")))
    assert os.listdir(tmp_path / "new" / "out") == []


def test_unreachable_or_missing_s3_input_fails_fast(s3_config):
    with pytest.raises(DatasetSchemaError, match="s3://no-such-bucket/prompts .* does not exist"):
        check_dataset(InputConfig(path="s3://no-such-bucket/prompts", s3=s3_config), "t2i")
    dead = s3_config.model_copy(update={"endpoint_url": "http://127.0.0.1:9", "max_attempts": 1})
    with pytest.raises(IOConfigError, match="cannot reach s3://bucket/prompts"):
        check_dataset(InputConfig(path="s3://bucket/prompts", s3=dead), "t2i")


# ---------------------------------------------------------------- images


def test_image_codecs():
    pixels = np.linspace(0, 1, 4 * 5 * 3).reshape(4, 5, 3)
    decoded = decode_image(encode_png(pixels))
    assert decoded.size == (5, 4) and decoded.mode == "RGB"
    assert np.abs(np.asarray(decoded) / 255.0 - pixels).max() < 1 / 255
    assert decode_image(encode_png(Image.new("L", (3, 2))), mode=None).mode == "L"
    with pytest.raises(ImageError, match="image: corrupt bytes"):
        decode_image(b"garbage")
    with pytest.raises(ImageError, match=r"image: array shape \(4, 5, 2\)"):
        encode_png(np.zeros((4, 5, 2), dtype=np.uint8))
    assert image_key("plain-id_1.x") == "plain-id_1.x"
    assert image_key("a/b c") != image_key("a_b_c") and "/" not in image_key("a/b c")


# ---------------------------------------------------------------- writers


def _run_job(output: OutputConfig, rows: list, worker: str = "0", stop_after: int | None = None) -> int:
    """A miniature job: skip completed ids, write an image and a result per row; optionally 'crash'."""
    done = completed_ids(output)
    writer = ResultWriter(output, worker_id=worker)
    written = 0
    for row in rows:
        if row["id"] in done:
            continue
        if stop_after is not None and written == stop_after:
            return written  # killed: the buffered rows are never flushed
        if row["error"]:
            writer.add(error_result(row, "sjd_pac"))
        else:
            uri = writer.write_image(row["id"], _png((len(row["id"]) * 40 % 255, 0, 0)))
            writer.add(_result(row["id"], output_uri=uri) | {"seed": row["seed"], "source": row["source"]})
        written += 1
    writer.close()
    return written


def test_writer_round_trip_local(tmp_path):
    output = OutputConfig(path=str(tmp_path / "out"), shard_size=2)
    rows = validate_t2i_rows([{"id": f"r{i}", "prompt": f"p {i}"} for i in range(5)] + [{"id": "bad", "prompt": ""}],
                             InputConfig(path="x"))
    assert _run_job(output, rows) == 6
    assert [os.path.basename(u) for u in OutputLocation(output).shard_uris()] == [
        "part-0-00000.parquet", "part-0-00001.parquet", "part-0-00002.parquet"]
    results = read_results(output)
    assert results.schema == RESULT_SCHEMA
    assert results["id"].to_pylist() == ["bad", "r0", "r1", "r2", "r3", "r4"]
    bad = results.filter(pa.compute.equal(results["id"], "bad")).to_pylist()[0]
    assert bad["error"] == "prompt: empty" and bad["output_uri"] is None
    image_path = results["output_uri"].to_pylist()[1]
    assert image_path == str(tmp_path / "out" / "images" / "r0.png")
    assert decode_image(open(image_path, "rb").read()).size == (8, 6)
    write_manifest(output, InputConfig(path="x", s3=S3Config(secret_access_key="hush")), {"rows": 6}, {"total_s": 1.5})
    manifest = read_manifest(output)
    assert manifest["counts"] == {"rows": 6} and manifest["timings"] == {"total_s": 1.5}
    assert manifest["config"]["s3"]["secret_access_key"] == "***"
    assert manifest["versions"]["python"] and "ray" in manifest["versions"] and "torch" in manifest["versions"]


def test_end_to_end_on_s3(s3_config, s3_bucket):
    client = s3_client(s3_config)
    for name, rows in {"prompts/part-0.parquet": PROMPTS[:2], "prompts/more/part-1.parquet": PROMPTS[2:]}.items():
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), sink)
        client.put_object(Bucket=s3_bucket, Key=name, Body=sink.getvalue())
    client.put_object(Bucket=s3_bucket, Key="prompts/_SUCCESS", Body=b"")
    cfg = InputConfig(path=f"s3://{s3_bucket}/prompts", s3=s3_config)
    files = check_dataset(cfg, "t2i")
    assert [f.uri for f in files] == [f"s3://{s3_bucket}/prompts/more/part-1.parquet",
                                      f"s3://{s3_bucket}/prompts/part-0.parquet"]
    glob_cfg = InputConfig(path=f"s3://{s3_bucket}/prompts/*.parquet", s3=s3_config)
    assert [f.key for f in list_input_files(glob_cfg)] == ["part-0.parquet"]
    rows = load_rows(cfg, "t2i", files)
    assert sorted(r["id"] for r in rows) == ["a", "b", "c"]

    output = OutputConfig(path=f"s3://{s3_bucket}/run1", shard_size=2, s3=s3_config)
    check_output_writable(output)
    assert _run_job(output, rows) == 3
    write_manifest(output, {"input": cfg.model_dump(), "output": output.model_dump()}, {"rows": 3}, {"total_s": 0.1})

    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket, Prefix="run1/")["Contents"])
    assert keys == ["run1/images/a.png", "run1/images/b.png", "run1/images/c.png", "run1/manifest.json",
                    "run1/results/part-0-00000.parquet", "run1/results/part-0-00001.parquet"]
    png = client.get_object(Bucket=s3_bucket, Key="run1/images/a.png")["Body"].read()
    assert decode_image(png).size == (8, 6)
    manifest = json.loads(client.get_object(Bucket=s3_bucket, Key="run1/manifest.json")["Body"].read())
    assert manifest["config"]["input"]["s3"]["secret_access_key"] == "***"
    fs = pafs.S3FileSystem(endpoint_override=s3_config.endpoint_url.split("://")[1], scheme="http",
                           region="us-east-1", access_key="testing", secret_key="testing")
    shard = pq.read_table(f"{s3_bucket}/run1/results/part-0-00000.parquet", filesystem=fs)
    assert shard.schema == RESULT_SCHEMA and shard.num_rows == 2
    results = read_results(output)
    assert results["id"].to_pylist() == ["a", "b", "c"]
    assert results["output_uri"].to_pylist()[0] == f"s3://{s3_bucket}/run1/images/a.png"
    assert results["seed"].to_pylist()[0] == 7


@pytest.mark.parametrize("where", ["local", "s3"])
def test_restart_skips_completed_rows_and_ignores_temp_files(tmp_path, where, request):
    if where == "s3":
        s3_config, bucket = request.getfixturevalue("s3_config"), request.getfixturevalue("s3_bucket")
        output = OutputConfig(path=f"s3://{bucket}/out", shard_size=2, s3=s3_config)
        s3_client(s3_config).put_object(Bucket=bucket, Key="out/results/.part-0-00009.parquet.tmp-dead",
                                        Body=b"half a shard")
    else:
        output = OutputConfig(path=str(tmp_path / "out"), shard_size=2)
        os.makedirs(tmp_path / "out" / "results")
        (tmp_path / "out" / "results" / ".part-0-00009.parquet.tmp-dead").write_bytes(b"half a shard")
    rows = validate_t2i_rows([{"id": f"r{i}", "prompt": f"p {i}"} for i in range(7)], InputConfig(path="x"))

    assert completed_ids(output) == set()
    assert _run_job(output, rows, stop_after=3) == 3  # one shard of 2 flushed, 1 row lost in the buffer
    assert completed_ids(output) == {"r0", "r1"}
    assert _run_job(output, rows) == 5
    results = read_results(output)
    assert results["id"].to_pylist() == [f"r{i}" for i in range(7)]
    assert [os.path.basename(u) for u in OutputLocation(output).shard_uris()] == [
        f"part-0-0000{i}.parquet" for i in range(4)]
    assert _run_job(output, rows) == 0


def test_killed_local_write_leaves_no_shard(tmp_path, monkeypatch):
    output = OutputConfig(path=str(tmp_path / "out"), shard_size=10)
    writer = ResultWriter(output)
    writer.add(_result("x"))

    def killed(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        writer.flush()
    assert os.listdir(tmp_path / "out" / "results") == []
    assert completed_ids(output) == set()


def test_duplicated_shards_are_deduplicated(tmp_path):
    output = OutputConfig(path=str(tmp_path / "out"), shard_size=100)
    with ResultWriter(output, worker_id="w1") as first:
        first.add(_result("a"))
        first.add(_result("b", error="prompt: empty"))
    with ResultWriter(output, worker_id="w2") as retry:  # a crash-retry rewrote the same rows
        retry.add(_result("a"))
        retry.add(_result("b"))
        retry.add(_result("c"))
    assert completed_ids(output) == {"a", "b", "c"}
    assert completed_ids(output, include_errors=False) == {"a", "b", "c"}
    results = read_results(output)
    assert results["id"].to_pylist() == ["a", "b", "c"]
    assert results["error"].to_pylist() == [None, None, None]
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['colour'\]"):
        ResultWriter(output).add(_result("d", colour="red"))


def test_shards_written_before_the_column_rename_still_read(tmp_path):
    """Results written as `mean_accepted` (before it was named `tokens_per_forward`) read back under
    the new name beside new shards, so a resumed output keeps its rows."""
    output = OutputConfig(path=str(tmp_path / "out"), shard_size=100)
    with ResultWriter(output, worker_id="new") as writer:
        writer.add(_result("a"))
    new_shard = OutputLocation(output).shard_uris()[0]
    table = pq.read_table(new_shard.removeprefix("file://"))
    old = table.rename_columns(["mean_accepted" if n == "tokens_per_forward" else n for n in table.column_names])
    old = old.set_column(old.column_names.index("id"), "id", pa.array(["b"]))
    pq.write_table(old, new_shard.removeprefix("file://").replace("new", "old"))
    assert len(OutputLocation(output).shard_uris()) == 2
    results = read_results(output)
    assert sorted(results["id"].to_pylist()) == ["a", "b"]
    assert results["tokens_per_forward"].to_pylist() == [4.0, 4.0]
    assert completed_ids(output) == {"a", "b"}
