"""`raydec bench step`: what one decode step costs outside the target forward, at real sizes.

    raydec bench step                          # the full grid below
    raydec bench step --vocab 16384 --batch 1,16 --window 64 --methods sjd_pac

A random Janus (2 layers, 64 wide) with a 16,384- or 32,768-code book (Janus-Pro's and a
larger one), CFG on, runs sjd / sjd_ac / sjd_pac at each batch and window; a random EAGLE draft model
over a random Llama with a 32,000-token vocabulary runs the draft-tree path. For each shape:

    syncs_per_step       tensor values read back to Python (item, tolist, cpu, numpy, bool, int,
                         float, index of a tensor): on a GPU each is a device-to-host sync
    host_bytes_per_step  bytes those read-backs carry
    ops_per_step         tensor operators launched outside the target forward (torch.profiler,
                         top-level aten ops): on a GPU, kernel launches
    host_ms_per_step     wall milliseconds of the step minus its target forward (CPU: the host
                         work itself; this machine's timings say little about a GPU's). With
                         --device cuda the forward is timed to its kernels' end, so this is the
                         step's own work on host and device together
    cache_bytes_per_step bytes the target's KV cache writes or copies per step (new slots, growth,
                         compaction, rows leaving): flat in the context when it is written in place
    forward_ms_per_step  wall milliseconds of the step's target forward
    compile_s            seconds the shape's captured graphs took to compile, on their first calls
                         (``--compile on``; 0 when eager, or when an earlier shape of the run
                         compiled the same variants: on a CPU the batch is a dynamic size)

``--coupling rejection,gumbel`` puts a shape's step under both couplings side by side: the
difference is what gumbel's per-position noise and match test cost. ``--context N,...`` gives every row about N cached tokens before the measured steps (a long
prompt), ``--cache-layout slots,concat`` compares the cache written in place with Hugging Face's
concatenation.

What carries over to a GPU is the structure: read-backs and operator counts that do not grow
with the batch or the window. Table on stdout, JSON (``--json``) with one object per shape
under ``"runs"``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from raydec.bench.common import (
    json_path_arg, non_negative_int, non_negative_int_list, positive_int, positive_int_list, print_table, resolve_device,
)
from raydec.config import DecodeConfig, DraftTreeConfig, JacobiDraftConfig, SamplingConfig
from raydec.models.base import synchronize
from raydec.models.image_gen import ImagePrompt
from raydec.models.registry import load_t2i_target
from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample, vocabulary
from raydec.speculative.engine import Engine
from raydec.speculative.proposers.draft_tree import DraftTreeProposer
from raydec.speculative.proposers.factory import make_proposer
from raydec.speculative.requests import COUPLINGS, RowRequest

logger = logging.getLogger(__name__)

READ_BACKS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
JACOBI = ("sjd", "sjd_ac", "sjd_pac")
FORWARD_SCOPE = "raydec::target_forward"


class ReadBacks:
    """Counts of tensor -> Python conversions (and their bytes) while ``counting()`` is active."""

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0

    @contextlib.contextmanager
    def counting(self) -> Iterator["ReadBacks"]:
        originals = {name: getattr(torch.Tensor, name) for name in READ_BACKS}

        def counted(name: str):
            original = originals[name]

            def wrapper(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                self.count += 1
                self.bytes += tensor.numel() * tensor.element_size()
                return original(tensor, *args, **kwargs)

            return wrapper

        try:
            for name in READ_BACKS:
                setattr(torch.Tensor, name, counted(name))
            yield self
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)


class TimedTarget:
    """A target whose forwards are timed and marked for the profiler; everything else passes through."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self.forward_seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        device = self._target.device
        synchronize(device)  # on a GPU: the forward's time is its kernels', not its launches'
        start = time.perf_counter()
        with torch.profiler.record_function(FORWARD_SCOPE):
            out = self._target.forward(*args, **kwargs)
        synchronize(device)
        self.forward_seconds += time.perf_counter() - start
        return out


