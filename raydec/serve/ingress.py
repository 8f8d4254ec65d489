"""The HTTP ingress: OpenAI's routes over the model replicas.

    GET  /health                    200 once every model answers (503 before)
    GET  /v1/models, /v1/models/{id}
    POST /v1/images/generations     text-to-image (SJD-PAC ...), SSE partial images when streamed
    POST /v1/chat/completions       vision chat (ViSpec ...), SSE chunks when streamed
    GET  /v1/raydec/stats           per-model engine and speculation totals

Every answer other than success is OpenAI's error envelope. Requests are checked here (schema,
limits, keys, media) before a replica sees them; a replica's own refusal (a prompt too long for
the model, ...) comes back as its 4xx. Overload (a model's replicas and their queues full) is a
503 with Retry-After; a replica that dies mid-request is a 503 too; past the request timeout a
408.
"""


import asyncio
import base64
import json
import logging
import sys
import time
import uuid
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayError, RayTaskError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.exceptions import HTTPException as StarletteHTTPException

from raydec.serve.boundary import ChatDone, ChatRequest, Event, Failed, ImageDone, ImageRequest, ModelInfo, PartialImage, RowStats, TextDelta
from raydec.serve.config import ServeConfig
from raydec.serve.errors import APIError, validation_error
from raydec.serve.media import MediaError, check_image_count, load_image_url
from raydec.serve.protocol import ChatCompletionRequest, ImageGenerationRequest, ImagePart, TextPart
from raydec.serve.request_guard import CLIENT_GONE, RequestGuard, answer

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup
else:  # the backport anyio depends on
    from exceptiongroup import BaseExceptionGroup

logger = logging.getLogger("raydec.serve")

app = FastAPI(
    title="raydec",
    description="OpenAI-compatible image generation (SJD-PAC) and vision chat (ViSpec) with lossless speculative decoding.",
    version="1",
)


app.add_middleware(RequestGuard)


@app.exception_handler(APIError)
async def _api_error(_request: Request, error: APIError) -> JSONResponse:
    return answer(error)


@app.exception_handler(RequestValidationError)
async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
    return answer(validation_error(list(error.errors())))


@app.exception_handler(StarletteHTTPException)
async def _http_error(_request: Request, error: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
    message = "no such route" if error.status_code == 404 else str(error.detail)
    return answer(APIError(error.status_code, message, code=code))


@app.exception_handler(Exception)
async def _unexpected(request: Request, error: Exception) -> Response:
    if _client_gone(error):  # nobody is left to answer
        logger.info("a client left during %s %s", request.method, request.url.path)
        return Response(status_code=499)
    logger.exception("unexpected error")
    return answer(APIError(500, f"internal error: {type(error).__name__}", code="internal_error"))


def _client_gone(error: BaseException) -> bool:
    """The error says only that the client left (possibly inside a task group's exception group)."""
    if isinstance(error, BaseExceptionGroup) and error.exceptions:
        return all(_client_gone(e) for e in error.exceptions)
    return isinstance(error, CLIENT_GONE)


def _sse(data: Any, event: Optional[str] = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data) if not isinstance(data, str) else data}\n\n".encode()


FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


async def with_deadline(events: AsyncIterator[Event], seconds: float) -> AsyncIterator[Event]:
    """``events`` until ``seconds`` have passed since the first wait: then a 408 (and ``events``
    is closed, which cancels the request's rows)."""
    deadline = time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            try:
                event = await asyncio.wait_for(events.__anext__(), timeout=left)
            except StopAsyncIteration:
                return
            yield event
    except TimeoutError:
        raise APIError(408, f"the request took more than limits.request_timeout_s={seconds} s", code="timeout") from None
    finally:
        await events.aclose()


