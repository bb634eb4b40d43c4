"""Errors as kube-apiserver writes them: an HTTP status and a metav1 ``Status`` body
(``kind: Status``, ``status: Failure``, ``message``, ``reason``, ``code``, ``details``), which
the Python client turns into ``ApiException(status=code)`` and kubectl prints as
``Error from server (Reason): message``."""

from __future__ import annotations

from typing import Any

from boltforge.testing.kubeapi.resources import Resource

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
STALE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


class ApiError(Exception):
    """An answer other than success: ``code`` is the HTTP status, ``status()`` the body."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details or {}

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def success(code: int = 200, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``Status`` of success (what a binding, an eviction or some deletes answer)."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
    body["status"] = "Success"
    if details:
        body["details"] = details
    body["code"] = code
    return body


def _details(res: Resource, name: str) -> dict[str, Any]:
    details = {"name": name, "kind": res.plural}
    if res.group:
        details["group"] = res.group
    return details


def not_found(res: Resource, name: str) -> ApiError:
    return ApiError(404, f'{res.qualified} "{name}" not found', "NotFound", _details(res, name))


def already_exists(res: Resource, name: str) -> ApiError:
    message = f'{res.qualified} "{name}" already exists'
    return ApiError(409, message, "AlreadyExists", _details(res, name))


def conflict(res: Resource | str, name: str, why: str = STALE) -> ApiError:
    """409 Conflict; ``res`` may be a subresource's name such as ``pods/binding``."""
    what = res.qualified if isinstance(res, Resource) else res
    details = {"name": name, "kind": res.plural if isinstance(res, Resource) else res}
    return ApiError(409, f'Operation cannot be fulfilled on {what} "{name}": {why}', None, details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, message, "BadRequest")


def invalid(res: Resource, name: str, why: str) -> ApiError:
    group = f".{res.group}" if res.group else ""
    message = f'{res.kind}{group} "{name}" is invalid: {why}'
    return ApiError(422, message, "Invalid", {**_details(res, name), "kind": res.kind})


def unsupported_media(content_type: str) -> ApiError:
    message = (
        f"the body of the request was in an unknown format ({content_type}) - accepted media "
        "types include: application/json-patch+json, application/merge-patch+json, "
        "application/strategic-merge-patch+json"
    )
    return ApiError(415, message, "UnsupportedMediaType")