#: operators that launch no kernel: views, shape and allocation bookkeeping
NO_KERNEL = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze",
    "aten::expand", "aten::as_strided", "aten::alias", "aten::t", "aten::transpose", "aten::permute", "aten::unflatten",
    "aten::flatten", "aten::detach", "aten::detach_", "aten::lift_fresh", "aten::empty", "aten::empty_strided", "aten::result_type",
    "aten::unbind", "aten::split", "aten::chunk", "aten::narrow", "aten::view_as", "aten::expand_as", "aten::resolve_conj",
    "aten::resolve_neg", "aten::_reshape_alias", "aten::numpy_T", "aten::is_nonzero",
})
#: operators that launch a kernel only when they copy (then they call one of ``COPIES``)
COPY_IF_NEEDED = frozenset({"aten::to", "aten::contiguous", "aten::type_as", "aten::reshape"})
COPIES = frozenset({"aten::_to_copy", "aten::clone", "aten::copy_", "aten::_reshape_copy"})
COMPILED_REGION = "Torch-Compiled Region"


def _inside(event: Any, prefix: str) -> bool:
    """Whether an enclosing profiler scope's name starts with ``prefix``."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(prefix):
            return True
        parent = parent.cpu_parent
    return False


def _outside_forward(event: Any) -> bool:
    return not _inside(event, FORWARD_SCOPE)


def top_level_ops(events: Any) -> int:
    """aten operators called from Python (not from inside another operator), outside forwards."""
    count = 0
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        if parent is not None and parent.name.startswith("aten::"):
            continue
        count += _outside_forward(event)
    return count


def launches(events: Any) -> int:
    """Kernel or graph launches outside the target forward: each captured region once (one graph
    launch when recorded as a CUDA graph), and every eager top-level operator outside them that
    launches a kernel (not a view or an allocation)."""
    count = 0
    for event in events:
        if event.name.startswith(COMPILED_REGION):
            count += _outside_forward(event) and not _inside(event, COMPILED_REGION)
            continue
        if not event.name.startswith("aten::") or event.name in NO_KERNEL:
            continue
        if event.name in COPY_IF_NEEDED and not any(child.name in COPIES for child in event.cpu_children):
            continue  # no copy: nothing launched
        parent = event.cpu_parent
        if parent is not None and parent.name.startswith("aten::"):
            continue  # inside another operator
        count += _outside_forward(event) and not _inside(event, COMPILED_REGION)
    return count


def measure_session(session: Any, timed: TimedTarget, steps: int, warmup: int) -> dict:
    """Run ``warmup`` decode steps, then ``steps`` measured ones (read-backs, ops, host ms, cache
    bytes)."""
    while session.busy and not session.active:
        session.step()  # admission
    decoded = 0
    while session.busy and decoded < warmup:
        before = session.steps
        session.step()
        decoded += session.steps - before
    host_ms, forward_ms, read_backs, ops, launched = [], [], ReadBacks(), [], []
    cached_tokens = max(session.cache.lengths, default=0)
    copied_before = session.cache.copied_bytes()

    @contextlib.contextmanager
    def timed_step() -> Iterator[None]:  # host time and read-backs: a step without the profiler
        forward_before = timed.forward_seconds
        start = time.perf_counter()
        with read_backs.counting():
            yield
        synchronize(timed.device)
        forward_ms.append(1e3 * (timed.forward_seconds - forward_before))
        host_ms.append(1e3 * (time.perf_counter() - start) - forward_ms[-1])

    @contextlib.contextmanager
    def profiled_step() -> Iterator[None]:  # operators: the next step under the profiler
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            yield
        events = profile.events()
        ops.append(top_level_ops(events))
        launched.append(launches(events))

    for _ in range(steps):
        if not session.active:
            break
        session.step(decode_scope=timed_step)
        if not session.active:
            break
        session.step(decode_scope=profiled_step)
    done = max(1, len(host_ms))
    stepped = max(1, len(host_ms) + len(ops))  # the cache copies in profiled steps too
    return {
        "steps_measured": len(host_ms),
        "cached_tokens": cached_tokens,
        "cache_bytes_per_step": (session.cache.copied_bytes() - copied_before) / stepped,
        "forward_ms_per_step": statistics.median(forward_ms) if forward_ms else 0.0,
        "syncs_per_step": read_backs.count / done,
        "host_bytes_per_step": read_backs.bytes / done,
        "ops_per_step": statistics.median(ops) if ops else 0,
        "launches_per_step": statistics.median(launched) if launched else 0,
        "host_ms_per_step": statistics.median(host_ms) if host_ms else 0.0,
    }


def build_janus(folder: Path, codebook: int, max_positions: int = 1024) -> Path:
    """A random Janus with a ``codebook``-code VQ book (2 layers, 64 wide), saved by path."""
    from raydec.reference.janus import model as jt  # lazy: keeps raydec bench --help light

    tokenizer = jt.build_tokenizer(vocabulary())
    arch = jt.T2IArchitecture(
        vq_base_channels=32, vq_channel_multiplier=(1, 1, 1), vq_num_res_blocks=1, vq_latent_channels=32,
        vq_embed_dim=8, vq_num_embeddings=codebook, lm_hidden_size=64, lm_num_layers=2, lm_num_heads=2,
        lm_intermediate_size=128, lm_max_positions=max_positions, vision_hidden_size=32,
    )
    model = jt.build_model(jt.build_config(tokenizer, arch), 0).eval()
    model.generation_config = jt.build_generation_config(tokenizer, guidance_scale=2.0)
    with torch.no_grad():
        model.save_pretrained(folder)
    jt.build_processor(tokenizer).save_pretrained(folder)
    return folder


def long_prompt(target: Any, text: str, tokens: int) -> str:
    """``text`` repeated until the target's prompt ids number at least ``tokens`` (``text`` when 0)."""
    if not tokens:
        return text
    once, twice = target.prompt_ids(text).numel(), target.prompt_ids(text + " " + text).numel()
    copies = 1 + max(0, -(-(tokens - once) // max(1, twice - once)))  # each copy adds twice - once ids
    grown = " ".join([text] * copies)
    while target.prompt_ids(grown).numel() < tokens:  # a template's ids may not add up exactly
        grown += " " + text
    return grown


def jacobi_runs(
    codebook: int, methods: list[str], batches: list[int], windows: list[int], steps: int, device: str = "cpu",
    contexts: list[int] = (0,), layouts: list[str] = ("slots",), compiles: list[str] = ("off",), couplings: list[str] = ("rejection",),
) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        target = load_t2i_target(build_janus(Path(tmp) / "janus", codebook, 2048 + max(contexts)), dtype=torch.float32)
    target.model.to(device)
    timed = TimedTarget(target)
    samples = [make_sample(HELD_OUT_SEED_START + i).prompt for i in range(max(batches))]
    runs = []
    for context in contexts:
        prompts = [long_prompt(target, text, context) for text in samples]
        for method, window, layout, compile, coupling in itertools.product(methods, windows, layouts, compiles, couplings):
            branching, depth = (3, 1) if method == "sjd_pac" else (1, 0)
            jacobi = JacobiDraftConfig(window=window, branching=branching, tree_depth=depth, init="left")
            config = DecodeConfig(method=method, max_new_tokens=target.num_image_tokens, sampling=target.default_sampling(), jacobi=jacobi)
            for batch in batches:
                engine = Engine(timed, make_proposer(config, target), config.sampling, config.max_new_tokens, constraint=target.vocab_constraint(),
                                eos_token_ids=target.eos_token_ids, cache_layout=layout, compile=compile, coupling=coupling)
                session = engine.session(batch_size=batch)
                for i in range(batch):
                    session.submit(RowRequest(ImagePrompt(prompts[i], None), seed=i))
                measured = measure_session(session, timed, steps, warmup=1)
                runs.append({"method": method, "batch": batch, "window": window, "vocab": codebook, "cfg": True, "context": context,
                             "cache_layout": layout, "compile": compile, "coupling": coupling, **measured, "compile_s": compile_seconds(engine)})
                logger.info("bench step: %s", runs[-1])
    return runs


#: the draft-tree path's target (``--tree-target``): its language model's shape, random weights
TREE_TARGETS = {
    # a random Llama, 2 layers, 64 wide, two query heads per KV head (float32)
    "tiny": dict(family="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    # Qwen2.5-VL-7B's language model (a Qwen2: 28 layers, 3,584 wide, 28 query heads over 4 KV heads,
    # 152,064 tokens) with a ViSpec draft model at its width, in bf16: the shape ViSpec decodes on a GPU
    "qwen2.5-vl-7b": dict(family="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                          num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, rope_theta=1e6, rms_norm_eps=1e-6),
    # the same classes and head grouping (7 query heads per KV head), small enough for a CPU dry run
    "qwen2.5-vl-small": dict(family="qwen2", hidden_size=112, intermediate_size=224, num_hidden_layers=2,
                             num_attention_heads=7, num_key_value_heads=1, rope_theta=1e6, rms_norm_eps=1e-6),
}


def tree_target(name: str, vocab: int, max_positions: int, device: str) -> tuple[Any, Any]:
    """A random target of ``TREE_TARGETS[name]`` and a ViSpec draft model at its width (the Qwen shapes;
    the tiny Llama gets a text-only EAGLE draft model), built on ``device`` in the shape's dtype."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from raydec.models.causal_lm import CausalLMTarget  # lazy: keeps raydec bench --help light
    from raydec.models.vispec_draft import DraftConfig, VispecDraft  # lazy: keeps raydec bench --help light

    shape = dict(TREE_TARGETS[name])
    family = shape.pop("family")
    shape.setdefault("vocab_size", vocab)
    dtype = torch.float32 if family == "llama" else torch.bfloat16
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if family == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(max_position_embeddings=max_positions, tie_word_embeddings=False, **shape)
    torch.manual_seed(0)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # built where it runs, in its dtype: no host copy of a 7B model
            target = CausalLMTarget(model_class(config))
            draft_model = VispecDraft(DraftConfig.for_target(config, vision=family != "llama", num_q=1))
    finally:
        torch.set_default_dtype(default_dtype)
    draft_model.attach_target(target.model.get_input_embeddings(), target.model.get_output_embeddings())
    return target, draft_model.to(device, dtype).eval().prepare_inference()


def draft_tree_runs(
    vocab: int, batches: list[int], windows: list[int], steps: int, device: str = "cpu",
    contexts: list[int] = (0,), layouts: list[str] = ("slots",), compiles: list[str] = ("off",), target_name: str = "tiny",
    couplings: list[str] = ("rejection",),
) -> list[dict]:
    """A random EAGLE / ViSpec draft model (the draft-tree path) over a random target (``TREE_TARGETS``)."""
    target, draft_model = tree_target(target_name, vocab, 2048 + max(contexts), device)
    timed = TimedTarget(target)
    runs = []
    for context, window, layout, compile, coupling in itertools.product(contexts, windows, layouts, compiles, couplings):
        depth, top_k = (4, 3) if window <= 16 else (6, 4)
        tree = DraftTreeConfig(depth=depth, top_k=top_k, total_tokens=min(window, top_k + (depth - 1) * top_k * top_k))
        decode = DecodeConfig(method="eagle", max_new_tokens=256, sampling=SamplingConfig(temperature=1.0), draft_tree=tree)
        for batch in batches:
            engine = Engine(timed, DraftTreeProposer(draft_model, tree), decode.sampling, decode.max_new_tokens, cache_layout=layout, compile=compile,
                            coupling=coupling)
            session = engine.session(batch_size=batch)
            for i in range(batch):
                prompt = [1 + i % 7, 2, 3 + i % 5]
                session.submit(RowRequest((prompt * (context // 3 + 1))[: max(context, 3)], seed=i))
            measured = measure_session(session, timed, steps, warmup=1)
            runs.append({"method": "eagle", "batch": batch, "window": tree.total_tokens, "vocab": target.vocab_size, "cfg": False,
                         "context": context, "cache_layout": layout, "compile": compile, "coupling": coupling, "target": target_name, **measured,
                         "compile_s": compile_seconds(engine), "step_over_forward": _step_over_forward(measured)})
            logger.info("bench step: %s", runs[-1])
    return runs


def compile_seconds(engine: Any) -> float:
    """Seconds this configuration's first calls spent compiling its captured graphs (tracing,
    compiling, one run each): 0 when eager, or when the process had compiled its variants already."""
    return sum(graph.compile_seconds for graph in engine.step_graphs())


def _step_over_forward(measured: dict) -> float | None:
    """A whole step (its target forward and the rest) in target-forward times."""
    forward = measured["forward_ms_per_step"]
    return (forward + measured["host_ms_per_step"]) / forward if forward else None


def _choices(what: str, known: tuple[str, ...]) -> Callable[[str], list[str]]:
    """An argparse type: a non-empty comma-separated list of ``known`` values."""
    def parse(text: str) -> list[str]:
        values = [m.strip() for m in text.split(",") if m.strip()]
        if not values or any(m not in known for m in values):
            raise argparse.ArgumentTypeError(f"{what}: {text!r}; choose from {', '.join(known)} (comma-separated)")
        return values
    return parse


def _methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in JACOBI + ("eagle",)]
    if unknown or not methods:
        raise argparse.ArgumentTypeError(f"unknown method(s) {unknown or text!r}; choose from {', '.join(JACOBI + ('eagle',))}")
    return methods


def bench_step(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    runs: list[dict] = []
    jacobi = [m for m in args.methods if m in JACOBI]
    for codebook in args.vocab if jacobi else []:
        runs += jacobi_runs(codebook, jacobi, args.batch, args.window, args.steps, device, args.context, args.cache_layout, args.compile,
                            args.coupling)
    if "eagle" in args.methods:
        runs += draft_tree_runs(args.draft_vocab, args.batch, args.window, args.steps, device, args.context, args.cache_layout, args.compile,
                                args.tree_target, args.coupling)
    rows = [[r["method"], r["vocab"], r["batch"], r["window"], r["cached_tokens"], r["cache_layout"], r["compile"], r["coupling"],
             f"{r['syncs_per_step']:.1f}", f"{r['host_bytes_per_step']:.0f}", f"{r['ops_per_step']:.0f}", f"{r['launches_per_step']:.0f}",
             f"{r['host_ms_per_step']:.2f}",
             f"{r['cache_bytes_per_step'] / 1e3:.1f}", f"{r['forward_ms_per_step']:.2f}", f"{r['compile_s']:.1f}"] for r in runs]
    print_table(f"raydec bench step: per decode step outside the target forward ({torch.get_num_threads()} thread(s), "
                f"{device})",
                ["method", "vocab", "batch", "window", "cached", "cache", "compile", "coupling", "syncs", "bytes to host", "ops", "launches", "host ms",
                 "cache KB", "forward ms", "compile s"], rows)
    return {"bench": "step", "device": device, "threads": torch.get_num_threads(), "runs": runs}


def add_step_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("step", help="per decode step outside the forward: syncs, bytes to host, ops, host ms",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", type=_methods, default=list(JACOBI) + ["eagle"], help="sjd, sjd_ac, sjd_pac, eagle (comma-separated)")
    parser.add_argument("--vocab", type=positive_int_list, default=[16384, 32768], help="Janus codebook sizes (comma-separated)")
    parser.add_argument("--draft-vocab", type=positive_int, default=32000, help="vocabulary of the draft-tree path's tiny target")
    parser.add_argument("--tree-target", choices=list(TREE_TARGETS), default="tiny",
                        help="the draft-tree path's random target: tiny (a 2-layer Llama, float32), qwen2.5-vl-7b (Qwen2.5-VL-7B's "
                             "language model and a ViSpec draft at its width, bf16, for a GPU), qwen2.5-vl-small (its classes, small)")
    parser.add_argument("--batch", type=positive_int_list, default=[1, 8, 16], help="batch sizes (comma-separated)")
    parser.add_argument("--window", type=positive_int_list, default=[16, 64, 96], help="draft windows / tree sizes (comma-separated)")
    parser.add_argument("--context", type=non_negative_int_list, default=[0],
                        help="about this many cached tokens per row before the measured steps (a long prompt; comma-separated)")
    parser.add_argument("--cache-layout", type=_choices("cache layouts", ("slots", "concat")), default=["slots"],
                        help="slots (written in place), concat (comma-separated)")
    parser.add_argument("--coupling", type=_choices("coupling", COUPLINGS), default=["rejection"],
                        help="rejection, gumbel (comma-separated): gumbel's noise and match test cost per step, side by side")
    parser.add_argument("--compile", type=_choices("compile", ("on", "off", "auto")), default=["off"],
                        help="on (the step's tensor work captured per batch bucket), off, auto (comma-separated)")
    parser.add_argument("--steps", type=positive_int, default=3, help="timed decode steps per shape (each followed by a profiled one)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (cuda when torch sees a GPU)")
    parser.add_argument("--threads", type=non_negative_int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--json", type=json_path_arg, default=None, help="write results here")
    parser.set_defaults(bench=bench_step)
