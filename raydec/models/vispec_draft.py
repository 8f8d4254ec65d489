"""The ViSpec / EAGLE-2 draft network.

EAGLE-2 draft: draft position t reads the pair (feature f_t, token x_{t+1})

    x = fc(cat(embed(x_{t+1}), f_t))            embed and lm_head: the target's, frozen
    h = one Llama decoder layer (no input norm, no final norm)
    h ~ f_{t+1};  lm_head(h) predicts x_{t+2}

f_t is the target's last hidden state (after its final norm), or the draft's own h when
drafting deeper. ViSpec adds two vision modules (``vision=True``):

- a vision adaptor: ``num_q`` learned queries cross-attend (no mask, no positions) over the
  layer-0 embeddings of one image span; the first ``num_q - 1`` outputs replace the span in the
  draft sequence (they take the span's last ``num_q - 1`` pair slots: their features and
  position ids), the last output is the image's global feature g;
- ``img_fc(cat(f_t, g))`` replaces f_t at every text pair after an image and every generated
  pair (g of the latest image before it); initialised to ``[I | 0]``, so a fresh ViSpec draft
  equals the EAGLE draft it starts from.

Positions are plain 1-D (pair t at position t) for every target, M-RoPE ones included; the
draft cache tracks the real length, so positions after a compressed span keep the original
numbering. Several images per prompt: each span is compressed on its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from raydec.config import StrictModel
from raydec.models.attention import use_window_attention
from raydec.models.base import CheckpointError, cache_keyword, decoding_attention
from raydec.models.cpu_matmul import row_major_weight
from raydec.models.folded_input import DecodeRows, FoldedDraftInput
from raydec.models.fused_layer import FusedDecoderLayer
from pydantic import Field

CONFIG_NAME = "draft_config.json"
WEIGHTS_NAME = "model.safetensors"


class DraftConfig(StrictModel):
    """Shape of a draft network; the decoder layer matches the target's text width."""

    hidden_size: int = Field(..., ge=1)
    intermediate_size: int = Field(..., ge=1)
    num_attention_heads: int = Field(..., ge=1)
    num_key_value_heads: int = Field(..., ge=1)
    head_dim: int = Field(..., ge=1)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = Field(4096, ge=1)
    vocab_size: int = Field(..., ge=1, description="The target's vocabulary (embedding and lm_head rows).")
    vision: bool = Field(True, description="ViSpec vision modules; False is the text-only EAGLE-2 draft.")
    num_q: int = Field(2, ge=1, le=64, description="Adaptor queries: num_q - 1 compressed tokens + 1 global feature.")
    adaptor_heads: int = Field(4, ge=1)
    target_model_type: str = ""

    @classmethod
    def for_target(cls, text_config: Any, **overrides: Any) -> "DraftConfig":
        """A draft config matching a Hugging Face text config."""
        heads = int(text_config.num_attention_heads)
        head_dim = getattr(text_config, "head_dim", None) or int(text_config.hidden_size) // heads
        rope = getattr(text_config, "rope_parameters", None) or {}
        values = dict(
            hidden_size=int(text_config.hidden_size),
            intermediate_size=int(text_config.intermediate_size),
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(text_config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(getattr(text_config, "rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", getattr(text_config, "rope_theta", 10000.0))),
            max_position_embeddings=int(getattr(text_config, "max_position_embeddings", 4096)),
            vocab_size=int(text_config.vocab_size),
            target_model_type=str(getattr(text_config, "model_type", "")),
        )
        values.update(overrides)
        return cls(**values)


def check_draft_fits(path: str | Path, draft_config: Any, text_config: Any, method: str) -> None:
    """A CheckpointError naming ``decode.draft_model`` when the draft model at ``path`` cannot serve ``method``
    on a target with ``text_config`` (a Hugging Face text config): the other kind of draft model, or
    another width or vocabulary. ``draft_config``: its DraftConfig, or the draft_config.json mapping.
    Reads configs only, so a job checks it before Ray starts and ``load_draft_model`` before weights."""
    get = draft_config.get if isinstance(draft_config, dict) else lambda name, default=None: getattr(draft_config, name, default)
    vision = bool(get("vision", True))
    if vision != (method == "vispec"):
        has, needs = ("a ViSpec (vision)", "a text-only") if vision else ("a text-only (EAGLE)", "a vision")
        raise CheckpointError(f"decode.draft_model: {path} holds {has} draft; decode.method={method!r} needs {needs} draft")
    for field in ("hidden_size", "vocab_size"):
        want, have = getattr(text_config, field, None), get(field)
        if want is not None and have is not None and int(want) != int(have):
            raise CheckpointError(
                f"decode.draft_model: {path} is a draft for {field}={have}, but the target's text model has "
                f"{field}={want} (a draft is trained for one target)"
            )


class VisionAdaptor(nn.Module):
    """``num_q`` learned queries attend over one image span. [S, H] -> [num_q, H]"""

    def __init__(self, hidden: int, num_q: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"adaptor_heads={heads} must divide hidden_size={hidden}")
        self.heads = heads
        self.queries = nn.Parameter(torch.randn(num_q, hidden) * 0.02)
        self.norm = nn.LayerNorm(hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))

    def forward(self, span: torch.Tensor) -> torch.Tensor:
        q_len, hidden = self.queries.shape
        d = hidden // self.heads
        x = self.norm(span)
        k = self.key(x).view(-1, self.heads, d).transpose(0, 1)  # [h, S, d]
        v = self.value(x).view(-1, self.heads, d).transpose(0, 1)
        q = self.queries.view(q_len, self.heads, d).transpose(0, 1)  # [h, num_q, d]
        attended = torch.softmax(q @ k.transpose(1, 2) / d**0.5, dim=-1) @ v  # [h, num_q, d]
        y = self.queries + self.out(attended.transpose(0, 1).reshape(q_len, hidden))
        return y + self.mlp(y)


