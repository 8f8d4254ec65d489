"""Typed configuration shared by the engine, the public API, jobs and the CLI.

Every user-facing knob is a pydantic field with a default, a range and a one-line
description. Unknown keys are errors (``extra="forbid"``), so a typo in a YAML file fails
loudly instead of being silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from raydec.validation import StrictModel


DType = Literal["float32", "float64", "bfloat16", "float16"]
"""Model weight / compute dtypes a job or a served model may ask for."""

def batch_size_type(maximum: int) -> Any:
    """A worker's batch size: rows decoded together (1 to ``maximum``), or "auto" (the most that fit
    the worker's memory); a field of this type checks its values with :func:`check_batch_size`."""
    return Annotated[int, Field(ge=1, le=maximum)] | Literal["auto"]

MODEL_NAME_DESCRIPTION = ("'reference', a local folder saved with save_pretrained, a Hugging Face hub id (org/name, "
                          "org/name@revision) or s3://bucket/prefix; a remote model is fetched once per node, where it runs.")

MEMORY_FRACTION_FIELD: Any = Field(
    0.9, gt=0.0, le=1.0,
    description="batch_size 'auto': the share of the worker's memory (a GPU's, or the host's available memory on a CPU) "
    "the weights and the batch's KV cache may take; the rest is left for a forward's activations.",
)


def check_batch_size(value: Any, maximum: int) -> Any:
    """A ``batch_size`` field's value: an integer in [1, maximum] or "auto" (a ValueError naming both otherwise)."""
    if value == "auto" and isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= maximum:
        return value
    raise ValueError(f"expected an integer from 1 to {maximum} or 'auto' (the most rows that fit max_memory_fraction of "
                     f"the worker's memory)")


class SamplingConfig(StrictModel):
    """How target logits become the distribution plain AR sampling draws from.

    Order (as in Hugging Face): CFG mix -> repetition penalty -> vocabulary constraints ->
    temperature -> top-k -> top-p.
    """

    temperature: float = Field(1.0, ge=0.0, le=10.0, description="Softmax temperature; 0 means greedy (argmax).")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 disables.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1.0 disables.")
    cfg_scale: float = Field(
        1.0, ge=0.0, le=100.0, description="Classifier-free guidance scale s in u + s*(c - u); 1.0 disables CFG."
    )
    cfg_space: Literal["logits", "logprobs"] = Field(
        "logits", description="Space in which the CFG mix is taken (raw logits or log-softmax)."
    )
    repetition_penalty: float = Field(
        1.0, gt=0.0, le=100.0, description="Hugging Face's repetition penalty: the logit s of a token already in the "
        "context (prompt or generated) becomes s / penalty if s > 0, else s * penalty; 1.0 disables.",
    )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_cfg(self) -> bool:
        return self.cfg_scale != 1.0


def full_tree_nodes(branching: int, depth: int) -> int:
    """Draft nodes of a full ``branching``-ary tree of ``depth`` levels (root excluded)."""
    return sum(branching**level for level in range(1, depth + 1))


class JacobiDraftConfig(StrictModel):
    """The Jacobi draft (sjd, sjd_ac, sjd_pac): window, SJD-PAC tree and fresh-draft prior of each step."""

    window: int = Field(16, ge=1, le=1024, description="Total draft nodes per step, root excluded (SJD's L-1).")
    branching: int = Field(1, ge=1, le=64, description="Candidates per tree level (K); 1 means a single chain.")
    tree_depth: int = Field(0, ge=0, le=64, description="Levels of the branching part of the tree (D-1); 0 = chain only.")
    init: Literal["uniform", "left", "above"] = Field(
        "uniform", description="Fresh Jacobi drafts: uniform over allowed ids, or copy the token to the left / above."
    )

    @model_validator(mode="after")
    def _tree_fits_window(self) -> "JacobiDraftConfig":
        tree_nodes = full_tree_nodes(self.branching, self.tree_depth)
        if tree_nodes > self.window:
            raise ValueError(
                f"draft: a {self.branching}-ary tree of depth {self.tree_depth} has {tree_nodes} nodes, "
                f"more than window={self.window}"
            )
        return self


