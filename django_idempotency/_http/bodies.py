"""Reading a request's body for the fingerprint, and leaving it readable for the view.

The body is read only when the claim is due: after the framework's authentication and
permissions (a request they refuse is not read at all), and only up to Django's own limit:

- A body is read whole as ``request.body``, as the view would, and no larger than
  ``DATA_UPLOAD_MAX_MEMORY_SIZE``: one whose ``Content-Length`` (or, on ASGI, whose buffered
  size) is over it is refused before a byte is read, one of unknown length once one byte past
  it has been read (:class:`BodyTooLarge`, answered ``413``). Nothing is spooled to disk, so
  no file outlives its request.
- A ``multipart/form-data`` POST is fingerprinted from ``request.POST`` and ``request.FILES``,
  parsed by Django's upload handlers (so file fields are not held whole either, and
  ``DATA_UPLOAD_MAX_MEMORY_SIZE`` does not apply to them, as in Django), one file's chunks at a
  time; Django closes their temporary files with the request. The random part boundary does
  not count, and this works after ``CsrfViewMiddleware`` or ``csrf_protect`` has parsed the
  form already.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from io import BytesIO
from typing import IO, Protocol, cast

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpRequest, QueryDict, UnreadablePostError
from django.http.multipartparser import MultiPartParserError
from django.http.request import RawPostDataException

CHUNK_SIZE = 64 * 1024

#: What Django raises for a body it cannot read or parse: a multipart body without a boundary,
#: more fields or files than Django allows, a body cut short. The client's error, not the
#: project's: the app answers it ``400 invalid-request-body``, as its own problem, and claims
#: nothing. A body over the limit (``RequestDataTooBig``) is answered ``413``.
UNREADABLE = (
    MultiPartParserError,
    TooManyFieldsSent,
    TooManyFilesSent,
    UnreadablePostError,
)


class BodyTooLarge(RequestDataTooBig):
    """A keyed body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``: refused before it is read."""


class Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


def is_form_upload(request: HttpRequest) -> bool:
    """Whether Django parses this body into ``request.POST`` and ``request.FILES``."""
    return request.method == "POST" and request.content_type == "multipart/form-data"


def read_when_asked(request: HttpRequest) -> None:
    """Read nothing now; make the first read of the body, by whoever makes it, read it whole
    (within the limit) and keep it for the fingerprint.

    For DRF, whose ``SessionAuthentication`` parses the body through its own parsers for the
    CSRF check, inside authentication, before the key is claimed: the body must still be there
    for the fingerprint then, but a request DRF refuses must not be read. A form upload is left
    to Django's upload handlers, which keep it in ``request.POST`` and ``request.FILES``.
    """
    if hasattr(request, "_body") or request._read_started or is_form_upload(request):  # type: ignore[attr-defined]
        return
    request._stream = _ReadWhenAsked(request)  # type: ignore[assignment]


def body(request: HttpRequest) -> bytes:
    """The raw body, read whole and kept as ``request.body``, within the limit.

    Raises :class:`BodyTooLarge` over ``DATA_UPLOAD_MAX_MEMORY_SIZE``, before reading when the
    length is known, and ``RawPostDataException`` when someone else consumed the stream.
    """
    if hasattr(request, "_body"):
        return request.body
    if request._read_started:  # type: ignore[attr-defined]
        raise RawPostDataException(
            "The request body was read before the Idempotency-Key could be checked."
        )
    stream: IO[bytes] = request._stream
    if isinstance(stream, _ReadWhenAsked):
        stream = stream.stream
    return _take(request, stream)


class _ReadWhenAsked:
    """The request's stream until its first read, which reads the body whole (:func:`body`)."""

    def __init__(self, request: HttpRequest) -> None:
        self.request = request
        self.stream: IO[bytes] = request._stream

    def _loaded(self) -> IO[bytes]:
        request = self.request
        if request._stream is cast(object, self):
            _take(request, self.stream)
        return request._stream

    def read(self, *args: int) -> bytes:
        return self._loaded().read(*args)

    def readline(self, *args: int) -> bytes:
        return self._loaded().readline(*args)

    def seekable(self) -> bool:
        """Not until read: Django 6.1's ``request.body`` asks, to measure a seekable stream's
        size before reading it."""
        return False

    def close(self) -> None:
        self.stream.close()


def _take(request: HttpRequest, stream: IO[bytes]) -> bytes:
    """Read ``stream`` whole into ``request.body``, as Django's ``request.body`` does, and no
    further than the limit (Django's own reads a body of unknown length whole before its
    latest releases)."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    _refuse_over(limit, _declared_length(request, stream))
    request._read_started = True  # type: ignore[attr-defined]
    try:
        data = stream.read() if limit is None else _read_at_most(stream, limit + 1)
    except OSError as exc:
        raise UnreadablePostError(*exc.args) from exc
    finally:
        stream.close()
    _refuse_over(limit, len(data))
    request._body = data
    request._stream = BytesIO(data)
    return data


def _read_at_most(stream: IO[bytes], size: int) -> bytes:
    """Up to ``size`` bytes: a WSGI server's input may return fewer than asked before its end."""
    parts: list[bytes] = []
    while size > 0 and (chunk := stream.read(min(size, CHUNK_SIZE))):
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)


def _refuse_over(limit: int | None, length: int) -> None:
    if limit is not None and length > limit:
        raise BodyTooLarge(
            f"The request body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE ({limit:,} bytes)."
        )


def _declared_length(request: HttpRequest, stream: IO[bytes]) -> int:
    """The body's length as far as it is known before reading: ``Content-Length``, or the
    size of a seekable stream (on ASGI, Django has buffered the whole body already)."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if hasattr(stream, "seekable") and stream.seekable():
        length = max(length, stream.seek(0, os.SEEK_END))
        stream.seek(0)
    return length


def feed_form(digest: Digest, request: HttpRequest, exclude: Collection[str] = ()) -> None:
    """Feed a parsed ``multipart/form-data`` body: fields and files by name, files by content;
    those named in ``exclude`` left out.

    A small body is read first, so that ``request.body`` stays readable as before.
    """
    if not request._read_started and _fits_in_memory(request):  # type: ignore[attr-defined]
        body(request)
    feed_fields(digest, request.POST, exclude)
    for name, uploads in sorted(request.FILES.lists()):
        if name in exclude:
            continue
        for upload in uploads:
            _feed_text(digest, b"U", name, upload.name or "", upload.content_type or "")
            digest.update((upload.size or 0).to_bytes(8, "big"))
            for chunk in upload.chunks(CHUNK_SIZE):
                digest.update(chunk)
            upload.seek(0)


def feed_fields(digest: Digest, fields: QueryDict, exclude: Collection[str] = ()) -> None:
    """Feed form fields by name, in name order, those named in ``exclude`` left out."""
    for name, values in sorted(fields.lists()):
        if name in exclude:
            continue
        for value in values:
            _feed_text(digest, b"F", name, value)


def _feed_text(digest: Digest, tag: bytes, *texts: str) -> None:
    digest.update(tag)
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)


def _fits_in_memory(request: HttpRequest) -> bool:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return limit is None or _declared_length(request, request._stream) <= limit