@dataclass
class DraftSequence:
    """One row's draft input pairs after image compression.

    token_embeds: [n, H]  embedding part (token x_{t+1}, or a compressed image token)
    features:     [n, H]  feature part (f_t)
    positions:    [n]     long position ids
    global_index: [n]     long image whose g is injected through img_fc (-1 = none)
    globals_:     [I, H]  global features of the row's images (I may be 0)
    """

    token_embeds: torch.Tensor
    features: torch.Tensor
    positions: torch.Tensor
    global_index: torch.Tensor
    globals_: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.token_embeds.shape[0])

    @property
    def last_global(self) -> int:
        """Image whose g every generated pair gets (-1 when the row has no image)."""
        return self.globals_.shape[0] - 1


class VispecDraft(nn.Module):
    """EAGLE-2 draft with optional ViSpec vision modules (see module docstring)."""

    def __init__(self, config: DraftConfig, embed: nn.Embedding | None = None, lm_head: nn.Linear | None = None) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        self.config = config
        hidden = config.hidden_size
        layer_config = LlamaConfig(
            vocab_size=1, hidden_size=hidden, intermediate_size=config.intermediate_size,
            num_hidden_layers=1, num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
            rms_norm_eps=config.rms_norm_eps, max_position_embeddings=config.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
            bos_token_id=None, eos_token_id=None, pad_token_id=None,
        )
        self.decoder = LlamaModel(layer_config)
        use_window_attention(self.decoder)  # grouped-query windows attend without repeating K/V
        self.decoder.layers[0].input_layernorm = nn.Identity()
        self.decoder.norm = nn.Identity()
        self.fc = nn.Linear(2 * hidden, hidden)
        self.adaptor = VisionAdaptor(hidden, config.num_q, config.adaptor_heads) if config.vision else None
        self.img_fc = nn.Linear(2 * hidden, hidden) if config.vision else None
        if self.img_fc is not None:
            with torch.no_grad():
                self.img_fc.weight.zero_()
                self.img_fc.weight[:, :hidden].copy_(torch.eye(hidden))
                self.img_fc.bias.zero_()
        self._target_parts: tuple[nn.Module, nn.Module] | None = None
        self._fused: FusedDecoderLayer | None = None  # inference snapshot of the decoder layer
        self._input: FoldedDraftInput | None = None  # inference snapshot of fc (+ img_fc)
        if embed is not None and lm_head is not None:
            self.attach_target(embed, lm_head)

    # -- target-owned pieces -------------------------------------------------------------------

    def attach_target(self, embed: nn.Module, lm_head: nn.Module) -> "VispecDraft":
        """Use the target's token embedding and output head. They stay the target's: not
        registered as submodules, so they are neither trained, moved, cast nor saved here."""
        self._target_parts = (embed, lm_head)
        return self

    @property
    def embed(self) -> nn.Module | None:
        return self._target_parts[0] if self._target_parts else None

    @property
    def lm_head(self) -> nn.Module | None:
        return self._target_parts[1] if self._target_parts else None

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.state_dict())

    # -- inference form ------------------------------------------------------------------------

    def prepare_inference(self) -> "VispecDraft":
        """Run the decoder layer as a ``FusedDecoderLayer`` snapshot of the current weights, and
        decode steps' input projection folded (``FoldedDraftInput``), for a loaded draft that only
        decodes; training, moving or casting the draft drops both."""
        self._fused = FusedDecoderLayer(self.decoder.layers[0], self.decoder.rotary_emb)
        self._input = FoldedDraftInput(self.fc, self.img_fc)
        return self

    def train(self, mode: bool = True) -> "VispecDraft":
        if mode:
            self._fused = self._input = None
        return super().train(mode)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> "VispecDraft":
        self._fused = self._input = None  # .to() / .float() / .cuda(): the snapshots would be stale
        return super()._apply(fn, *args, **kwargs)

    # -- sequences -----------------------------------------------------------------------------

    def build_sequence(
        self, token_embeds: torch.Tensor, features: torch.Tensor, token_image: torch.Tensor, positions: torch.Tensor
    ) -> DraftSequence:
        """Pairs (f_t, x_{t+1}) of one row -> the draft's input sequence.

        token_embeds [n, H] layer-0 embeddings of x_{t+1}; features [n, H] f_t; token_image [n]
        image of x_{t+1} (-1 = text); positions [n].
        """
        hidden = token_embeds.shape[-1]
        no_globals = token_embeds.new_zeros(0, hidden)
        if self.adaptor is None or not bool((token_image >= 0).any()):
            return DraftSequence(token_embeds, features, positions, torch.full_like(positions, -1), no_globals)
        num_images = int(token_image.max()) + 1
        keep = token_image < 0  # [n]
        embeds = token_embeds.clone()
        globals_ = []
        for k in range(num_images):
            span = (token_image == k).nonzero().flatten()
            out = self.adaptor(token_embeds[span])  # [num_q, H]
            slots = span[span.numel() - (out.shape[0] - 1) :] if out.shape[0] > 1 else span[:0]
            embeds[slots] = out[: slots.numel()].to(embeds.dtype)
            keep[slots] = True
            globals_.append(out[-1])
        # g of the latest image whose span ends before each text pair's token
        seen = torch.where(token_image >= 0, token_image, torch.full_like(token_image, -1)).cummax(dim=0).values
        global_index = torch.where(token_image < 0, seen, torch.full_like(seen, -1))
        return DraftSequence(
            embeds[keep], features[keep], positions[keep], global_index[keep], torch.stack(globals_).to(embeds.dtype)
        )

    # -- forward -------------------------------------------------------------------------------

    def inject_global(self, features: torch.Tensor, globals_: torch.Tensor | None, use: torch.Tensor | None) -> torch.Tensor:
        """img_fc(cat(f, g)) where ``use``; f elsewhere. features, globals_: [B, N, H]; use: [B, N] bool."""
        if self.img_fc is None or globals_ is None or use is None or not bool(use.any()):
            return features
        mixed = self.img_fc(torch.cat([features, globals_.to(features.dtype)], dim=-1))
        return torch.where(use.unsqueeze(-1), mixed, features)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        with decoding_attention(self.fc.weight.device):  # no cuDNN attention: it rebuilds per cache length
            return self._forward(*args, **kwargs)

    def _forward(
        self,
        token_embeds: torch.Tensor,
        features: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        globals_: torch.Tensor | None = None,
        use_global: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Draft hidden states. token_embeds, features: [B, N, H]; position_ids [B, N];
        attention_mask [B, 1, N, S + N] additive (None: causal); globals_ [B, N, H] with use_global [B, N].
        -> [B, N, H]
        """
        features = self.inject_global(features, globals_, use_global)
        x = self.fc(torch.cat([token_embeds.to(features.dtype), features], dim=-1))
        if attention_mask is None:  # plain causal (training on whole sequences)
            width = x.shape[1]
            causal = torch.ones(width, width, dtype=torch.bool, device=x.device).tril()
            attention_mask = torch.zeros(width, width, dtype=x.dtype, device=x.device).masked_fill(~causal, torch.finfo(x.dtype).min)
            attention_mask = attention_mask.expand(x.shape[0], 1, width, width)
        if self._fused is not None:
            return self._fused(x, position_ids, attention_mask, cache)
        # the one decoder layer, called directly (no LlamaModel wrappers: this runs every draft step)
        rotary = self.decoder.rotary_emb(x, position_ids=position_ids)
        layer = self.decoder.layers[0]
        return layer(
            x, attention_mask=attention_mask.to(x.dtype), position_ids=position_ids,
            use_cache=cache is not None, position_embeddings=rotary, **{cache_keyword(layer): cache},
        )

    def decode_rows(self, row_globals: torch.Tensor, row_has_global: torch.Tensor) -> DecodeRows:
        """What ``decode_forward`` needs of each row's image, once per batch of rows (in decoding,
        every pair of a row gets its last image's g, or none does).
        row_globals [B, H]; row_has_global [B] bool"""
        if self._input is None:
            return DecodeRows(row_globals, row_has_global.cpu())  # no biases: decode_forward runs forward
        return self._input.rows(row_globals, row_has_global)

    def decode_forward(
        self,
        token_embeds: torch.Tensor,
        features: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any,
        rows: DecodeRows,
        max_position: int | None = None,
    ) -> torch.Tensor:
        """``forward`` for decode steps. token_embeds, features [B, N, H]; rows: ``decode_rows``
        of these B rows; max_position: position_ids.max() if known. -> [B, N, H]"""
        with decoding_attention(token_embeds.device):
            return self._decode_forward(token_embeds, features, position_ids, attention_mask, cache, rows, max_position)

    def _decode_forward(self, token_embeds, features, position_ids, attention_mask, cache, rows, max_position):
        if self._input is None or self._fused is None or rows.bias is None:  # the training form
            if not any(rows.has_global_host):
                return self(token_embeds, features, position_ids, attention_mask, cache)
            batch, width = position_ids.shape
            globals_ = rows.globals_.unsqueeze(1).expand(batch, width, rows.globals_.shape[-1])
            use = rows.has_global.to(position_ids.device).unsqueeze(1).expand(batch, width)
            return self(token_embeds, features, position_ids, attention_mask, cache, globals_, use)
        return self._fused(self._input(token_embeds, features, rows), position_ids, attention_mask, cache, max_position)

    @property
    def captures(self) -> bool:
        """Whether ``window_forward`` runs: the inference form (``prepare_inference``)."""
        return self._fused is not None and self._input is not None

    def attention_scope(self, device: torch.device) -> Any:
        """The attention kernels a decode step may use (``decoding_attention``), for callers that
        run ``window_forward`` inside a captured function: the context goes around the capture."""
        return decoding_attention(device)

    def reserve_positions(self, positions: int, dtype: torch.dtype) -> None:
        """Rotary tables for positions 0..positions-1 before a ``window_forward`` reads them."""
        self._fused.reserve_positions(positions, dtype)

    def window_forward(
        self, token_embeds: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
        past_keys: torch.Tensor, past_values: torch.Tensor, bias: torch.Tensor, has_global: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``decode_forward`` of the inference form on explicit keys and values, a pure tensor
        function (the captured draft step): the rows' ``DecodeRows`` as tensors (``bias`` [B, H],
        ``has_global`` [B] bool on the draft's device).
        token_embeds, features [B, N, H]; position_ids [B, N]; past_keys, past_values [B, kv, P, d];
        attention_mask [B, 1, N, P + N] additive -> hidden [B, N, H], the window's keys and values [B, kv, N, d]"""
        x = self._input.per_row(token_embeds, features, bias, has_global)
        return self._fused.window(x, position_ids, attention_mask, past_keys, past_values)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's head on draft hidden states [..., H] -> [..., V]. In the inference form,
        when the head keeps a row-major copy in the draft's precision (a CPU target,
        ``cpu_matmul``), one GEMM on it (fp32 logits of an fp32 draft); else the head itself, in
        its own dtype."""
        return self.head_logits(hidden, self.routed_head(hidden.dtype))

    def routed_head(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The head's row-major (W^T, bias) in ``dtype`` when ``logits`` takes that route, else None."""
        assert self.lm_head is not None, "attach_target() first"
        return row_major_weight(self.lm_head, dtype) if self._fused is not None else None

    @property
    def head_dtype(self) -> torch.dtype:
        return next(self.lm_head.parameters()).dtype  # the target's head: its dtype, not the draft's

    def head_logits(
        self, hidden: torch.Tensor, routed: tuple[torch.Tensor, torch.Tensor | None] | None, head_dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """``logits`` with the route resolved (``routed_head``; ``head_dtype``: the head's, None to
        look it up): what a captured step calls."""
        if routed is not None:
            weight_t, bias = routed
            rows = hidden.reshape(-1, hidden.shape[-1])
            out = rows @ weight_t if bias is None else torch.addmm(bias, rows, weight_t)
            return out.view(*hidden.shape[:-1], out.shape[-1])
        return self.lm_head(hidden.to(head_dtype or self.head_dtype))

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        assert self.embed is not None, "attach_target() first"
        return self.embed(ids)

    # -- checkpoints ---------------------------------------------------------------------------

    def save_pretrained(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / CONFIG_NAME).write_text(self.config.model_dump_json(indent=2) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in self.trainable_state_dict().items()}
        save_file(state, str(path / WEIGHTS_NAME))

    @classmethod
    def from_pretrained(cls, path: str | Path, target: Any | None = None, dtype: torch.dtype | None = None) -> "VispecDraft":
        """Load a draft model's folder; ``target`` (a VisionLanguageTarget) supplies embed and lm_head."""
        from safetensors.torch import load_file

        path = Path(path).expanduser()
        if not (path / CONFIG_NAME).is_file():
            raise FileNotFoundError(f"no draft checkpoint at {path}: {CONFIG_NAME} not found")
        config = DraftConfig(**json.loads((path / CONFIG_NAME).read_text()))
        draft_model = cls(config)
        missing, unexpected = draft_model.load_state_dict(load_file(str(path / WEIGHTS_NAME)), strict=False)
        if missing or unexpected:
            raise ValueError(f"draft checkpoint {path}: missing {missing}, unexpected {unexpected}")
        if target is not None:
            draft_model.attach_target(target.model.get_input_embeddings(), target.head)
            draft_model.to(device=target.device, dtype=dtype or target.dtype)
        elif dtype is not None:
            draft_model.to(dtype=dtype)
        return draft_model.eval()
