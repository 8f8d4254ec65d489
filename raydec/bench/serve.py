"""`raydec bench serve`: a bounded load on the Serve app beside the in-process rate
(``generate_images`` / ``caption_images`` at the same batch) measured in the same run.

    raydec bench serve --concurrency 8 --seconds 60 --json bench_out/serve.json
    raydec bench serve --rates 0.5,1,2 --requests 64 --config serve.yaml --models a,b --plots bench_out

Starts the app on 127.0.0.1 (reference models, or ``--config``) unless ``--url`` names a running
one. Closed loop (the default): C clients, each sending its next request when the last returns,
for S seconds; reports request throughput, p50 / p99 end-to-end latency, time to first token
(chat, which streams), the engine's mean batch size during the load, errors, and
``serve_efficiency`` = the app's rate / the in-process rate. Open loop (``--rates``): Poisson
arrivals at each rate against each served model in turn (``raydec.bench.open_loop``).
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
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from raydec.api import caption_images, generate_images, load_target
from raydec.api.draft_shapes import apply_shape
from raydec.bench.common import folder_path_arg, json_path_arg, positive_float, positive_int, print_table
from raydec.bench.open_loop import Target, open_loop, percentile, plot, positive_float_list, print_rows, step_figures, summarise
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, sample_images

logger = logging.getLogger(__name__)
DEFAULT_MODELS = {"images": "raydec-reference-t2i", "chat": "raydec-reference-vlm"}
SERVED_TASKS = {"images": "t2i", "chat": "caption"}
REFERENCE_PORT = 8765


def share_arg(text: str) -> float:
    """A share between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: a share is between 0 and 1")
    return value


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


def in_process_rate(task: str, method: str, batch: int, seconds: float, threads: int, model: Any = "reference",
                    decode: Any = None, batching: Optional[str] = None) -> dict[str, Any]:
    """Rows per second of the public function at ``batch_size=batch``, for at least ``seconds`` (whole
    calls; a first call of ``batch`` rows, which loads the model, is not timed). ``decode``: a
    DecodeConfig (default: ``method`` with its default shape); ``model``: a name, folder or target;
    ``batching``: the decode config's ``batching`` instead of its own (on a CPU "auto" is consecutive).
    A call holds ``batch`` rows, or four times as many with ``batching`` "continuous", so that
    finished rows' places are refilled (the last ones drain as in any call)."""
    import torch

    from raydec.api.inputs import as_decode_config  # lazy: keeps raydec bench --help light

    torch.set_num_threads(threads)
    rows = batch if batching != "continuous" else 4 * batch
    prompts, images = _prompts(rows), _images(rows) if task == "chat" else None
    decode = as_decode_config(decode if decode is not None else {"method": method})
    if batching is not None:
        decode = decode.model_copy(update={"batching": batching})

    def one_call(round_: int, count: int) -> None:
        seeds = [round_ * rows + i for i in range(count)]
        if task == "images":
            generate_images(prompts[:count], model=model, decode=decode, seeds=seeds, batch_size=batch)
        else:
            caption_images(images[:count], model=model, decode=decode, seeds=seeds, batch_size=batch)

    one_call(0, batch)  # loads and warms the model
    rounds, started = 0, time.perf_counter()
    while rounds == 0 or time.perf_counter() - started < seconds:
        rounds += 1
        one_call(rounds, rows)
    elapsed = time.perf_counter() - started
    return {"rows": rounds * rows, "seconds": elapsed, "rows_per_s": rounds * rows / elapsed,
            "batching": decode.batching}


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


def _model_method(url: str, key: Optional[str], model: str) -> str:
    request = urllib.request.Request(f"{url}/v1/models/{model}")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["method"]


def _app_config(args: argparse.Namespace) -> Any:
    """The ServeConfig the bench starts (``--config``, else the reference one), on 127.0.0.1; or the
    ``--config`` given beside ``--url`` (what the running app serves); None when neither is known."""
    from raydec.serve import ServeConfig  # lazy: keeps raydec bench --help light

    if args.config is None:
        return None if args.url else _reference_config(args.port or REFERENCE_PORT, args.concurrency, args.threads)
    config = ServeConfig.from_yaml(args.config)  # as raydec serve --config loads it
    return config.model_copy(update={"host": "127.0.0.1", **({"port": args.port} if args.port else {})})


