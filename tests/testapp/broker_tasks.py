"""A real Celery task for ``tests/test_outbox.py``'s broker tests: its app's broker is whatever
the test points it at (:func:`use_broker`), a listener that never answers or ``memory://``."""

from __future__ import annotations

from celery import Celery

app = Celery("tests.outbox.broker", set_as_current=False)


@app.task(name="tests.testapp.broker_tasks.notify", shared=False)
def notify(order_id: int) -> None:
    """Never run here: the tests read what reached the broker."""


def use_broker(url: str) -> None:
    """Point the app at ``url`` from its next send on (its pools dropped)."""
    app.conf.broker_url = url
    app.close()
    app.amqp._producer_pool = None