@serve.ingress(app)
class Ingress:
    """Routes requests to the model deployments (``models``: name -> the model's deployment, a Serve ``DeploymentHandle``)."""

    def __init__(self, config: ServeConfig, models: dict[str, DeploymentHandle]) -> None:
        logging.getLogger("raydec").setLevel(logging.INFO)
        self.config = config
        self.models = models
        self.info: dict[str, ModelInfo] = {}
        app.state.keys = {key.encode("utf-8") for key in config.keys()}  # read by RequestGuard
        app.state.max_request_bytes = config.limits.max_request_bytes
        app.state.body_timeout_s = config.limits.body_timeout_s
        logger.info("raydec ingress: %d model(s): %s; API keys %s", len(models), ", ".join(models),
                    "required" if app.state.keys else "not required")

    # -- helpers -----------------------------------------------------------------------------------

    def _model(self, name: Optional[str], task: str, param: str = "model") -> str:
        if name is None:
            served = next((m for m in self.config.models if m.task == task), None)
            if served is None:
                raise APIError(404, f"no {'text-to-image' if task == 't2i' else 'vision-language'} model is served", param=param,
                               code="model_not_found")
            return served.name
        served = self.config.model(name)
        if served is None:
            raise APIError(404, f"model {name[:100]!r} does not exist (served: {', '.join(self.models)})", param=param,
                           code="model_not_found")
        if served.task != task:
            route = "/v1/images/generations" if served.task == "t2i" else "/v1/chat/completions"
            raise APIError(400, f"model {name!r} serves {route}", param=param, code="wrong_model_type")
        return name

    async def _info(self, name: str) -> ModelInfo:
        if name not in self.info:
            self.info[name] = await self.models[name].info.remote()
        return self.info[name]

    def _image_events(self, name: str, request: ImageRequest) -> AsyncIterator[Event]:
        return self._events(name, lambda deployment: deployment.generate_images.remote(request))

    def _chat_events(self, name: str, request: ChatRequest) -> AsyncIterator[Event]:
        return self._events(name, lambda deployment: deployment.chat.remote(request))

    async def _events(self, name: str, start: Callable[[DeploymentHandle], DeploymentResponseGenerator]) -> AsyncIterator[Event]:
        """The events of the call ``start`` makes on model ``name``'s deployment, streaming; a ``Failed``
        event and Serve's and Ray's failures as API errors."""
        retry = {"Retry-After": str(self.config.limits.retry_after_s)}
        stream = None
        try:
            stream = start(self.models[name].options(stream=True))
            async for event in stream:
                if isinstance(event, Failed):
                    if event.status == 499:
                        raise APIError(499, "the request was cancelled", code="cancelled")
                    raise APIError(event.status, event.message, code=event.code, headers=retry if event.status == 503 else None)
                yield event
        except (APIError, asyncio.CancelledError):
            raise
        except Exception as error:
            if isinstance(error, BackPressureError):
                raise APIError(503, f"model {name!r} is at capacity (its replicas and queue are full); retry later",
                               code="overloaded", headers=retry) from None
            if isinstance(error, RayTaskError):
                logger.error("model %s failed a request: %s", name, error)
                raise APIError(500, f"model {name!r} failed the request: {type(error.cause).__name__}", code="engine_failed") from None
            if isinstance(error, RayError):
                logger.warning("model %s replica unavailable: %s", name, type(error).__name__)
                raise APIError(503, f"model {name!r}: its replica stopped during the request ({type(error).__name__}); retry",
                               code="replica_unavailable", headers=retry) from None
            raise
        finally:
            if stream is not None:
                try:
                    stream.cancel()  # a request that never started re-raises its refusal here
                except Exception:
                    pass

    def _with_timeout(self, events: AsyncIterator[Event]) -> AsyncIterator[Event]:
        return with_deadline(events, self.config.limits.request_timeout_s)

    # -- routes ------------------------------------------------------------------------------------

    @app.get("/health")
    async def health(self) -> JSONResponse:
        """200 once every model's replica is up."""
        try:
            for name in self.models:
                await asyncio.wait_for(self._info(name), timeout=5.0)
        except Exception as error:
            return answer(APIError(503, f"not ready: {type(error).__name__}", code="not_ready"))
        return JSONResponse({"status": "ok", "models": list(self.models)})

    @app.get("/v1/models")
    async def list_models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self._card(m.name) for m in self.config.models]}

    @app.get("/v1/models/{model:path}")
    async def get_model(self, model: str) -> dict[str, Any]:
        if self.config.model(model) is None:
            raise APIError(404, f"model {model[:100]!r} does not exist", param="model", code="model_not_found")
        return self._card(model)

    def _card(self, name: str) -> dict[str, Any]:
        served = self.config.model(name)
        return {"id": name, "object": "model", "created": 0, "owned_by": "raydec", "task": served.task,
                "method": served.decode.method}

    @app.get("/v1/raydec/stats")
    async def stats(self) -> dict[str, Any]:
        """Per model: engine steps, mean batch size, speculation totals (one replica's view)."""
        return {name: await deployment.stats.remote() for name, deployment in self.models.items()}

    @app.post("/v1/images/generations")
    async def images(self, body: ImageGenerationRequest) -> Any:
        limits = self.config.limits
        name = self._model(body.model, "t2i")
        if body.response_format == "url":
            raise APIError(400, "response_format 'url' is not supported (nothing is stored); use 'b64_json'",
                           param="response_format", code="unsupported_value")
        if body.n > limits.max_n:
            raise APIError(400, f"n: {body.n} is more than limits.max_n={limits.max_n}", param="n", code="invalid_value")
        if len(body.prompt) > limits.max_prompt_chars:
            raise APIError(400, f"prompt: {len(body.prompt)} characters, more than limits.max_prompt_chars={limits.max_prompt_chars}",
                           param="prompt", code="invalid_value")
        if not body.prompt.strip():
            raise APIError(400, "prompt: is blank", param="prompt", code="invalid_value")
        info = await self._info(name)
        size = info.size if body.size in (None, "auto") else body.size  # the replica refuses one the model cannot make
        created = int(time.time())
        events = self._with_timeout(self._image_events(name, ImageRequest.from_request(body)))
        if body.stream:
            return await self._stream(events, lambda event: self._image_event(event, created, size))
        images: list[Optional[ImageDone]] = [None] * body.n
        async for event in events:
            if isinstance(event, ImageDone):
                images[event.index] = event
        done = [image for image in images if image is not None]
        if len(done) < body.n:  # the replica ended the stream early (it cannot, short of a fault)
            raise APIError(500, f"model {name!r} returned {len(done)} of {body.n} images", code="engine_failed")
        data = [{"b64_json": base64.b64encode(image.png).decode(), "revised_prompt": None} for image in done]
        return {"created": created, "data": data, "output_format": "png", "size": size,
                "usage": self._image_usage([image.stats for image in done])}

    @staticmethod
    def _image_usage(stats: list[RowStats]) -> dict[str, Any]:
        output = sum(s.tokens for s in stats)
        return {"input_tokens": 0, "input_tokens_details": {"image_tokens": 0, "text_tokens": 0}, "output_tokens": output,
                "total_tokens": output, "images": [s.usage() for s in stats]}

    def _image_event(self, event: Event, created: int, size: Optional[str]) -> Optional[bytes]:
        match event:
            case PartialImage(index, partial_image_index, png):
                kind = "image_generation.partial_image"
                return _sse({"type": kind, "partial_image_index": partial_image_index, **self._image_fields(png, index, created, size)},
                            kind)
            case ImageDone(index, png, stats):
                kind = "image_generation.completed"
                return _sse({"type": kind, "usage": self._image_usage([stats]), **self._image_fields(png, index, created, size)}, kind)
        return None

    @staticmethod
    def _image_fields(png: bytes, index: int, created: int, size: Optional[str]) -> dict[str, Any]:
        return {"b64_json": base64.b64encode(png).decode(), "created_at": created, "size": size, "quality": "auto",
                "background": "opaque", "output_format": "png", "index": index}

    async def _stream(self, events: AsyncIterator[Event], render: Callable[[Event], Optional[bytes]],
                      done: Optional[bytes] = None) -> StreamingResponse:
        """SSE from ``events``: the first event is awaited here, so a request refused before it
        starts still gets its status; a failure later is an error event."""
        try:
            first = await events.__anext__()
        except StopAsyncIteration:
            first = None

        async def body() -> AsyncIterator[bytes]:
            try:
                if first is not None:
                    chunk = render(first)
                    if chunk:
                        yield chunk
                    async for event in events:
                        chunk = render(event)
                        if chunk:
                            yield chunk
                if done:
                    yield done
            except APIError as error:
                yield _sse(error.body())
            finally:
                await events.aclose()

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/chat/completions")
    async def chat(self, body: ChatCompletionRequest) -> Any:
        limits = self.config.limits
        name = self._model(body.model, "caption")
        max_tokens = body.new_tokens()
        if max_tokens is not None and max_tokens > limits.max_tokens:
            field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
            raise APIError(400, f"{field}: {max_tokens} is more than limits.max_tokens={limits.max_tokens}", param=field,
                           code="invalid_value")
        stop = body.stop_strings()
        if len(stop) > 4 or any(not s for s in stop):
            raise APIError(400, "stop: up to 4 non-empty strings", param="stop", code="invalid_value")
        messages, images = await self._chat_inputs(body)
        created, completion = int(time.time()), f"chatcmpl-{uuid.uuid4().hex}"
        events = self._with_timeout(self._chat_events(name, ChatRequest.from_request(body, messages, images)))
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            head = {"id": completion, "object": "chat.completion.chunk", "created": created, "model": name}
            role_sent = False

            def render(event: Event) -> Optional[bytes]:
                nonlocal role_sent
                match event:
                    case TextDelta(text):
                        delta = {"content": text} if role_sent else {"role": "assistant", "content": text}
                        role_sent = True
                        return _sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}]})
                    case ChatDone():
                        delta = {} if role_sent else {"role": "assistant", "content": ""}
                        last = _sse({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                           "finish_reason": FINISH_REASONS.get(event.finish_reason, "stop")}]})
                        if usage:
                            last += _sse({**head, "choices": [], "usage": self._chat_usage(event)})
                        return last
                return None

            return await self._stream(events, render, done=_sse("[DONE]"))
        answer: Optional[ChatDone] = None
        async for event in events:
            if isinstance(event, ChatDone):
                answer = event
        if answer is None:  # the replica ended the stream without its answer (it cannot, short of a fault)
            raise APIError(500, f"model {name!r} returned no answer", code="engine_failed")
        return {
            "id": completion, "object": "chat.completion", "created": created, "model": name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text}, "logprobs": None,
                         "finish_reason": FINISH_REASONS.get(answer.finish_reason, "stop")}],
            "usage": self._chat_usage(answer),
        }

    @staticmethod
    def _chat_usage(answer: ChatDone) -> dict[str, Any]:
        return {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens,
                "total_tokens": answer.prompt_tokens + answer.completion_tokens, **answer.stats.usage()}

    async def _chat_inputs(self, body: ChatCompletionRequest) -> tuple[list[dict[str, Any]], list[Any]]:
        """OpenAI messages -> Hugging Face chat messages (an image part becomes {"type": "image"}) and
        the images, read and checked (off the event loop)."""
        limits, media = self.config.limits, self.config.media
        if len(body.messages) > limits.max_messages:
            raise APIError(400, f"messages: {len(body.messages)} messages, more than limits.max_messages={limits.max_messages}",
                           param="messages", code="invalid_value")
        messages, urls, chars = [], [], 0
        for m, message in enumerate(body.messages):
            parts = [TextPart.model_construct(type="text", text=message.content)] if isinstance(message.content, str) else message.content
            content: list[dict[str, Any]] = []
            for p, part in enumerate(parts):
                match part:
                    case TextPart(text=text):
                        content.append({"type": "text", "text": text})
                        chars += len(text)
                    case ImagePart(image_url=image_url):
                        content.append({"type": "image"})
                        urls.append((image_url.url, f"messages[{m}].content[{p}].image_url.url"))
            messages.append({"role": message.role, "content": content})
        if chars > limits.max_prompt_chars:
            raise APIError(400, f"messages: {chars} characters of text, more than limits.max_prompt_chars={limits.max_prompt_chars}",
                           param="messages", code="invalid_value")
        try:
            check_image_count(len(urls), media, param="messages")
        except MediaError as error:
            raise APIError(error.status, str(error), param=error.param, code=error.code) from None
        images = []
        for url, param in urls:
            try:
                images.append(await asyncio.to_thread(load_image_url, url, media, param=param))
            except MediaError as error:
                raise APIError(error.status, str(error), param=error.param, code=error.code) from None
        return messages, images
