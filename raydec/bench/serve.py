"""`raydec bench serve`: a bounded load on the Serve app from C concurrent clients for S seconds,
beside the in-process rate (``generate_images`` / ``caption_images`` at batch C) measured in
the same run.

    raydec bench serve --concurrency 8 --seconds 60 --json bench_out/serve.json

Starts the app on 127.0.0.1 (reference models, or ``--config``) unless ``--url`` names a running
one. Reports request throughput, p50 / p99 end-to-end latency, time to first token (chat, which
streams), the engine's mean batch size during the load, errors, and ``serve_efficiency`` = the
app's rate / the in-process rate.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import logging
import statistics
import time
import urllib.request
from typing import Any, Optional

from raydec.api import caption_images, generate_images
from raydec.bench.common import json_path_arg, positive_float, positive_int, print_table
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, sample_images

logger = logging.getLogger(__name__)
DEFAULT_MODELS = {"images": "raydec-reference-t2i", "chat": "raydec-reference-vlm"}


def _reference_config(port: int, concurrency: int, threads: int) -> Any:
    from raydec.serve import ServeConfig  # lazy: keeps raydec bench --help light

    batch = max(1, concurrency)
    return ServeConfig.model_validate({
        "port": port, "api_keys_env": None,
        "models": [
            # the methods' default shapes, as the in-process rate decodes with (not 'auto', which would tune at start)
            {"name": DEFAULT_MODELS["images"], "task": "t2i", "decode": {"method": "sjd_pac", "jacobi": {}}, "batch_size": batch,
             "torch_threads": threads, "max_ongoing_requests": 4 * batch},
            {"name": DEFAULT_MODELS["chat"], "task": "caption", "decode": {"method": "vispec", "draft_tree": None}, "batch_size": batch,
             "torch_threads": threads, "max_ongoing_requests": 4 * batch},
        ],
    })


def _prompts(count: int) -> list[str]:
    return [make_sample(HELD_OUT_SEED_START + i).prompt for i in range(count)]


def _images(count: int) -> list[Any]:
    return sample_images([HELD_OUT_SEED_START + i for i in range(count)])


def _png_url(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def in_process_rate(task: str, method: str, batch: int, seconds: float, threads: int) -> dict[str, Any]:
    """Rows per second of the public function at ``batch`` rows per call, for at least ``seconds``
    (whole batches; the first batch, which loads the model, is not timed)."""
    import torch

    torch.set_num_threads(threads)
    prompts, images = _prompts(batch), _images(batch) if task == "chat" else None

    def one_batch(round_: int) -> None:
        seeds = [round_ * batch + i for i in range(batch)]
        if task == "images":
            generate_images(prompts, decode={"method": method}, seeds=seeds, batch_size=batch)
        else:
            caption_images(images, decode={"method": method}, seeds=seeds, batch_size=batch)

    one_batch(0)  # loads and warms the model
    rounds, started = 0, time.perf_counter()
    while rounds == 0 or time.perf_counter() - started < seconds:
        rounds += 1
        one_batch(rounds)
    elapsed = time.perf_counter() - started
    return {"rows": rounds * batch, "seconds": elapsed, "rows_per_s": rounds * batch / elapsed}


async def _load(url: str, key: Optional[str], task: str, model: str, method: Optional[str], concurrency: int,
                seconds: float) -> dict[str, Any]:
    """C clients, each sending its next request when the last one returns, until S seconds have passed."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key=key or "none", max_retries=0, timeout=600)
    prompts = _prompts(64)
    image_urls = [_png_url(image) for image in _images(16)] if task == "chat" else []
    latencies, ttfts, errors = [], [], []
    deadline = time.perf_counter() + seconds
    extra = {"method": method} if method else {}

    async def worker(index: int) -> None:
        sent = 0
        while time.perf_counter() < deadline:
            number = index + concurrency * sent
            sent += 1
            started = time.perf_counter()
            try:
                if task == "images":
                    await client.images.generate(prompt=prompts[number % len(prompts)], model=model, extra_body={"seed": number, **extra})
                else:
                    stream = await client.chat.completions.create(
                        model=model, seed=number, stream=True, extra_body=extra,
                        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_urls[number % len(image_urls)]}},
                                                               {"type": "text", "text": "describe the image ."}]}])
                    first = None
                    async for chunk in stream:
                        if first is None and chunk.choices and chunk.choices[0].delta.content:
                            first = time.perf_counter() - started
                    ttfts.append(first if first is not None else time.perf_counter() - started)
                latencies.append(time.perf_counter() - started)
            except Exception as error:  # counted, not raised: the bench reports errors
                errors.append(f"{type(error).__name__}: {str(error)[:200]}")

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    finally:
        await client.close()
    return {"latencies": latencies, "ttfts": ttfts, "errors": errors, "seconds": time.perf_counter() - started}


def _stats(url: str, key: Optional[str], model: str) -> dict[str, Any]:
    request = urllib.request.Request(url + "/v1/raydec/stats")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)[model]


