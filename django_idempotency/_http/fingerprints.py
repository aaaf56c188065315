"""The request fingerprint: what makes a retry "the same request".

SHA-256 over the method, the path with its query string, the scope and the body. JSON bodies are
canonicalised first (:mod:`._canonical_json`), so key order and whitespace do not matter; a
``multipart/form-data`` POST counts by its fields and files, not its random part boundary; other
bodies count byte for byte. The body is read within Django's limit (:mod:`._bodies`).

:func:`json_fingerprint` makes one that also leaves out named parts of the body.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from django.http import HttpRequest, QueryDict

from django_idempotency._conf.settings import FingerprintFunction
from django_idempotency._http import bodies
from django_idempotency._http.canonical_json import Pointer, canonical_json

__all__ = ["json_fingerprint", "request_fingerprint"]


def request_fingerprint(request: HttpRequest, scope: str) -> str:
    """The default ``FINGERPRINT_FUNCTION``."""
    return _fingerprint(request, scope)


@dataclass(frozen=True, repr=False)
class _JSONFingerprint:
    exclude: tuple[str, ...]
    pointers: tuple[Pointer, ...]
    #: The single-token pointers: the form fields left out of form bodies.
    fields: frozenset[str]

    def __call__(self, request: HttpRequest, scope: str) -> str:
        return _fingerprint(request, scope, self.pointers, self.fields)

    def __repr__(self) -> str:
        return f"json_fingerprint(exclude={list(self.exclude)!r})"


def json_fingerprint(exclude: Iterable[str]) -> FingerprintFunction:
    """A fingerprint function that leaves out the parts of the body ``exclude`` names.

    For a view whose body carries volatile values (a client timestamp, a nonce, a signature),
    so an honest retry is not refused as another request. Each entry is a JSON Pointer
    (RFC 6901): ``"/sent_at"``, ``"/meta/nonce"``, ``"/items/0/token"``, with ``~1`` for ``/``
    and ``~0`` for ``~`` in names. An object's member is left out wherever it is absent or
    present; an array's element keeps its place, so the array's length still counts. For form
    bodies (URL-encoded or multipart) a one-token pointer names a field: ``"/sent_at"`` leaves
    out the ``sent_at`` field (and file). Everything else is as :func:`request_fingerprint`
    (method, path and query, scope, canonical JSON; a body that is not JSON or a form counts
    byte for byte); a JSON or multipart body without the excluded parts
    fingerprints as it does there (a URL-encoded one counts by fields, in name order, when a
    pointer names a field). Use it as a view's ``fingerprint=`` or as ``FINGERPRINT_FUNCTION``;
    a bad pointer is a ``ValueError`` here, when the view is defined.
    """
    if isinstance(exclude, str):
        raise TypeError("exclude must be a list of JSON Pointers, not a string.")
    given = tuple(exclude)
    pointers = tuple(_pointer(text) for text in given)
    fields = frozenset(pointer[0] for pointer in pointers if len(pointer) == 1)
    return _JSONFingerprint(given, pointers, fields)


def _pointer(text: object) -> Pointer:
    """RFC 6901's reference tokens of a pointer; the whole document ("") cannot be left out."""
    if not isinstance(text, str) or not text.startswith("/"):
        raise ValueError(f"{text!r} is not a JSON Pointer: one starts with '/', e.g. '/sent_at'.")
    tokens = text[1:].split("/")
    for token in tokens:
        if "~" in token.replace("~0", "").replace("~1", ""):
            raise ValueError(f"{text!r} is not a JSON Pointer: '~' must be '~0' or '~1'.")
    # RFC 6901 section 4: ~1 first, so "~01" is "~1" and not "/".
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in tokens)


def _fingerprint(
    request: HttpRequest,
    scope: str,
    pointers: tuple[Pointer, ...] = (),
    fields: frozenset[str] = frozenset(),
) -> str:
    # Method, path and scope, each ended by a NUL (one update: the same bytes as three).
    head = f"{request.method or ''}\0{full_path(request)}\0{scope}\0"
    digest = hashlib.sha256(head.encode("utf-8", "surrogatepass"))
    if bodies.is_form_upload(request):
        digest.update(b"form\0")
        bodies.feed_form(digest, request, fields)
        return digest.hexdigest()
    body = bodies.body(request)
    if body and fields and _is_urlencoded(request):
        # By field, as Django parses it: a byte-for-byte hash cannot leave a field out.
        digest.update(b"urlencoded\0")
        bodies.feed_fields(digest, QueryDict(body, encoding=request.encoding), fields)
        return digest.hexdigest()
    if body and _is_json(request.content_type or ""):
        canonical = canonical_json(body, pointers)
        if canonical is not None:
            # Tagged apart from raw bodies: "[]" as text is not " []" as JSON.
            digest.update(b"json\0")
            digest.update(canonical)
            return digest.hexdigest()
    digest.update(b"body\0")
    digest.update(body)
    return digest.hexdigest()


def canonical_body(content_type: str, body: bytes) -> bytes:
    """The body as fingerprinted: canonical JSON for JSON media types, else the bytes."""
    if body and _is_json(content_type):
        canonical = canonical_json(body)
        return body if canonical is None else canonical
    return body


def _is_urlencoded(request: HttpRequest) -> bool:
    return request.content_type == "application/x-www-form-urlencoded"


def _is_json(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def full_path(request: HttpRequest) -> str:
    """``request.get_full_path()``, made once per request: the identity and the default
    fingerprint both read it, and it quotes the whole path each time."""
    path: str | None = request.__dict__.get(_FULL_PATH)
    if path is None:
        path = request.__dict__[_FULL_PATH] = request.get_full_path()
    return path


_FULL_PATH = "_idempotency_full_path"
