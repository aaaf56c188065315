"""The admin's list in a real browser, headless Chromium at 1400 px: no column behind a
horizontal scrollbar, with both of the admin's sidebars open.

Skipped where Chromium is not installed (Debian: ``apt-get install chromium``); the
rendered-HTML tests of ``tests/test_admin.py`` are the gate everywhere. Chromium is driven over
``--remote-debugging-pipe`` (the DevTools protocol on file descriptors 3 and 4), so no Python
package is needed.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from tests.factories import IdempotencyKeyFactory

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TIMEOUT = 60.0
WIDTH = 1400

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)"),
    pytest.mark.django_db(transaction=True),
]

MEASURE = """
new Promise(resolve => {
  const check = () => {
    if (location.pathname !== %s || document.readyState !== "complete") {
      return setTimeout(check, 50);
    }
    const results = document.querySelector(".results");
    const sidebar = document.querySelector("#nav-sidebar");
    resolve(JSON.stringify({
      title: document.title,
      innerWidth: window.innerWidth,
      pageScrollWidth: document.documentElement.scrollWidth,
      resultsScrollWidth: results.scrollWidth,
      resultsClientWidth: results.clientWidth,
      columns: [...document.querySelectorAll("#result_list thead th")].map(th => th.className),
      rows: document.querySelectorAll("#result_list tbody tr").length,
      navSidebarWidth: sidebar ? sidebar.offsetWidth : 0,
      filterWidth: document.querySelector("#changelist-filter").offsetWidth,
      styled: getComputedStyle(document.body).fontFamily !== "",
    }));
  };
  check();
})
"""


class Browser:
    """Just enough of the DevTools protocol: commands, their results, errors."""

    def __init__(self, profile: Path) -> None:
        to_chromium, self._to_chromium = os.pipe()
        self._from_chromium, from_chromium = os.pipe()
        self.process = subprocess.Popen(
            [
                "bash",  # dash cannot redirect from a descriptor above 9
                "-c",
                f'exec "$0" "$@" 3<&{to_chromium} 4>&{from_chromium}',
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                f"--window-size={WIDTH},900",
                "about:blank",
            ],
            pass_fds=(to_chromium, from_chromium),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chromium)
        os.close(from_chromium)
        self._buffer = b""
        self._last_id = 0

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._last_id += 1
        message: dict[str, Any] = {"id": self._last_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_chromium, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive()
            if reply.get("id") == self._last_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result

    def _receive(self) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_chromium], [], [], 1.0)
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer")
            if ready:
                chunk = os.read(self._from_chromium, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium exited")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        os.close(self._to_chromium)
        os.close(self._from_chromium)


def measure(browser: Browser, session: str, path: str) -> dict[str, Any]:
    """Run MEASURE once the page at ``path`` has loaded (the first context may be replaced)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            result = browser.send(
                "Runtime.evaluate",
                session,
                expression=MEASURE % json.dumps(path),
                awaitPromise=True,
            )
        except RuntimeError as error:
            if "context was destroyed" not in str(error) or time.monotonic() > deadline:
                raise
            continue
        page: dict[str, Any] = json.loads(result["result"]["value"])
        return page


@pytest.fixture
def browser(tmp_path: Path) -> Any:
    browser = Browser(tmp_path / "profile")
    yield browser
    browser.close()


def test_changelist_fits_1400_px(browser: Browser, live_server: Any) -> None:
    now = timezone.now()
    IdempotencyKeyFactory(completed=True, scope="user:1042", path="/api/payments/")
    IdempotencyKeyFactory(
        stale=True,
        expired=True,
        scope="tenant:acme-corporation",
        method="PATCH",
        path="/api/payments/7/capture/?include=customer,invoice,line_items&expand=all",
        created_at=now - timedelta(minutes=42),
    )
    IdempotencyKeyFactory(status="failed", response_status=422, unlock_at=None, lock_token=None)
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", None))
    host = live_server.url.split("//", 1)[1].split(":", 1)[0]
    browser.send(
        "Storage.setCookies",
        cookies=[
            {
                "name": "sessionid",
                "value": client.cookies["sessionid"].value,
                "domain": host,
                "path": "/",
            }
        ],
    )
    path = "/admin/django_idempotency/idempotencykey/"
    target = browser.send("Target.createTarget", url=live_server.url + path)["targetId"]
    session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    browser.send(
        "Emulation.setDeviceMetricsOverride",
        session,
        width=WIDTH,
        height=900,
        deviceScaleFactor=1,
        mobile=False,
    )

    page = measure(browser, session, path)

    assert page["title"].startswith("Idempotency keys |")
    assert page["innerWidth"] == WIDTH
    assert page["rows"] == 3
    assert page["navSidebarWidth"] > 200 and page["filterWidth"] > 200  # both sidebars open
    assert page["pageScrollWidth"] <= WIDTH
    assert page["resultsScrollWidth"] <= page["resultsClientWidth"], page
