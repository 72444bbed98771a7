"""What the API server's refusals mean to the reconciler.

Each write in kube.py turns an ApiException into one of three outcomes: Conflict (read
again), Rejected (the object can never be taken as written: the job's spec is at fault),
Refused (it may pass: a quota, RBAC, a webhook, a name still held); anything else is
`transient` or re-raised. Pure: only the client's exception type is read.
"""

import json

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from trainwave.kube.leadership import NotLeading

__all__ = [
    "Conflict",
    "Refused",
    "Rejected",
    "malformed",
    "refusal",
    "status_message",
    "transient",
    "undecodable",
]


class Conflict(Exception):
    """The object changed since it was read; reconcile again from a fresh read."""


class Rejected(Exception):
    """The API server refused an object as invalid (HTTP 422)."""


class Refused(Exception):
    """The API server refused to create a child for a reason that may pass (a quota,
    RBAC, an admission webhook): `what` names the object, `message` is the server's."""

    def __init__(self, what: str, message: str):
        super().__init__(f"{what}: {message}")
        self.what = what
        self.message = message


# Server-side apply answers an object that does not fit its type's schema (a field
# not declared, a wrong type, a duplicate list key, a quantity that does not parse)
# with HTTP 500, not 4xx (kubernetes/kubernetes#139253, #122480). These messages
# say so: the same object can never be applied, unlike after a real server fault.
_MALFORMED = ("failed to create typed patch object", "failed to convert new object")


def malformed(error: ApiException) -> bool:
    """The API server could not read the object we applied as its type: never retry it."""
    return error.status in (400, 500) and status_message(error).startswith(_MALFORMED)


# What kube-apiserver answers, with HTTP 400, to a create whose body does not decode as
# its kind (apimachinery runtime.NewStrictDecodingError and the JSON decoder's errors,
# wrapped by the handlers' "<kind> in version ... cannot be handled as a <kind>").
_UNDECODABLE = " cannot be handled as a "


def refusal(error: ApiException, what: str, *, unreadable: bool) -> Exception | None:
    """How a write of child `what` the API server refused reaches the reconciler: Rejected
    when the object cannot be taken as written (422, or `unreadable`: it did not decode),
    Refused when the refusal may pass (a quota, RBAC, a webhook, a missing namespace),
    None for anything else (the caller re-raises it)."""
    if error.status == 422 or unreadable:
        return Rejected(status_message(error))
    if error.status in (400, 403, 404):
        return Refused(what, status_message(error))
    return None


def undecodable(error: ApiException) -> bool:
    """The API server could not read the object we created as its kind: never retry it."""
    return error.status == 400 and _UNDECODABLE in status_message(error)


def transient(error: BaseException) -> bool:
    """An error that says nothing about the job: the API server busy, restarting, slow or
    out of reach. Retried with backoff and logged; never written on the job as its fault."""
    if isinstance(error, ApiException):
        status = error.status or 0  # 0: no answer at all
        return status in (0, 408, 409, 429) or status >= 500
    # A write refused because this replica lost the Lease is the operator's state, not the
    # job's fault (the process is on its way out; kube/leadership.py).
    return isinstance(error, OSError | HTTPError | NotLeading)  # Timeout/ConnectionError too


def status_message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "").get("message", error.reason))
    except (TypeError, ValueError):
        return str(error.reason)
