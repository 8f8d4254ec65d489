"""A batch job's driver at scale: time to the first decoded row and the driver's peak memory.

    python benchmarks/batch_scale.py t2i --rows 2000000          # prompts in Parquet shards on S3
    python benchmarks/batch_scale.py caption --rows 50000        # images: embedded bytes and s3:// URIs

Starts moto's S3 server on 127.0.0.1, writes the dataset there, then runs the job in a child
process (its own local Ray cluster) with ``max_rows`` so it stops after its first rows. The child
is the driver: its peak RSS (``ru_maxrss``) and ``first_row_s`` (from ``run_job``'s start,
preflight and Ray's start included) are what this measures. Writes JSON to --json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

CHILD = r"""
import json, logging, resource, sys, time
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
from raydec.runtime import JobConfig, run_job
job = JobConfig.model_validate(json.loads(sys.argv[1]))
started = time.perf_counter()
report = run_job(job)
print("RESULT " + json.dumps(dict(
    first_row_s=report.timings.get("first_row_s"), prepare_s=report.timings.get("prepare_s"),
    total_s=time.perf_counter() - started, input_rows=report.input_rows, processed=report.processed,
    validation_errors=report.validation_errors, missing=report.missing,
    driver_peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
)), flush=True)
"""


def start_moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    import urllib.request

    for _ in range(300):
        try:
            urllib.request.urlopen(endpoint + "/", timeout=1)
            return process, endpoint
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto_server did not start")


def client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def put_table(s3, bucket: str, key: str, table: pa.Table) -> None:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=65_536)
    s3.put_object(Bucket=bucket, Key=key, Body=sink.getvalue())


def write_prompts(s3, bucket: str, rows: int, shards: int) -> None:
    per_shard = rows // shards
    for shard in range(shards):
        first = shard * per_shard
        put_table(s3, bucket, f"in/part-{shard:03d}.parquet", pa.table({
            "id": [f"p{first + i:08d}" for i in range(per_shard)],
            "prompt": [f"a red circle number {(first + i) % 997} at the top left ." for i in range(per_shard)],
        }))


def tiny_png(index: int) -> bytes:
    from PIL import Image

    image = Image.new("RGB", (32, 32), ((index * 37) % 256, (index * 91) % 256, (index * 53) % 256))
    sink = io.BytesIO()
    image.save(sink, format="PNG")
    return sink.getvalue()


def write_images(s3, bucket: str, rows: int, shards: int) -> None:
    """Half the rows embed their PNG bytes, half name an s3:// object (each its own)."""
    uris = [i for i in range(rows) if i % 2]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=f"images/{i:08d}.png", Body=tiny_png(i)), uris))
    per_shard = rows // shards
    for shard in range(shards):
        indices = range(shard * per_shard, (shard + 1) * per_shard)
        put_table(s3, bucket, f"in/part-{shard:03d}.parquet", pa.table({
            "id": [f"img{i:08d}" for i in indices],
            "image": pa.array([None if i % 2 else tiny_png(i) for i in indices], pa.binary()),
            "image_uri": [f"s3://{bucket}/images/{i:08d}.png" if i % 2 else None for i in indices],
        }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=["t2i", "caption"])
    parser.add_argument("--rows", type=int, default=None, help="default: 2,000,000 prompts / 50,000 images")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--max-rows", type=int, default=8, help="rows the job decodes before it stops")
    parser.add_argument("--json", default="bench_out/batch_scale.json")
    args = parser.parse_args()
    rows = args.rows or (2_000_000 if args.task == "t2i" else 50_000)
    os.environ.update(CREDENTIALS)
    moto, endpoint = start_moto()
    try:
        s3 = client(endpoint)
        s3.create_bucket(Bucket="scale")
        started = time.perf_counter()
        (write_prompts if args.task == "t2i" else write_images)(s3, "scale", rows, args.shards)
        print(f"wrote {rows} row(s) to s3://scale/in/ in {time.perf_counter() - started:.0f} s", flush=True)
        storage = {"endpoint_url": endpoint, "region": "us-east-1"}
        job = dict(
            task=args.task, model="reference", max_rows=args.max_rows,
            input={"path": "s3://scale/in/", "s3": storage}, output={"path": "s3://scale/out", "s3": storage},
            pool={"workers": 1, "batch_size": 4, "cpus_per_worker": 0.5},
            decode={"method": "sjd_pac" if args.task == "t2i" else "vispec"},
        )
        child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(job)], cwd=REPO, env=dict(os.environ),
                               capture_output=True, text=True, timeout=1800)
        lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
        if child.returncode or not lines:
            sys.stderr.write(child.stderr[-4000:])
            raise SystemExit(f"the job failed (exit {child.returncode})")
        result = dict(task=args.task, rows=rows, shards=args.shards, **json.loads(lines[-1][len("RESULT "):]))
    finally:
        moto.terminate()
    print(json.dumps(result, indent=2))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