@contextmanager
def _app(args: argparse.Namespace, config: Any) -> Iterator[str]:
    """The app's base URL: ``--url``, or the app this bench starts from ``config`` (shut down on exit)."""
    if args.url is not None:
        yield args.url.rstrip("/")
        return
    import ray
    from ray import serve

    from raydec.commands.serve import start  # lazy: keeps raydec bench --help light
    from raydec.runtime.cluster import init_local_ray  # lazy: keeps raydec bench --help light

    ray_started = not ray.is_initialized()
    if ray_started:  # the app's logs stay in Ray's files: printing them here would load this 2-core machine
        init_local_ray(log_to_driver=False)
    try:  # started before the baseline, so the model is cached nowhere else
        yield start(config)
    finally:
        serve.shutdown()
        if ray_started:
            ray.shutdown()


def _model_names(args: argparse.Namespace, config: Any) -> list[str]:
    """``--models``; by default the task's reference model, or every model of the task in ``--config``."""
    if args.models:
        names = [n.strip() for n in args.models.split(",") if n.strip()]
        if len(set(names)) < len(names):
            raise SystemExit(f"--models {args.models!r}: a model named more than once")
        unknown = [n for n in names if config is not None and config.model(n) is None]
        if unknown:
            raise SystemExit(f"--models: {', '.join(unknown)} not served (the app serves {', '.join(m.name for m in config.models)})")
        return names
    if args.config is not None:
        names = [m.name for m in config.models if m.task == SERVED_TASKS[args.task]]
        if not names:
            raise SystemExit(f"--config {args.config}: no model of task {SERVED_TASKS[args.task]!r} (for --task {args.task})")
        return names
    return [DEFAULT_MODELS[args.task]]


def bench_serve(args: argparse.Namespace) -> dict:
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per request otherwise
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = _app_config(args)
    models = _model_names(args, config)
    if args.rates is None and args.long_prompts:
        raise SystemExit("--long-prompts: give --rates (long prompts join an open-loop load)")
    if args.rates is None and len(models) > 1:
        raise SystemExit(f"--models {args.models!r}: the closed loop loads one model; give --rates to compare several")
    if args.api_key is None and config is not None and config.keys():
        args.api_key = sorted(config.keys())[0]
    with _app(args, config) as url:
        if args.rates is not None:
            return _bench_open_loop(args, url, config, models)
        return _bench_closed_loop(args, url, config, models[0])


def _bench_closed_loop(args: argparse.Namespace, url: str, config: Any, model: str) -> dict:
    task = args.task
    baseline_seconds = args.baseline_seconds or args.seconds / 3
    method = args.method or _model_method(url, args.api_key, model)

    def baselines() -> dict[Optional[str], dict[str, Any]]:
        """The public function's own batching, then a finished row's place refilled at once."""
        logger.info("bench serve: in-process %s rate at batch %d (%s), %.0f s", task, args.concurrency, method, baseline_seconds)
        if args.config is not None and args.method is None:  # the served checkpoint and decode config, at batch C
            stats = _stats(url, args.api_key, model)
            return {batching: _served_baseline(args, config, model, stats, baseline_seconds, args.concurrency, batching)
                    for batching in (None, "continuous")}
        return {batching: in_process_rate(task, method, args.concurrency, baseline_seconds, args.threads, batching=batching)
                for batching in (None, "continuous")}

    first = baselines()
    before = _stats(url, args.api_key, model)
    logger.info("bench serve: %d clients for %.0f s on %s", args.concurrency, args.seconds, url)
    load = asyncio.run(_load(url, args.api_key, task, model, method, args.concurrency, args.seconds))
    after = _stats(url, args.api_key, model)
    last = baselines()  # again after the load: this machine's speed drifts over minutes, the ratio takes both
    baseline, continuous = (_pooled(first[batching], last[batching]) for batching in (None, "continuous"))
    steps = after["decode_steps"] - before["decode_steps"]
    done = len(load["latencies"])
    rate = done / load["seconds"]
    result = {
        "task": task, "model": model, "method": method, "url": url, "concurrency": args.concurrency, "seconds": load["seconds"],
        "requests": done + len(load["errors"]), "succeeded": done, "errors": len(load["errors"]), "error_samples": load["errors"][:5],
        "requests_per_s": rate,
        "latency_p50_s": percentile(load["latencies"], 0.5), "latency_p99_s": percentile(load["latencies"], 0.99),
        "ttft_p50_s": percentile(load["ttfts"], 0.5), "ttft_p99_s": percentile(load["ttfts"], 0.99),
        "mean_batch_size": (after["rows_stepped"] - before["rows_stepped"]) / steps if steps else None,
        "tokens_per_forward": ((after["output_tokens"] - before["output_tokens"]) / max(1, after["target_forwards"] - before["target_forwards"])),
        "in_process": baseline,
        "serve_efficiency": rate / baseline["rows_per_s"] if baseline["rows_per_s"] else None,
        "in_process_continuous": continuous,
        "serve_efficiency_continuous": rate / continuous["rows_per_s"] if continuous["rows_per_s"] else None,
        "latency_mean_s": statistics.fmean(load["latencies"]) if load["latencies"] else None,
        **step_figures(before, after, steps, load["seconds"]),
    }
    _print(result)
    return result