class DraftTreeConfig(StrictModel):
    """EAGLE-2 dynamic draft tree of a draft model (ViSpec / EAGLE).

    ``DecodeConfig.draft_tree=None`` picks ``for_temperature``: measured best for latency with
    the reference LLaVA on a CPU, where a 12-20 token verification window costs ~1.3-1.5x a
    one-token forward. Greedy decoding wants a deep, narrow tree (the argmax path is long and
    predictable): the field defaults. Sampling gains from covering more of P at each level:
    ``for_temperature`` gives it as deep a tree, twice as wide (with drafts trained on sampled
    answers as well as greedy ones; see ``DataGenConfig.temperatures``). On GPUs, where a 30-60 token window
    costs about one forward, the paper's wider trees (depth 3-6, top_k 8-10, total 30-60)
    commit more tokens per forward; tune with ``raydec bench caption --depth/--top-k/--total-tokens``.
    """

    depth: int = Field(6, ge=1, le=32, description="Draft levels expanded per step (draft forwards per step).")
    top_k: int = Field(2, ge=1, le=64, description="Children per expanded node, and nodes expanded per level.")
    total_tokens: int = Field(12, ge=2, le=512, description="Tree size the target verifies, root included.")

    @model_validator(mode="after")
    def _tree_can_grow_to_total(self) -> "DraftTreeConfig":
        # level 1 holds top_k candidates, every later level top_k * top_k; the tree keeps the best
        candidates = self.top_k + (self.depth - 1) * self.top_k * self.top_k
        if self.total_tokens - 1 > candidates:
            raise ValueError(
                f"total_tokens={self.total_tokens}: a tree of depth={self.depth}, top_k={self.top_k} has at most "
                f"{candidates} candidates besides the root, so at most total_tokens={candidates + 1}"
            )
        return self

    @classmethod
    def for_temperature(cls, temperature: float) -> "DraftTreeConfig":
        """The default tree for greedy decoding (temperature 0) or for sampling."""
        return cls() if temperature == 0 else cls(depth=6, top_k=4, total_tokens=20)


#: captioning methods with a draft network (EAGLE-2 dynamic trees); "ar" captions without one
DRAFT_METHODS = ("vispec", "eagle")
CAPTION_METHODS = ("ar",) + DRAFT_METHODS
#: the speculative Jacobi family (no draft model); text-to-image runs these or plain AR
JACOBI_METHODS = ("sjd", "sjd_ac", "sjd_pac")
IMAGE_METHODS = ("ar",) + JACOBI_METHODS


