"""Views of ``tests/test_sealing.py`` and ``tests/test_erasure.py``: responses holding what
must never be readable at rest, and a view that waits while its request is in flight."""

from __future__ import annotations

import random
import threading

from django.http import HttpRequest, HttpResponse, JsonResponse

from django_idempotency import idempotent
from tests.testapp.models import Execution

#: What the responses carry, and the raw columns must never show with ENCRYPTION_KEYS.
CARD = "4242424242424242"
NAME = "Ada Lovelace"
LOCATION = "/charges/ch_secretlocation"


def charges(count: int) -> list[dict[str, object]]:
    """``count`` charges, about 180 bytes of JSON each: a list endpoint's body."""
    return [
        {
            "id": f"ch_{index:08d}",
            "amount": 1000 + index,
            "currency": "usd",
            "card": {"number": CARD, "exp": "12/30"},
            "customer": {"name": NAME, "city": "London"},
        }
        for index in range(count)
    ]


@idempotent
def charge(request: HttpRequest) -> HttpResponse:
    """``?count=N`` charges as JSON (1 by default, a body under 1 KiB); ``?random=N``: N
    incompressible bytes instead."""
    Execution.objects.create(label="charge", payload=request.body.decode("latin-1"))
    if "random" in request.GET:
        noise = random.Random(31).randbytes(int(request.GET["random"]))
        response = HttpResponse(noise, content_type="application/octet-stream")
    else:
        response = JsonResponse({"data": charges(int(request.GET.get("count", 1)))}, status=201)
    response["Location"] = LOCATION
    return response


#: ``hold`` sets ``entered`` once it runs, then waits for ``leave``.
entered = threading.Event()
leave = threading.Event()


@idempotent
def hold(request: HttpRequest) -> HttpResponse:
    Execution.objects.create(label="hold", payload="")
    entered.set()
    assert leave.wait(30), "the test never let the view finish"
    return JsonResponse({"held": True, "card": CARD})
