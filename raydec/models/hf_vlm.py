"""Adapter for Hugging Face image-text-to-text models (LLaVA, LLaVA-NeXT, Qwen2-VL, Qwen2.5-VL, Qwen3-VL).

A prompt is text with the processor's image placeholders plus its images. ``prompt_inputs``
runs the model's *own* multimodal merge (vision tower, projector, ``masked_scatter``, and for
Qwen the M-RoPE ``get_rope_index``) and stops right before the language model, so the prefix
handed to the engine is exactly what Hugging Face would feed its decoder:

    inputs_embeds [L, H]  the layer-0 embeddings (image features merged in)
    position_ids  [L], or [3, L] for M-RoPE (Qwen; text-only prompts too), next_position =
                  max position + 1
    image_index   [L]  which image of the prompt a position belongs to, -1 for text
    layer_residuals [K, L, H]  Qwen3-VL: the DeepStack visual features its first K decoder
                  layers add at image positions (zero elsewhere), passed back in the prefill

Windows after the prefill are text tokens: embeddings from the token table, 2-D positions
[M, N] (Qwen's text model broadcasts them to its three M-RoPE axes), logits over the full
vocabulary. For Qwen that equals Hugging Face's own decoding: generated token k sits at
``L + k + rope_delta`` on all three axes, with ``rope_delta = max position + 1 - L``.

Qwen's processors also hold a video processor, which needs ``torchvision``; where it cannot be
loaded, ``from_pretrained`` falls back to the same processor class without it
(``image_only_processor_class``): images and text are processed by the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from raydec.models.attention import use_window_attention
from raydec.models.base import CheckpointError, PromptInputs, SharedVocabularyForward

#: model_type -> the Hugging Face class name, for clear errors
SUPPORTED_VLMS = {
    "llava": "LlavaForConditionalGeneration",
    "llava_next": "LlavaNextForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
}

#: models whose decoder takes multimodal (3-axis) rotary positions
MROPE_VLMS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")

#: models that add visual features to the hidden states of their first decoder layers (DeepStack)
DEEPSTACK_VLMS = ("qwen3_vl",)

#: model_type -> its processor class (Qwen-VL: loaded without its video processor where that needs torchvision)
QWEN_PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}


@dataclass(frozen=True)
class VlmPrompt:
    """Processor-ready text (with one image placeholder per image) and its images."""

    text: str
    images: Sequence[Any] = field(default_factory=tuple)


class _LanguageModelReached(Exception):
    """Raised by a pre-forward hook to stop the VLM right before its decoder."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__("language model reached")
        self.kwargs = kwargs


def _image_token_id(config: Any) -> int:
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    raise ValueError(f"{type(config).__name__} names no image token id")


#: the vision tokens a Qwen-VL processor names (attribute stem, default token)
QWEN_VISION_TOKENS = (("image", "<|image_pad|>"), ("video", "<|video_pad|>"), ("vision_start", "<|vision_start|>"),
                      ("vision_end", "<|vision_end|>"))


def image_only_processor_class(processor_class: type) -> type:
    """``processor_class`` (a Qwen-VL processor) without its video processor.

    The subclass keeps the class name (so ``save_pretrained`` writes the real ``processor_class``)
    and the processing code; only the ``video_processor`` argument, whose classes need
    ``torchvision``, is gone. Loads with ``from_pretrained`` from the tokenizer and image
    processor files of a checkpoint.
    """
    from transformers.processing_utils import ProcessorMixin

    def __init__(self: Any, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **kwargs: Any) -> None:
        for kind, default in QWEN_VISION_TOKENS:
            token = getattr(tokenizer, f"{kind}_token", None) or default
            setattr(self, f"{kind}_token", token)
            token_id = getattr(tokenizer, f"{kind}_token_id", None)
            setattr(self, f"{kind}_token_id", token_id if token_id is not None else tokenizer.convert_tokens_to_ids(token))
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)

    namespace = {"__init__": __init__, "__module__": processor_class.__module__, "__doc__": processor_class.__doc__}
    return type(processor_class.__name__, (processor_class,), namespace)


def _load_processor(path: Path, model_type: str) -> Any:
    """AutoProcessor; for Qwen-VL, where that fails (no video processor), the image-only class."""
    from transformers import AutoProcessor
    import transformers

    try:
        return AutoProcessor.from_pretrained(str(path), local_files_only=True)
    except Exception as error:  # noqa: BLE001 - re-raised below when there is no fallback
        if model_type not in MROPE_VLMS:
            raise
        try:
            return image_only_processor_class(getattr(transformers, QWEN_PROCESSORS[model_type])).from_pretrained(str(path), local_files_only=True)
        except Exception:
            raise error


