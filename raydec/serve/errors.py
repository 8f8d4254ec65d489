"""Errors in OpenAI's envelope: ``{"error": {"message", "type", "param", "code"}}``.

Bad input is a 4xx naming the field; only a fault of the server is a 5xx.
"""

from __future__ import annotations

from typing import Any, Optional

from raydec.validation import text_problem

# status -> OpenAI's error type
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    408: "timeout_error", 413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
    500: "server_error", 503: "service_unavailable_error",
}


class APIError(Exception):
    """An answer other than success: HTTP status, message, the request field at fault (param)
    and a short code; headers such as Retry-After."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
                      "param": param, "code": code}}


def _field_path(loc: Any) -> list[str]:
    """A pydantic error's location as the request's field path: union members' labels
    (``function-after[...]``, ``list[...]``) and a tagged union's tag (the part before the field
    of the same name) dropped."""
    parts = [str(part) for part in loc if not (isinstance(part, str) and "[" in part)]
    parts = parts[1:] if parts[:1] == ["body"] else parts
    return [part for i, part in enumerate(parts) if i + 1 == len(parts) or parts[i + 1] != part]


def validation_error(errors: list[dict[str, Any]]) -> APIError:
    """A 400 from pydantic / FastAPI validation errors: the first one's field and message. Where
    a value could take several forms (a union), the errors of the forms its type does not have
    ("should be a valid string") give way to the error of the form it has."""
    relevant = [e for e in errors if not str(e.get("type", "")).endswith("_type")] or errors
    errors = relevant if len(relevant) < len(errors) else errors
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    param = ".".join(_field_path(first.get("loc", ()))) or None
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    value = first.get("input")
    if first.get("type") == "string_unicode" and isinstance(value, str):  # a length check met the surrogate first
        message = text_problem(value) or message
    shown = repr(value)
    if first.get("type") == "missing":
        text = f"{param}: a required field is missing"
    elif first.get("type") == "extra_forbidden":
        text = f"{param}: unknown field"
    else:
        text = f"{param or 'body'}: {message}" + (f" (got {shown[:80]})" if value is not None and len(shown) < 400 else "")
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return APIError(400, text + more, param=param, code="invalid_value")
