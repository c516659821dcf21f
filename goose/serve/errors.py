"""Errors the server answers with, in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from goose.cycle.verifier import ContextOverflowError
from goose.grammar import GrammarError


class APIError(Exception):
    """An HTTP error answered with an OpenAI-style body; ``param`` names the offending request field."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        kind: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or _KIND_BY_STATUS.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


_KIND_BY_STATUS = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                   429: "rate_limit_error", 503: "server_overloaded"}


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    """A 400; every one has a ``code`` (``invalid_value`` unless a more telling one applies)."""
    return APIError(400, message, param=param, code=code)


def invalid_json(detail: str) -> APIError:
    # jiter names a lone UTF-16 surrogate ("\\ud800" alone) "unexpected end of hex escape"; say what it is
    if "surrogate" in detail or "end of hex escape" in detail:
        detail += " (a \\u escape in D800-DFFF must be one half of a surrogate pair; a lone one is no character)"
    return bad_request(f"the request body is not valid JSON: {detail}", code="invalid_json")


def field_path(location: tuple[int | str, ...]) -> str | None:
    """``("messages", 0, "content")`` -> ``"messages[0].content"`` (None for the body as a whole)."""
    path = ""
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


def from_validation_error(error: ValidationError) -> APIError:
    """The most telling problem pydantic found, as a 400 naming its field."""
    first = max(error.errors(include_url=False), key=_specificity)  # max keeps the first of equals
    location = tuple(part for part in first.get("loc", ()) if not _is_union_branch(part))
    param = field_path(location)
    if first["type"] == "json_invalid":
        return invalid_json(first["msg"].removeprefix("Invalid JSON: "))
    if first["type"] == "model_type" and param is None:
        return bad_request("the request body must be a JSON object", code="invalid_json")
    if first["type"] == "extra_forbidden":
        return bad_request(f"unrecognized request argument supplied: {param}", param=param,
                           code="unknown_parameter")
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        message = "this field is required"
    return bad_request(f"{param}: {message}" if param else message, param=param, code="invalid_value")


def _specificity(problem: Any) -> tuple[bool, int]:
    # A value that fits no member of a union gets one error per member: a broken rule ("at most 1
    # item") says more than "not a string" from a member it was never meant to be, and a deeper
    # error more than a shallow one ("messages[0].content[0].type" over "messages[0].content").
    depth = sum(1 for part in problem.get("loc", ()) if not _is_union_branch(part))
    return not problem["type"].endswith("_type"), depth


def _is_union_branch(part: int | str) -> bool:
    # pydantic puts the union member it tried ("str", "list[TextPart]", "constrained-int", "literal['auto']")
    # into the location; the user's field path has no such segments
    return isinstance(part, str) and (part in {"str", "int", "float", "bool", "dict", "list"} or "[" in part
                                      or part.startswith(("constrained-", "function-")))


def rejection(error: ValueError, endpoint: str, sampled: bool) -> APIError:
    """A 400 for a request the decoder refused before its first token, naming the field when it can."""
    if isinstance(error, ContextOverflowError):
        return bad_request(str(error), param="messages" if endpoint == "chat" else "prompt",
                           code="context_length_exceeded")
    if isinstance(error, ValidationError):
        return from_validation_error(error)
    if isinstance(error, GrammarError):
        return bad_request(f"response_format: {error}", param="response_format")
    return bad_request(str(error), param="temperature" if sampled and "sampl" in str(error) else None)