class DecodeConfig(StrictModel):
    """Which decoding method to run and its knobs. ``jacobi`` shapes the Jacobi methods' drafts;
    the ``draft_*`` fields belong to the methods with a draft model (vispec, eagle)."""

    renamed_keys: ClassVar[dict[str, str]] = {"draft": "jacobi"}

    method: Literal["ar", "sjd", "sjd_ac", "sjd_pac", "vispec", "eagle"] = Field(
        "ar", description="Decoding method (proposer); every method uses the same lossless verifier."
    )
    max_new_tokens: int = Field(
        256, ge=1, le=65536,
        description="Upper bound on generated tokens per row. Unset: a caption's is 128, an image's its layout's token count "
        "(the default shown applies where neither does).",
    )
    jacobi: JacobiDraftConfig | Literal["auto"] = Field(
        default_factory=JacobiDraftConfig,
        description="Draft window / tree shape (sjd, sjd_ac, sjd_pac). auto: tuned for the batch size on this device, "
        "plain AR among the candidates (see docs/benchmarking.md, the frontier), cached on disk and recorded in a "
        "job's manifest.",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Target sampling distribution.")
    coupling: Literal["rejection", "gumbel"] = Field(
        "gumbel",
        description="How a sampled row's tokens follow from its seed; both give exactly the target's distribution. "
        "gumbel: each generated position has its own Gumbel noise, fixed by the seed, and the target's token there is "
        "argmax(log P + noise): a seed gives the same tokens whatever the method, draft shape, batch or load. "
        "rejection: recursive rejection sampling, so a seed's tokens depend on the method and draft shape. gumbel is "
        "the default: it kept 0.96-1.38 of rejection's tokens per forward on the reference models (docs/benchmarks.md, "
        "coupling; docs/engine.md, coupling).",
    )
    compaction: Literal["auto", "always", "never"] = Field(
        "auto", description="When the ragged KV cache drops rejected slots physically."
    )
    compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Capture a decode step's tensor work (the proposer's window, processing the logits, the "
        "verification, the carry-over) as compiled graphs: CUDA graphs per batch bucket on a GPU, one compiled graph "
        "on a CPU. auto: on for CUDA, off elsewhere (a CPU has no launches to save, and a graph compiles for tens of "
        "seconds first; see docs/engine.md, captured steps). The same tokens either way.",
    )
    batching: Literal["auto", "continuous", "consecutive"] = Field(
        "auto",
        description="How generate_images / caption_images keep batch_size rows decoding. continuous: a finished "
        "row's place goes to the next request at once; consecutive: a batch drains to its slowest row before the "
        "next starts; auto: continuous on an accelerator (a step costs about the same for 1 or 8 rows), "
        "consecutive on a CPU (a step costs in proportion to its rows). It changes speed, not the output law: each "
        "row's randomness is its own (in low precision, batched kernels may round a row differently).",
    )
    draft_tree: DraftTreeConfig | Literal["auto"] | None = Field(
        None, description="Draft-model tree (vispec, eagle); None: DraftTreeConfig.for_temperature(sampling.temperature); "
        "auto: tuned for the batch size, as for jacobi.",
    )
    draft_model: str | None = Field(
        None, min_length=1,
        description="Draft checkpoint for vispec / eagle, named as a model is (a folder, org/name[@revision] or "
        "s3://bucket/prefix); None: the reference VLM's shipped draft (other targets must set it).",
    )
    draft_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Precision the vispec / eagle draft runs in. auto: float32 on a CPU (a small draft's "
        "half-precision matmuls are slow there), the target's dtype on a GPU. Lossless whatever the choice: "
        "the draft only proposes, the verifier tests against the target.",
    )

    @model_validator(mode="after")
    def _draft_models_take_no_cfg(self) -> "DecodeConfig":
        if self.method in DRAFT_METHODS and self.sampling.uses_cfg:
            raise ValueError(f"sampling.cfg_scale={self.sampling.cfg_scale}: method {self.method!r} drafts with a draft model, "
                             f"which does not support classifier-free guidance (use cfg_scale 1, or ar)")
        return self

    @property
    def auto_shape(self) -> bool:
        """Whether this method's draft shape is "auto" (to be tuned for a batch size before decoding)."""
        return (self.method in JACOBI_METHODS and self.jacobi == "auto") or (self.method in DRAFT_METHODS and self.draft_tree == "auto")

    @property
    def tree(self) -> DraftTreeConfig:
        """The draft tree this config decodes with (``draft_tree`` or the temperature's default)."""
        if self.draft_tree == "auto":
            raise ValueError("decode.draft_tree='auto': the tree is chosen for a batch size first (raydec.api.draft_shapes)")
        return self.draft_tree or DraftTreeConfig.for_temperature(self.sampling.temperature)


#: an image size as requests and configs write it: WIDTHxHEIGHT in pixels ("auto": the model's own)
IMAGE_SIZE_PATTERN = r"^(auto|[1-9][0-9]{0,5}x[1-9][0-9]{0,5})$"


def parse_image_size(value: str | None, field: str = "size") -> tuple[int, int] | None:
    """``"WIDTHxHEIGHT"`` -> (width, height) in pixels; ``None`` or ``"auto"`` -> None (the
    model's own size); anything else is a ValueError naming ``field``."""
    if value is None or value == "auto":
        return None
    width, separator, height = str(value).partition("x")
    if not (separator and width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0):
        raise ValueError(f"{field}: {value!r} is not a size (write WIDTHxHEIGHT in pixels, e.g. 512x512, or auto)")
    return int(width), int(height)
