"""Errors the server answers with, in the shape each wire format's clients read.

OpenAI clients read `{"error": {"message", "type", "param", "code"}}`; text-embeddings-inference clients
read `{"error": "...", "error_type": "..."}`; Cohere's rerank clients (the Cohere-style /v1/rerank and
/v2/rerank) read `{"message": "..."}`. `param` (and OpenAI's `code`) names the limit that was hit or
the field at fault; the message says it too.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

# The paths that copy text-embeddings-inference (its error shape); "/" is TEI's root route (= /embed).
TEI_PATHS = ("/", "/embed", "/embed_sparse", "/tokenize", "/info", "/rerank")
# The paths that copy Cohere's rerank API (its error shape: a `message`).
COHERE_PATHS = ("/v1/rerank", "/v2/rerank")
_TEI_TYPES = {
    400: "Validation",
    401: "Unauthorized",
    403: "Unauthorized",  # a Host or Origin the server refuses (http_guard)
    413: "Validation",
    415: "Validation",
    422: "Validation",
    503: "Overloaded",
}
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    503: "overloaded_error",
}


class ApiError(Exception):
    """An answer other than 200: status, message, the limit or parameter at fault, extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        tei_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}
        self.tei_type = tei_type  # TEI's error_type when it is not the status's usual one ("Empty")


def error_body(
    path: str, status: int, message: str, param: str | None = None, tei_type: str | None = None
) -> dict[str, Any]:
    """The JSON body of an error on `path`."""
    if path in TEI_PATHS:
        body: dict[str, Any] = {"error": message, "error_type": tei_type or _TEI_TYPES.get(status, "Backend")}
        if param:
            body["param"] = param
        return body
    if path in COHERE_PATHS:
        return {"message": message, **({"param": param} if param else {})}
    return {
        "error": {
            "message": message,
            "type": _OPENAI_TYPES.get(status, "server_error"),
            "param": param,
            "code": param,
        }
    }


def error_response(
    path: str,
    status: int,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    tei_type: str | None = None,
) -> JSONResponse:
    """A JSON error response (also an ASGI app: middlewares answer with it directly)."""
    body = error_body(path, status, message, param, tei_type)
    return JSONResponse(body, status_code=status, headers=headers)


def api_error_response(path: str, err: ApiError) -> JSONResponse:
    return error_response(path, err.status, err.message, err.param, err.headers, err.tei_type)


def empty_input(field: str) -> ApiError:
    """An empty list of texts: 400 as OpenAI's API and text-embeddings-inference answer it (TEI's
    `ErrorType::Empty`, message "`inputs` cannot be empty"), not an empty 200."""
    return ApiError(400, f"`{field}` cannot be empty: send at least one text", param=field, tei_type="Empty")
