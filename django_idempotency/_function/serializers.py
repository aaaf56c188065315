"""How an idempotent function's result is stored, and read back for every later call."""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ResultSerializer(Protocol):
    """What ``idempotent_function(serializer=...)`` takes: the result to bytes and back.

    ``loads(dumps(result))`` is what every call returns, the first one included, so a first
    delivery and a redelivery of one message see the same value.
    """

    content_type: str

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class JSONSerializer:
    """The default: plain JSON. Pass ``encoder`` (e.g. ``DjangoJSONEncoder``) for more types.

    An encoder only writes: a ``datetime`` stored through ``DjangoJSONEncoder`` comes back as
    its ISO string. Write a serializer of your own when the type must survive the round trip.
    """

    content_type = "application/json"

    def __init__(self, encoder: type[json.JSONEncoder] | None = None) -> None:
        if encoder is not None and not (
            isinstance(encoder, type) and issubclass(encoder, json.JSONEncoder)
        ):
            # Refused here: json.dumps would refuse it only once the function had run.
            raise TypeError(
                f"encoder must be a json.JSONEncoder subclass (the class, not an instance), "
                f"not {encoder!r}."
            )
        self.encoder = encoder

    def dumps(self, value: Any) -> bytes:
        try:
            text = json.dumps(value, cls=self.encoder, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"The result ({type(value).__name__}) is not JSON-serialisable: {exc}. Return "
                "plain JSON data, or pass serializer= to idempotent_function."
            ) from exc
        return text.encode("utf-8")

    def loads(self, data: bytes) -> Any:
        return json.loads(data)
