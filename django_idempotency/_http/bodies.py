"""Reading a request's body for the fingerprint, and leaving it readable for the view.

What is held in memory is what Django itself would hold (issue 20):

- A body up to ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is read as ``request.body``, as the view would.
- A larger body is copied in chunks into a spooled temporary file (in memory up to
  ``FILE_UPLOAD_MAX_MEMORY_SIZE``, then on disk), hashed from it in chunks, and made the
  request's stream again: the view reads it as it would have, and ``request.body`` refuses it
  as it would have.
- A ``multipart/form-data`` POST is fingerprinted from ``request.POST`` and ``request.FILES``,
  parsed by Django's upload handlers (so file fields are not held whole either, and
  ``DATA_UPLOAD_MAX_MEMORY_SIZE`` does not apply to them), one file's chunks at a time. The
  random part boundary does not count, and this works after ``CsrfViewMiddleware`` or
  ``csrf_protect`` has parsed the form already.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Collection, Iterable, Iterator
from typing import IO, Protocol

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpRequest, QueryDict, UnreadablePostError
from django.http.multipartparser import MultiPartParserError
from django.http.request import RawPostDataException

CHUNK_SIZE = 64 * 1024

#: What Django raises for a body it cannot read or parse: a multipart body without a boundary,
#: more fields or files than Django allows, a body cut short. The client's error, not the
#: project's: the app answers it ``400 invalid-request-body``, as its own problem, and claims
#: nothing (issue 26).
UNREADABLE = (
    MultiPartParserError,
    TooManyFieldsSent,
    TooManyFilesSent,
    RequestDataTooBig,
    UnreadablePostError,
)


class Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


def is_form_upload(request: HttpRequest) -> bool:
    """Whether Django parses this body into ``request.POST`` and ``request.FILES``."""
    return request.method == "POST" and request.content_type == "multipart/form-data"


def keep_readable(request: HttpRequest) -> None:
    """Read the body now, before anything else consumes the stream, and keep it readable.

    For DRF, whose authenticators or parsers may consume the stream before the key is claimed.
    """
    if hasattr(request, "_body") or request._read_started:  # type: ignore[attr-defined]
        return
    if _fits_in_memory(request):
        request.body  # noqa: B018
    elif not is_form_upload(request):
        _spool(request)


def body_chunks(request: HttpRequest) -> bytes | Iterable[bytes]:
    """The raw body: ``bytes`` when it is held whole, else its chunks (read once, re-readable
    after). Raises ``RawPostDataException`` when someone else consumed the stream."""
    if hasattr(request, "_body"):
        return request.body
    spooled: IO[bytes] | None = getattr(request, "_idempotency_spool", None)
    if spooled is not None:
        return _reread(spooled)
    if request._read_started:  # type: ignore[attr-defined]
        raise RawPostDataException(
            "The request body was read before the Idempotency-Key could be checked."
        )
    if _fits_in_memory(request):
        return request.body
    return _reread(_spool(request))


def feed_form(digest: Digest, request: HttpRequest, exclude: Collection[str] = ()) -> None:
    """Feed a parsed ``multipart/form-data`` body: fields and files by name, files by content;
    those named in ``exclude`` left out.

    A small body is read first, so that ``request.body`` stays readable as before.
    """
    if not request._read_started and _fits_in_memory(request):  # type: ignore[attr-defined]
        request.body  # noqa: B018
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
    if limit is None:
        return True
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    stream = request._stream
    if hasattr(stream, "seekable") and stream.seekable():  # ASGI: the whole body, spooled
        length = max(length, stream.seek(0, os.SEEK_END))
        stream.seek(0)
    return length <= limit


def _spool(request: HttpRequest) -> IO[bytes]:
    """Move the unread body into a spooled file that becomes the request's stream again."""
    # Closed when the request is collected, as Django's own ASGI body file is.
    spooled: IO[bytes] = tempfile.SpooledTemporaryFile(  # noqa: SIM115
        max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE
    )
    while chunk := request.read(CHUNK_SIZE):
        spooled.write(chunk)
    spooled.seek(0)
    request._stream = spooled  # type: ignore[assignment]
    request._read_started = False  # type: ignore[attr-defined]
    request._idempotency_spool = spooled  # type: ignore[attr-defined]
    return spooled


def _reread(spooled: IO[bytes]) -> Iterator[bytes]:
    spooled.seek(0)
    try:
        while chunk := spooled.read(CHUNK_SIZE):
            yield chunk
    finally:
        spooled.seek(0)