def _deepstack_residuals(decoder_kwargs: dict[str, Any], length: int) -> torch.Tensor | None:
    """A one-prompt forward's DeepStack inputs (``visual_pos_masks`` [1, L], one [n, H] tensor
    per layer) as dense layer residuals [K, L, H], zero off the visual positions; None without."""
    features, where = decoder_kwargs.get("deepstack_visual_embeds"), decoder_kwargs.get("visual_pos_masks")
    if not features or where is None:
        return None
    where = where[0].cpu()
    residuals = features[0].new_zeros(len(features), length, features[0].shape[-1]).cpu()
    for layer, feature in enumerate(features):
        residuals[layer, where] = feature.cpu()
    return residuals


def split_image_spans(is_image: torch.Tensor, num_images: int, counts: Sequence[int] | None = None) -> torch.Tensor:
    """Assign image positions to images. is_image: [L] bool -> image_index [L] (-1 = text).

    With ``counts`` (image tokens per image, in prompt order, summing to the image positions)
    the image positions are dealt out in order. Without, each contiguous run of image tokens
    is one image, and adjacent images of equal size (one run holding several) are split evenly.
    """
    index = torch.full(is_image.shape, -1, dtype=torch.long)
    positions = is_image.nonzero().flatten().tolist()
    if num_images == 0 or not positions:
        if positions or num_images:
            raise ValueError(f"prompt has {len(positions)} image tokens for {num_images} images")
        return index
    if counts is not None and len(counts) == num_images and sum(counts) == len(positions) and min(counts) > 0:
        start = 0
        for k, count in enumerate(counts):
            index[torch.tensor(positions[start : start + count])] = k
            start += count
        return index
    runs: list[list[int]] = [[positions[0]]]
    for p in positions[1:]:
        if p == runs[-1][-1] + 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    if len(runs) != num_images:
        if len(positions) % num_images:
            raise ValueError(
                f"cannot split {len(positions)} image tokens in {len(runs)} runs among {num_images} images; "
                "separate image placeholders with text"
            )
        size = len(positions) // num_images
        runs = [positions[i : i + size] for i in range(0, len(positions), size)]
    for k, run in enumerate(runs):
        index[torch.tensor(run)] = k
    return index


