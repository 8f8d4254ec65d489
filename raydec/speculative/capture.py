"""Captured step work: a decode step's pure tensor functions compiled at fixed shapes.

Outside the target forward, a step is a few hundred small operators (propose, process, verify,
carry drafts over). On a GPU each is a kernel launch of about 12 microseconds, so a step is
launch-bound; captured, each function below is one graph launch. A ``StepGraph`` wraps one
such function:

    graph = StepGraph(fn, "verify", enabled=True, device=device)
    outputs = graph(rows, (batch tensors...), (shared tensors...), **static)

- batch tensors lead with the rows ([B, ...]); they run padded (by repeating the last row): on
  CUDA to the batch's bucket (``batch_bucket``: 2, 4, 8, 16, 32, 64, ... rows; a single row runs
  as two), elsewhere a single row to two. Every output is cut back to B rows. A padded row is a
  copy of a real one and rows never mix (every function here works row by row), so a row's output
  does not depend on its padding;
- shared tensors (layouts, a vocabulary mask) go in as they are;
- static arguments (ints, flags, configs) are constants of the captured graph.

The rows (and the ``lengths`` a caller names, such as a cache buffer's capacity) are a dynamic
size: each function is compiled once per *variant*, the rest of its call (its tensors' other sizes
and dtypes, its shared tensors, its statics), whatever its batch. A size of one would be
specialised, which is why a single row runs padded to two. Each variant is compiled from a copy of
``fn`` with a code object of its own (:func:`_own_code`): dynamo keeps compiled code, and counts it
against its recompile limit (8), per code object, and one code object shared by the variants a
process meets (a tuner's candidates, a few draft shapes, two vocabularies) would hit the limit and,
under ``fullgraph``, raise out of a decode. A variant's copy compiles once and meets its guards on
every later call. The variants live in one table for the process (:data:`VARIANTS`), shared by
every ``StepGraph`` of the function, so a new session over a shape the process has met compiles
nothing.

On CUDA a variant runs in "reduce-overhead" mode, which records a CUDA graph per bucket it meets
(recording replays the compiled kernels once; it does not compile again); outputs of a CUDA graph
live in memory its next replay writes over, so they are cloned before they leave. Elsewhere (a CPU)
there is nothing to replay: the variant runs unpadded past one row, so a batch that drains row by
row compiles no more.

Bounded on purpose: a function compiles at most ``MAX_VARIANTS`` variants in a process, and a
variant whose compile fails (one of dynamo's limits, an operator it cannot trace) runs the eager
function from then on. Either logs one WARNING; neither raises out of a decode, and the eager
function computes the same tokens.
Disabled, the function runs eagerly with no padding.

``compile: auto | on | off`` (``DecodeConfig.compile``) decides: ``resolve_compile``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import types
from typing import Any, Callable, Literal

import torch

logger = logging.getLogger(__name__)

CompileMode = Literal["auto", "on", "off"]

#: variants one function compiles at most in a process; past it a new variant runs eagerly
MAX_VARIANTS = 256

#: batch sizes a captured function is compiled for; a batch runs padded to the first that holds it
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def batch_bucket(rows: int) -> int:
    """The bucket a batch of ``rows`` runs at: the smallest of ``BATCH_BUCKETS`` that holds it,
    beyond the largest a multiple of it."""
    if rows < 1:
        raise ValueError(f"a batch has at least one row, got {rows}")
    for bucket in BATCH_BUCKETS:
        if rows <= bucket:
            return bucket
    largest = BATCH_BUCKETS[-1]
    return -(-rows // largest) * largest


def resolve_compile(mode: CompileMode, device: torch.device | str) -> bool:
    """Whether a session on ``device`` captures its step: ``on`` / ``off`` as said; ``auto``: on
    for CUDA, off elsewhere. On a CPU there are no launches to save: a captured Jacobi step
    measured about as fast as an eager one, a draft-tree step faster, and each graph first
    compiles for tens of seconds (docs/engine.md, "Captured steps")."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"compile: {mode!r}; choose auto, on or off")
    if mode == "auto":
        return torch.device(device).type == "cuda"
    return mode == "on"


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` ([B, ...]) with its last row repeated up to ``rows`` rows."""
    missing = rows - tensor.shape[0]
    if missing <= 0:
        return tensor
    return torch.cat([tensor, tensor[-1:].expand(missing, *tensor.shape[1:])])


@dataclasses.dataclass
class Variant:
    """One compiled form of a captured function: ``compiled`` None once it runs eagerly."""

    name: str
    compiled: Callable[..., tuple[torch.Tensor, ...]] | None
    compile_seconds: float = 0.0  # wall seconds of its first call (tracing and compiling, then one run)
    calls: int = 0


#: (the function's code, its owner's type, the variant's key) -> its variant, for the whole process
VARIANTS: dict[tuple, Variant] = {}
_LOCK = threading.Lock()
_BUDGET_WARNED: set = set()


def _own_code(fn: Callable) -> Callable:
    """A copy of the plain function ``fn`` with a code object of its own (dynamo's cache and
    recompile limit belong to a code object)."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    return copy


def static_key(value: Any) -> Any:
    """A hashable stand-in for a call's argument, equal for arguments a compiled variant treats
    alike: a tensor by its dtype, shape and device; a config by its values; a function itself."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.device)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(static_key(item) for item in value))
    if isinstance(value, types.MethodType):  # by its owner's identity: the table keeps no model alive
        return ("method", value.__func__, type(value.__self__), id(value.__self__))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value), tuple(static_key(getattr(value, field.name)) for field in dataclasses.fields(value)))
    if hasattr(type(value), "model_fields") and hasattr(value, "__dict__"):  # a pydantic config: its values
        return (type(value), tuple((name, static_key(item)) for name, item in value.__dict__.items()))
    try:
        hash(value)
    except TypeError:
        return (type(value), id(value))
    return value


def captured_variants() -> list[Variant]:
    """Every variant compiled in this process so far (the eager ones included)."""
    with _LOCK:
        return list(VARIANTS.values())


class StepGraph:
    """One pure tensor function of a step, captured (see module docstring).

    fn: a function, or a method of its owner (the owner is passed to the compiled copy as its first
    argument, so one variant serves every owner of that type and shape)."""

    def __init__(
        self, fn: Callable[..., tuple[torch.Tensor, ...]], name: str, enabled: bool, device: torch.device | str,
        lengths: tuple[tuple[int, int], ...] = (), key: tuple = (),
    ) -> None:
        """lengths: (batch tensor, dim) pairs of sizes that vary between calls besides the rows
        (a buffer's capacity): dynamic sizes of a variant too. key: the owner's
        facts its method reads as constants (a variant, a tree's depth), so owners that differ in
        them compile variants of their own."""
        self.fn = fn
        self.key = key
        self.lengths = lengths
        self.name = name
        self.enabled = enabled
        self.device = torch.device(device)
        self.graph_mode = self.device.type == "cuda"  # CUDA graphs recorded per bucket; elsewhere no padding past two rows
        self._owner = getattr(fn, "__self__", None)
        self._function = getattr(fn, "__func__", fn)
        self.calls = 0  # captured calls (one graph launch each when recorded as a CUDA graph)
        self.eager_calls = 0  # calls of an enabled graph that ran eagerly (a variant over budget or whose compile failed)
        self.compile_seconds = 0.0  # first calls of the variants this graph compiled

    def _variant_key(self, batch: tuple[torch.Tensor, ...], shared: tuple[Any, ...], static: dict[str, Any]) -> tuple:
        """What tells this call's variant apart: the batch tensors' sizes but the dynamic ones (the
        rows, ``lengths``), their dtypes and devices, the shared tensors, the statics."""
        dynamic = set(self.lengths)
        shapes = tuple((tensor.dtype, tensor.device, tuple(None if dim == 0 or (index, dim) in dynamic else size
                                                             for dim, size in enumerate(tensor.shape)))
                       for index, tensor in enumerate(batch))
        statics = tuple((name, static_key(value)) for name, value in sorted(static.items()))
        return (self._function.__code__, type(self._owner), self.key, shapes, static_key(shared), statics)

    def _variant(self, key: tuple) -> Variant:
        with _LOCK:
            variant = VARIANTS.get(key)
            if variant is not None:
                return variant
            compiled_so_far = sum(1 for other in VARIANTS if other[0] is key[0])
            if compiled_so_far >= MAX_VARIANTS:
                if key[0] not in _BUDGET_WARNED:
                    _BUDGET_WARNED.add(key[0])
                    logger.warning("captured step %s: %d variants compiled in this process (MAX_VARIANTS); "
                                   "new shapes of it run eagerly", self.name, compiled_so_far)
                return Variant(self.name, None)  # not kept: the table stays bounded
            copy = _own_code(self._function)
            mode = "reduce-overhead" if self.graph_mode else None
            compiled = torch.compile(copy, fullgraph=True, mode=mode)
            variant = VARIANTS[key] = Variant(self.name, compiled)
            return variant

    def __call__(self, rows: int, batch: tuple[torch.Tensor, ...], shared: tuple[Any, ...] = (), **static: Any) -> tuple[torch.Tensor, ...]:
        """``fn(*batch, *shared, **static)``; batch tensors [rows, ...] -> outputs [rows, ...]."""
        if not self.enabled:
            return self.fn(*batch, *shared, **static)
        padded = tuple(pad_rows(t, max(2, batch_bucket(rows)) if self.graph_mode else 2) for t in batch)
        for tensor in padded:  # a dynamic size of every variant (see module docstring)
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
        for index, dim in self.lengths:
            torch._dynamo.maybe_mark_dynamic(padded[index], dim)
        variant = self._variant(self._variant_key(padded, shared, static))
        if variant.compiled is None:
            self.eager_calls += 1
            return self.fn(*batch, *shared, **static)
        owner = () if self._owner is None else (self._owner,)
        first = variant.calls == 0
        started = time.perf_counter()
        try:
            if self.graph_mode:
                torch.compiler.cudagraph_mark_step_begin()
            outputs = variant.compiled(*owner, *padded, *shared, **static)
        except Exception as exc:  # a compile that failed: this variant runs eagerly from now on
            variant.compiled = None
            logger.warning("captured step %s: a variant failed to compile (%s: %s); it runs eagerly", self.name,
                           type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            self.eager_calls += 1
            return self.fn(*batch, *shared, **static)
        variant.calls += 1
        self.calls += 1
        if first:
            variant.compile_seconds = time.perf_counter() - started
            self.compile_seconds += variant.compile_seconds
        if self.graph_mode:
            return tuple(out[:rows].clone() for out in outputs)
        return outputs if rows > 1 else tuple(out[:rows] for out in outputs)
