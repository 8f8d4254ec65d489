"""What crosses between the ingress and a model replica (pickled by Ray): typed requests one way,
typed events back.

The ingress validates an OpenAI body (``protocol``), checks it against the limits and builds a
request from it: ``ImageRequest`` for ``ImageReplica.generate_images``, ``ChatRequest`` (its messages turned
into Hugging Face messages, its images read and checked) for ``ChatReplica.chat``. Each call
streams events back:

    images: PartialImage (while rows commit, when asked), ImageDone (per image), Failed
    chat:   TextDelta (when streamed), ChatDone (the answer), Failed

A ``Failed`` ends the request; the ingress answers it as the API error it names. This module is
light (no torch): the ingress imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol, Union

from raydec.serve.protocol import ChatCompletionRequest, ImageGenerationRequest

if TYPE_CHECKING:
    from PIL import Image


# -- requests ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """A request's own sampling settings; unset ones stay the engine's."""

    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None

    def per_row(self) -> Optional[dict[str, Any]]:
        """The settings a scheduler's ``submit`` takes as ``sampling`` (None: none set)."""
        chosen = {name: value for name, value in (("temperature", self.temperature), ("top_k", self.top_k), ("top_p", self.top_p))
                  if value is not None}
        return chosen or None


@dataclass(frozen=True)
class ImageRequest:
    """One image request: ``n`` rows of one prompt, seeds ``seed``, ``seed + 1``, ... (random when
    unset); ``partial_images`` to send before each image (0 unless streamed)."""

    prompt: str
    n: int = 1
    seed: Optional[int] = None
    method: Optional[str] = None
    cfg_scale: Optional[float] = None
    sampling: Sampling = Sampling()
    negative_prompt: Optional[str] = None
    size: Optional[str] = None  # "WIDTHxHEIGHT"; None or "auto": the model's own
    partial_images: int = 0
    coupling: Optional[str] = None  # "rejection" or "gumbel"; None: the model's

    @classmethod
    def from_request(cls, body: ImageGenerationRequest) -> "ImageRequest":
        return cls(prompt=body.prompt, n=body.n, seed=body.seed, method=body.method, cfg_scale=body.cfg_scale,
                   sampling=Sampling(body.temperature, body.top_k, body.top_p), negative_prompt=body.negative_prompt,
                   size=body.size, partial_images=body.partial_images if body.stream else 0, coupling=body.coupling)


@dataclass(frozen=True)
class ChatRequest:
    """One chat: Hugging Face chat messages whose ``{"type": "image"}`` parts take ``images`` in
    order; ``max_tokens`` None: the model's default within the server's limit."""

    messages: tuple[dict[str, Any], ...]
    images: tuple["Image.Image", ...] = ()
    seed: Optional[int] = None
    method: Optional[str] = None
    sampling: Sampling = Sampling()
    max_tokens: Optional[int] = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    coupling: Optional[str] = None  # "rejection" or "gumbel"; None: the model's

    @classmethod
    def from_request(cls, body: ChatCompletionRequest, messages: list[dict[str, Any]], images: list["Image.Image"]) -> "ChatRequest":
        """``body``'s settings with its messages and images as the ingress read them."""
        return cls(messages=tuple(messages), images=tuple(images), seed=body.seed, method=body.method,
                   sampling=Sampling(body.temperature, body.top_k, body.top_p), max_tokens=body.new_tokens(),
                   stop=body.stop_strings(), stream=body.stream, coupling=body.coupling)


# -- events ------------------------------------------------------------------------------------------


class RowResult(Protocol):
    """What a finished row's result (an ImageResult, a CaptionResult) tells of its decoding."""

    @property
    def seed(self) -> int: ...

    @property
    def target_forwards(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def tokens_per_forward(self) -> float: ...

    @property
    def latency_s(self) -> float: ...

    @property
    def accepted_lengths(self) -> list[int]: ...


@dataclass(frozen=True)
class RowStats:
    """A finished row's decoding statistics, as ``usage`` reports them."""

    target_forwards: int
    tokens: int
    tokens_per_forward: float
    accepted_lengths: tuple[int, ...]
    seed: int
    decode_s: float

    @classmethod
    def of(cls, result: RowResult) -> "RowStats":
        return cls(target_forwards=result.target_forwards, tokens=result.num_tokens,
                   tokens_per_forward=round(result.tokens_per_forward, 4), accepted_lengths=tuple(result.accepted_lengths),
                   seed=result.seed, decode_s=round(result.latency_s, 4))

    def usage(self) -> dict[str, Any]:
        return {"target_forwards": self.target_forwards, "tokens": self.tokens, "tokens_per_forward": self.tokens_per_forward,
                "accepted_lengths": list(self.accepted_lengths), "seed": self.seed, "decode_s": self.decode_s}


@dataclass(frozen=True)
class RawImage:
    """An image's pixels as the engine made them (PIL mode, size, bytes)."""

    mode: str
    size: tuple[int, int]  # (width, height)
    data: bytes

    @classmethod
    def of(cls, image: "Image.Image") -> "RawImage":
        return cls(image.mode, image.size, image.tobytes())

    def image(self) -> "Image.Image":
        from PIL import Image

        return Image.frombytes(self.mode, self.size, self.data)


@dataclass(frozen=True)
class PartialImage:
    """Image ``index`` as decoded so far (its committed rows), the ``partial_image_index``-th sent."""

    index: int
    partial_image_index: int
    png: Union[bytes, RawImage]  # PNG bytes; raw pixels from the engine process to its replica


@dataclass(frozen=True)
class ImageDone:
    """Image ``index`` finished."""

    index: int
    png: Union[bytes, RawImage]  # PNG bytes; raw pixels from the engine process to its replica
    stats: RowStats


@dataclass(frozen=True)
class TextDelta:
    """The chat answer's next text (held back while it may start a stop string)."""

    text: str


@dataclass(frozen=True)
class ChatDone:
    """The whole chat answer."""

    text: str
    finish_reason: str  # eos, length, stop
    stats: RowStats
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Failed:
    """The request failed (row ``index``): the HTTP status, message and code to answer."""

    index: int
    status: int
    message: str
    code: str


ImageEvent = Union[PartialImage, ImageDone, Failed]
ChatEvent = Union[TextDelta, ChatDone, Failed]
Event = Union[PartialImage, ImageDone, TextDelta, ChatDone, Failed]


@dataclass(frozen=True)
class ModelInfo:
    """What the API needs to know of a served model; ``size`` (its own, what "auto" gives) and
    ``sizes`` (those it makes, in words) for text-to-image models."""

    task: str
    method: str
    pid: int
    size: Optional[str] = None
    sizes: Optional[str] = None
