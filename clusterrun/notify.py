"""Webhooks: a small JSON document POSTed when a run starts, fails, has a straggler, and ends (``up --notify URL``).

The document carries ``text`` (one line, so Slack-compatible incoming webhooks show it as it is), the
``event`` (``start``, ``failure``, ``path-lost``, ``straggler``, ``restart``, ``end``), and ``run_id``, ``state``,
``nodes``, ``first_failure``, ``run_dir``, ``duration``. Each POST runs on its own thread with a timeout and is
never retried: a slow or dead webhook cannot delay or break the run. At the end clusterrun waits at
most ``END_WAIT`` seconds for the last documents to go out, then leaves them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clusterrun.errors import reason_of

POST_TIMEOUT = 5.0  # seconds for one webhook to accept one document
END_WAIT = 1.0  # seconds the end of a run waits for documents still on their way


@dataclass
class Delivery:
    url: str
    event: str
    ok: bool | None = None  # None while on its way
    error: str | None = None
    body: bytes = b""  # the document, to send again from elsewhere (a detached run's: see ``pending``)


def pending(missed: Sequence[Delivery]) -> list[dict[str, Any]]:
    """Deliveries that did not go out, as a detached run's supervisor keeps them for this machine to send
    (compute nodes often have no route out): url, event, why, the document."""
    return [{"url": d.url, "event": d.event, "error": d.error or "still on its way", "body": d.body.decode()}
            for d in missed]


def send_now(url: str, body: bytes, timeout: float = POST_TIMEOUT) -> str | None:
    """POST one document and wait for it: None when it was taken, else why not."""
    notifier = Notifier([url], timeout)
    delivery = Delivery(url, "", body=body)
    notifier._post(delivery, body)
    return None if delivery.ok else (delivery.error or "not taken")


@dataclass
class Notifier:
    urls: Sequence[str]
    timeout: float = POST_TIMEOUT
    deliveries: list[Delivery] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    def send(self, event: str, text: str, **fields: Any) -> None:
        """POST ``{"text", "event", **fields}`` to every URL, in the background."""
        if not self.urls:
            return
        import urllib.request  # noqa: F401 - loaded here, in the caller's thread, only when there is a URL

        body = json.dumps({"text": text, "event": event, "time": time.time(), **fields}, default=str).encode()
        for url in self.urls:
            delivery = Delivery(url, event, body=body)
            self.deliveries.append(delivery)
            thread = threading.Thread(target=self._post, args=(delivery, body), daemon=True, name="notify")
            thread.start()
            self._threads.append(thread)

    def _post(self, delivery: Delivery, body: bytes) -> None:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(delivery.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "User-Agent": "clusterrun"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                delivery.ok = 200 <= response.status < 300
                if not delivery.ok:
                    delivery.error = f"HTTP {response.status}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            delivery.ok, delivery.error = False, reason_of(exc)

    def close(self, wait: float = END_WAIT) -> list[Delivery]:
        """Wait at most ``wait`` seconds in all for what is on its way; returns the deliveries that failed or
        did not finish in time."""
        end = time.monotonic() + wait
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
        return [d for d in self.deliveries if not d.ok]