class VisionLanguageTarget(SharedVocabularyForward):
    """Wrap a Hugging Face VLM (see ``SUPPORTED_VLMS``) for the engine and the ViSpec draft."""

    def __init__(self, model: torch.nn.Module, processor: Any) -> None:
        self.model = model.eval()
        use_window_attention(model)  # grouped-query windows attend without repeating K/V
        self.processor = processor
        self.model_type = str(model.config.model_type)
        if self.model_type not in SUPPORTED_VLMS:
            raise ValueError(f"model_type {self.model_type!r} is not a supported VLM ({', '.join(SUPPORTED_VLMS)})")
        self.image_token_id = _image_token_id(model.config)
        self.decoder = self.window_decoder = model.model.language_model
        self.head = self.window_head = model.lm_head
        self.checkpoint_path: Path | None = None  # set when loaded by path; drafts ship beside it
        self.text_config = model.config.get_text_config()

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", **kwargs: Any) -> "VisionLanguageTarget":
        """Load model and processor from a local folder (never downloads)."""
        import json

        import transformers

        path = Path(path).expanduser()
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"no VLM checkpoint at {path}: config.json not found")
        model_type = json.loads(config_file.read_text()).get("model_type")
        if model_type not in SUPPORTED_VLMS:
            raise CheckpointError(f"checkpoint {path}: model_type {model_type!r} is not a supported VLM ({', '.join(SUPPORTED_VLMS)})")
        model_class = getattr(transformers, SUPPORTED_VLMS[model_type])
        model = model_class.from_pretrained(str(path), dtype=dtype, local_files_only=True, **kwargs).to(device)
        processor = _load_processor(path, model_type)
        target = cls(model, processor)
        target.checkpoint_path = path
        return target

    # -- properties the engine reads -----------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return int(self.head.weight.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.text_config.hidden_size)

    @property
    def eos_token_ids(self) -> list[int]:
        """End-of-sequence ids from the generation config (falls back to the text config)."""
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = getattr(self.text_config, "eos_token_id", None)
        if eos is None:
            return []
        return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]

    # -- prompts -------------------------------------------------------------------------------

    def format_prompt(self, question: str, num_images: int = 1) -> str:
        """A one-turn chat prompt with ``num_images`` images before the question."""
        content = [{"type": "image"} for _ in range(num_images)] + [{"type": "text", "text": question}]
        return self.format_messages([{"role": "user", "content": content}])

    def format_messages(self, messages: list[dict[str, Any]]) -> str:
        """A chat (Hugging Face message dicts; ``{"type": "image"}`` parts mark where each image
        goes) as the processor's chat template writes it, ready for the assistant's turn."""
        return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def processor_inputs(self, prompt: VlmPrompt) -> dict[str, torch.Tensor]:
        """Run the processor on one prompt (batch of one)."""
        images = list(prompt.images) or None
        return dict(self.processor(text=[prompt.text], images=images, return_tensors="pt"))

    @torch.inference_mode()
    def prompt_inputs(self, prompt: Any, unconditional: bool = False) -> PromptInputs:
        if unconditional:
            raise ValueError("classifier-free guidance is not defined for captioning models")
        if not isinstance(prompt, VlmPrompt):
            raise TypeError(f"VLM prompts are VlmPrompt(text, images), got {type(prompt).__name__}")
        inputs = self.processor_inputs(prompt)
        input_ids = inputs["input_ids"][0]
        captured = self._decoder_inputs(inputs)
        embeds = captured["inputs_embeds"][0]
        length = int(embeds.shape[0])
        positions = captured.get("position_ids")
        if positions is not None:
            positions = positions[:, 0].cpu() if positions.dim() == 3 else positions[0].cpu()  # [P, L] or [L]
            if positions.dim() == 2 and positions.shape[0] == 4:  # text positions + 3 M-RoPE axes
                positions = positions[1:]
        elif self.model_type in MROPE_VLMS:  # no image: the model left its positions to the decoder
            positions = torch.arange(length).expand(3, length)
        if positions is not None:
            positions = positions.long().contiguous()
            next_position = int(positions.max()) + 1
        else:
            next_position = None
        image_index = split_image_spans(
            input_ids == self.image_token_id, len(prompt.images), self._image_token_counts(inputs, prompt)
        )
        return PromptInputs(
            inputs_embeds=embeds, position_ids=positions, next_position=next_position,
            image_index=image_index, context_ids=input_ids.long().cpu(), layer_residuals=_deepstack_residuals(captured, length),
        )

    def layer_residual_kwargs(self, layer_residuals: torch.Tensor) -> dict[str, Any]:
        """Qwen3-VL's DeepStack inputs for residuals [K, M, N, H]: every position is marked, and
        the features (zero where there is no image) are added after each of the first K layers."""
        if self.model_type not in DEEPSTACK_VLMS:
            return super().layer_residual_kwargs(layer_residuals)
        layers, rows, width, size = layer_residuals.shape
        every = torch.ones(rows, width, dtype=torch.bool, device=layer_residuals.device)
        return {"visual_pos_masks": every, "deepstack_visual_embeds": list(layer_residuals.reshape(layers, rows * width, size))}

    def _image_token_counts(self, inputs: dict[str, Any], prompt: VlmPrompt) -> list[int] | None:
        """Image tokens per image of the prompt, from the processor's outputs (None: unknown)."""
        if not prompt.images:
            return None
        grid = inputs.get("image_grid_thw")
        if grid is not None:  # Qwen: t * h * w patches merged merge x merge
            merge = getattr(self.processor.image_processor, "merge_size", None)
            if merge is None:
                merge = self.model.config.vision_config.spatial_merge_size
            return (grid.prod(-1) // int(merge) ** 2).tolist()
        sizes = inputs.get("image_sizes")
        count_tokens = getattr(self.processor, "_get_num_multimodal_tokens", None)
        if sizes is not None and count_tokens is not None:  # LLaVA-NeXT: tokens depend on each image's size
            try:
                data = count_tokens(image_sizes=[tuple(int(v) for v in s) for s in sizes.tolist()])
                counts = data["num_image_tokens"] if isinstance(data, dict) else data.num_image_tokens
                return [int(c) for c in counts]
            except Exception:  # noqa: BLE001 - fall back to splitting runs of image tokens
                return None
        return None

    def _decoder_inputs(self, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The keyword arguments the VLM passes to its language model, captured by a hook."""

        def stop(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
            raise _LanguageModelReached(kwargs)

        inner = self.model.model
        saved_deltas = getattr(inner, "rope_deltas", None)  # Qwen caches M-RoPE deltas on the model
        if hasattr(inner, "rope_deltas"):
            inner.rope_deltas = None
        hook = self.decoder.register_forward_pre_hook(stop, with_kwargs=True)
        try:
            moved = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in inputs.items()}
            for key in ("pixel_values", "pixel_values_videos"):
                if moved.get(key) is not None and moved[key].is_floating_point():
                    moved[key] = moved[key].to(self.dtype)
            inner(**moved, use_cache=False)
        except _LanguageModelReached as reached:
            return reached.kwargs
        finally:
            hook.remove()
            if hasattr(inner, "rope_deltas"):
                inner.rope_deltas = saved_deltas
        raise RuntimeError(f"{type(self.model).__name__} never called its language model")