def _percentile(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _model_method(url: str, key: Optional[str], model: str) -> str:
    request = urllib.request.Request(f"{url}/v1/models/{model}")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["method"]


def bench_serve(args: argparse.Namespace) -> dict:
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per request otherwise
    logging.getLogger("httpx").setLevel(logging.WARNING)
    task = args.task
    model = args.model or DEFAULT_MODELS[task]
    baseline_seconds = args.baseline_seconds or args.seconds / 3
    ray_started = False
    if args.url is None:  # our own app on loopback, started before the baseline so the model is cached nowhere else
        import ray

        from raydec.commands.serve import start  # lazy: keeps raydec bench --help light
        from raydec.runtime.cluster import init_local_ray  # lazy: keeps raydec bench --help light

        if not ray.is_initialized():  # the app's logs stay in Ray's files: printing them here would load this 2-core machine
            init_local_ray(log_to_driver=False)
            ray_started = True
        url = start(_reference_config(args.port, args.concurrency, args.threads))
    else:
        url = args.url.rstrip("/")
    try:
        method = args.method or _model_method(url, args.api_key, model)
        logger.info("bench serve: in-process %s rate at batch %d (%s), %.0f s", task, args.concurrency, method, baseline_seconds)
        baseline = in_process_rate(task, method, args.concurrency, baseline_seconds, args.threads)
        before = _stats(url, args.api_key, model)
        logger.info("bench serve: %d clients for %.0f s on %s", args.concurrency, args.seconds, url)
        load = asyncio.run(_load(url, args.api_key, task, model, method, args.concurrency, args.seconds))
        after = _stats(url, args.api_key, model)
    finally:
        if args.url is None:
            from ray import serve

            serve.shutdown()
            if ray_started:
                import ray

                ray.shutdown()
    steps = after["decode_steps"] - before["decode_steps"]
    done = len(load["latencies"])
    rate = done / load["seconds"]
    result = {
        "task": task, "model": model, "method": method, "url": url, "concurrency": args.concurrency, "seconds": load["seconds"],
        "requests": done + len(load["errors"]), "succeeded": done, "errors": len(load["errors"]), "error_samples": load["errors"][:5],
        "requests_per_s": rate,
        "latency_p50_s": _percentile(load["latencies"], 0.5), "latency_p99_s": _percentile(load["latencies"], 0.99),
        "ttft_p50_s": _percentile(load["ttfts"], 0.5), "ttft_p99_s": _percentile(load["ttfts"], 0.99),
        "mean_batch_size": (after["rows_stepped"] - before["rows_stepped"]) / steps if steps else None,
        "tokens_per_forward": ((after["output_tokens"] - before["output_tokens"]) / max(1, after["target_forwards"] - before["target_forwards"])),
        "in_process": baseline,
        "serve_efficiency": rate / baseline["rows_per_s"] if baseline["rows_per_s"] else None,
        "latency_mean_s": statistics.fmean(load["latencies"]) if load["latencies"] else None,
    }
    _print(result)
    return result


def _fmt(value: Optional[float], spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _print(result: dict) -> None:
    unit = "images" if result["task"] == "images" else "answers"
    print_table(
        f"raydec bench serve: {result['task']} ({result['model']}, {result['method']}), {result['concurrency']} clients, "
        f"{result['seconds']:.0f} s",
        ["path", f"{unit}/s", "p50 s", "p99 s", "ttft p50 s", "ttft p99 s", "mean batch", "errors"],
        [
            ["Serve app (HTTP, openai client)", _fmt(result["requests_per_s"]), _fmt(result["latency_p50_s"]),
             _fmt(result["latency_p99_s"]), _fmt(result["ttft_p50_s"]), _fmt(result["ttft_p99_s"]),
             _fmt(result["mean_batch_size"], ".2f"), str(result["errors"])],
            [f"in process, batch {result['concurrency']}", _fmt(result["in_process"]["rows_per_s"]), "-", "-", "-", "-",
             str(result["concurrency"]), "0"],
        ],
    )
    print(f"serve_efficiency = {_fmt(result['serve_efficiency'])} (app rate / in-process rate)   "
          f"tokens per forward = {_fmt(result['tokens_per_forward'], '.2f')}")


def add_serve_parser(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="load on the Serve app (C clients, S seconds) vs the in-process rate at batch C")
    parser.add_argument("--task", choices=["images", "chat"], default="images", help="which route to load")
    parser.add_argument("--concurrency", type=positive_int, default=8, help="clients at once (and the in-process batch size)")
    parser.add_argument("--seconds", type=positive_float, default=60.0, help="how long the load runs")
    parser.add_argument("--method", default=None, help="decoding method per request (default: the model's)")
    parser.add_argument("--url", default=None, help="a running app's base URL (default: start one on 127.0.0.1)")
    parser.add_argument("--model", default=None, help="served model name (default: the reference app's)")
    parser.add_argument("--api-key", default=None, help="the app's key, if it needs one")
    parser.add_argument("--port", type=positive_int, default=8765, help="port of the app this bench starts")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads, in-process and in the replica")
    parser.add_argument("--baseline-seconds", type=positive_float, default=None, help="in-process timing (default: S / 3)")
    parser.add_argument("--json", type=json_path_arg, default=None, help="write results here")
    parser.set_defaults(bench=bench_serve)