def _pooled(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Two in-process timings of the same thing, before and after the load, as one (rows over seconds)."""
    rows, seconds = before["rows"] + after["rows"], before["seconds"] + after["seconds"]
    return {**before, "rows": rows, "seconds": seconds, "rows_per_s": rows / seconds,
            "rows_per_s_before": before["rows_per_s"], "rows_per_s_after": after["rows_per_s"]}


def _served_baseline(args: argparse.Namespace, config: Any, model: str, stats: dict, seconds: float,
                     batch: Optional[int] = None, batching: Optional[str] = None) -> dict[str, Any]:
    """The in-process rate of what the served ``model`` decodes with (its plan's method and shape, at
    ``batch`` or its plan's batch size; its checkpoint and dtype where ``config`` names them, else the
    reference model)."""
    import torch

    from raydec.config import DecodeConfig  # lazy: with the served model's config

    served = config.model(model) if config is not None else None
    plan = stats["plan"]
    decode = apply_shape(served.decode if served is not None else DecodeConfig(method=plan["method"]), plan)
    target = "reference"
    if served is not None:
        target = load_target(served.model, task=served.task, dtype=getattr(torch, served.dtype), vqgan_path=served.vqgan_path)
    batch = batch or plan["batch_size"]
    logger.info("bench serve: in-process rate of %s at batch %d (%s), %.0f s", model, batch, plan["label"], seconds)
    return {**in_process_rate(args.task, plan["method"], batch, seconds, args.threads, model=target, decode=decode, batching=batching),
            "batch": batch, "plan": plan["label"]}


def _bench_open_loop(args: argparse.Namespace, url: str, config: Any, models: list[str]) -> dict:
    """Every rate against every model, models interleaved rate by rate (their order rotated each rate),
    beside each model's in-process rate at its batch."""
    task = args.task
    prompts = _prompts(64)
    image_urls = [_png_url(image) for image in _images(16)] if task == "chat" else []
    baseline_seconds = args.baseline_seconds or args.seconds / 3
    in_process = {m: _served_baseline(args, config, m, _stats(url, args.api_key, m), baseline_seconds) for m in models}
    rows = []
    for index, rate in enumerate(args.rates):
        for model in models[index % len(models):] + models[:index % len(models)]:
            target = Target(url, args.api_key, task, model, args.method, prompts, image_urls, args.long_prompts, args.long_prompt_repeat)
            before = _stats(url, args.api_key, model)
            logger.info("bench serve: %s at %g requests/s (up to %d, %.0f s) on %s", model, rate, args.requests, args.seconds, url)
            load = asyncio.run(open_loop(target, rate, args.requests, args.seconds, f"{args.seed}/{rate}", args.drain_seconds))
            after = _stats(url, args.api_key, model)
            rows.append(summarise(target, rate, load, before, after, in_process[model]["rows_per_s"]))
    rows.sort(key=lambda r: (models.index(r["model"]), r["rate"]))
    result = {"mode": "open_loop", "task": task, "url": url, "models": models, "rates": args.rates, "requests": args.requests,
              "seconds": args.seconds, "drain_seconds": args.drain_seconds, "seed": args.seed, "method": args.method,
              "in_process": in_process, "rows": rows}
    print_rows(result)
    if args.plots:
        result["plot"] = str(plot(result, args.plots))
        print(f"wrote {result['plot']}")
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
            *([f"in process, batch {result['concurrency']}{label}", _fmt(timing["rows_per_s"]), "-", "-", "-", "-",
               str(result["concurrency"]), "0"]
              for label, timing in ((" (before / after the load: "
                                     f"{_fmt(result['in_process'].get('rows_per_s_before'))} / "
                                     f"{_fmt(result['in_process'].get('rows_per_s_after'))})", result["in_process"]),
                                    (", continuous batching", result["in_process_continuous"]))),
        ],
    )
    print(f"serve_efficiency = {_fmt(result['serve_efficiency'])} (app rate / in-process rate)   "
          f"against continuous batching = {_fmt(result['serve_efficiency_continuous'])}   "
          f"tokens per forward = {_fmt(result['tokens_per_forward'], '.2f')}")
    print(f"engine: in steps {_fmt(result.get('engine_busy'), '.0%')} of the wall time, CPU {_fmt(result.get('engine_cpu'), '.0%')}; "
          f"replica process CPU {_fmt(result.get('replica_cpu'), '.0%')}; a decoding row's step p50 / p99 "
          f"{_fmt(result.get('row_step_p50_s'), '.4f')} / {_fmt(result.get('row_step_p99_s'), '.4f')} s")


