"""The OpenAI request bodies the API takes (its OpenAPI schema comes from these), with raydec's
own fields beside OpenAI's (sent by the ``openai`` client through ``extra_body``).

Unknown fields are errors (a typo is a 400 naming it), except OpenAI fields that change nothing
here, which are accepted and ignored (listed per model).
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from raydec.config import IMAGE_SIZE_PATTERN
from raydec.validation import text_problem


def _valid_text(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: text a tokenizer reads: a lone surrogate is a 400 naming the field, not a tokenizer's error
Text = Annotated[str, AfterValidator(_valid_text)]

SEED = Field(None, ge=0, lt=2**63, description="raydec: the row's seed (a request's n images take seed, seed+1, ...); unset: random.")
COUPLING = Field(
    None, description="raydec: how a sampled row's tokens follow from its seed: 'rejection' (they depend on the method and "
    "draft shape) or 'gumbel' (the same tokens for a seed whatever the method, draft shape, batch or load); unset: the model's.",
)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImageGenerationRequest(_Body):
    """POST /v1/images/generations (OpenAI ImageGenerateParams, plus raydec's fields)."""

    prompt: Text = Field(..., min_length=1, description="What the image shows.")
    model: Optional[str] = Field(None, description="A served text-to-image model; unset: the first one.")
    n: int = Field(1, ge=1, le=16, description="Images to generate (at most the server's limits.max_n).")
    size: Optional[str] = Field(
        None, pattern=IMAGE_SIZE_PATTERN,
        description="'auto' (the model's own) or WIDTHxHEIGHT; a model that makes several sizes (Emu3, Lumina-mGPT) takes others, "
        "a size the model cannot make is a 400 naming those it can.",
    )
    response_format: Optional[Literal["b64_json", "url"]] = Field(None, description="b64_json only (url is a 400: nothing is stored).")
    output_format: Optional[Literal["png"]] = Field(None, description="png.")
    stream: bool = Field(False, description="Server-sent events: partial images as rows commit, then the image.")
    partial_images: int = Field(0, ge=0, le=3, description="Partial images to stream before the final one.")
    # OpenAI fields that change nothing here
    background: Optional[str] = None
    moderation: Optional[str] = None
    quality: Optional[str] = None
    style: Optional[str] = None
    output_compression: Optional[int] = None
    user: Optional[str] = None
    # raydec
    seed: Optional[int] = SEED
    method: Optional[Literal["ar", "sjd", "sjd_ac", "sjd_pac"]] = Field(None, description="raydec: decoding method; unset: the model's.")
    cfg_scale: Optional[float] = Field(None, ge=0.0, le=100.0, description="raydec: classifier-free guidance scale.")
    temperature: Optional[float] = Field(None, ge=0.0, le=10.0, description="raydec: sampling temperature (0: greedy).")
    top_k: Optional[int] = Field(None, ge=0, le=1_000_000, description="raydec: top-k (0 disables).")
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0, description="raydec: nucleus mass.")
    coupling: Optional[Literal["rejection", "gumbel"]] = COUPLING
    negative_prompt: Optional[Text] = Field(None, description="raydec: the CFG unconditional text.")


class ImageURL(_Body):
    url: str = Field(..., min_length=1, description="A data: URL; https:// or s3:// when the server allows them.")
    detail: Optional[Literal["auto", "low", "high"]] = None


class ImagePart(_Body):
    type: Literal["image_url"]
    image_url: ImageURL


class TextPart(_Body):
    type: Literal["text"]
    text: Text


ContentPart = Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant"]
    content: Union[Text, list[ContentPart]]
    name: Optional[str] = None


class StreamOptions(_Body):
    include_usage: bool = False


class ChatCompletionRequest(_Body):
    """POST /v1/chat/completions (OpenAI's, plus raydec's fields)."""

    model: str = Field(..., min_length=1, description="A served vision-language model.")
    messages: list[ChatMessage] = Field(..., min_length=1, description="The chat; image_url parts carry images.")
    max_tokens: Optional[int] = Field(None, ge=1, le=1_000_000, description="Most tokens to generate.")
    max_completion_tokens: Optional[int] = Field(None, ge=1, le=1_000_000, description="Most tokens to generate (wins over max_tokens).")
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0, description="Sampling temperature (0: greedy); unset: the model's.")
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0, description="Nucleus mass.")
    seed: Optional[int] = SEED
    stop: Optional[Union[Text, list[Text]]] = Field(None, description="Up to 4 strings that end the answer.")
    n: int = Field(1, ge=1, le=1, description="1.")
    stream: bool = Field(False, description="Server-sent chunks as tokens commit.")
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None  # accepted, unused
    # raydec
    method: Optional[Literal["ar", "vispec", "eagle"]] = Field(None, description="raydec: decoding method; unset: the model's.")
    top_k: Optional[int] = Field(None, ge=0, le=1_000_000, description="raydec: top-k (0 disables).")
    coupling: Optional[Literal["rejection", "gumbel"]] = COUPLING

    def new_tokens(self) -> Optional[int]:
        """The most tokens to generate: max_completion_tokens, else max_tokens (None: neither set)."""
        return self.max_completion_tokens or self.max_tokens

    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple of strings (empty: none)."""
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