def add_serve_parser(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="load on the Serve app (C clients, or Poisson arrivals at --rates) vs the "
                                                 "in-process rate at the same batch")
    parser.add_argument("--task", choices=["images", "chat"], default="images", help="which route to load")
    parser.add_argument("--concurrency", type=positive_int, default=8,
                        help="closed loop: clients at once (and the in-process batch size); the reference app's batch size")
    parser.add_argument("--seconds", type=positive_float, default=60.0,
                        help="how long the load runs (open loop: per rate and model, no request sent after it)")
    parser.add_argument("--rates", type=positive_float_list, default=None,
                        help="open loop: comma-separated request rates per second, Poisson arrivals (default: the closed loop)")
    parser.add_argument("--requests", type=positive_int, default=64, help="open loop: at most this many requests per rate and model")
    parser.add_argument("--seed", type=int, default=0, help="open loop: seed of the arrival times (the same schedule for every model)")
    parser.add_argument("--drain-seconds", type=positive_float, default=120.0,
                        help="open loop: how long requests in flight at the end are awaited (then counted as errors)")
    parser.add_argument("--long-prompts", type=share_arg, default=0.0,
                        help="open loop: the share of requests (0-1) whose text is --long-prompt-repeat times the usual one "
                             "(long prompts joining under load; the rows' step p50 / p99 show what they cost the rows decoding)")
    parser.add_argument("--long-prompt-repeat", type=positive_int, default=40,
                        help="open loop: how many times a long prompt repeats the usual text (chat: 40 gives about 3x the "
                             "reference VLM's prompt tokens, its image's included)")
    parser.add_argument("--method", default=None, help="decoding method per request (default: the model's)")
    parser.add_argument("--url", default=None, help="a running app's base URL (default: start one on 127.0.0.1)")
    parser.add_argument("--config", default=None,
                        help="a ServeConfig YAML (as raydec serve --config) the bench starts instead of the reference app")
    parser.add_argument("--models", "--model", dest="models", default=None,
                        help="served model names, comma-separated (open loop: each in turn at every rate; default: the "
                             "task's reference model, or the task's models in --config)")
    parser.add_argument("--api-key", default=None, help="the app's key, if it needs one (default: the first of --config's)")
    parser.add_argument("--port", type=positive_int, default=None,
                        help=f"port of the app this bench starts (default: {REFERENCE_PORT}, or --config's)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads, in-process and in the reference replicas")
    parser.add_argument("--baseline-seconds", type=positive_float, default=None, help="in-process timing (default: S / 3)")
    parser.add_argument("--plots", type=folder_path_arg, default=None, help="open loop: write the latency-against-rate plot here")
    parser.add_argument("--json", type=json_path_arg, default=None, help="write results here")
    parser.set_defaults(bench=bench_serve)
