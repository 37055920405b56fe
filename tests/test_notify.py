"""Webhooks against real local HTTP servers: documents arrive whole, and a hanging one delays nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from loadscale import scaled

from clusterrun.notify import Notifier

ROOT = Path(__file__).resolve().parent.parent


class _Hook(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.received: list[dict] = []
        self.release = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class _Handler(BaseHTTPRequestHandler):
    server: _Hook

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append(json.loads(body))
        self.server.release.wait(self.server.delay)  # a slow webhook holds the answer back
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def hook(request: pytest.FixtureRequest) -> Iterator[_Hook]:
    server = _Hook(getattr(request, "param", 0.0))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


def test_documents_arrive_with_the_run_id_and_a_slack_text(hook: _Hook) -> None:
    notifier = Notifier([hook.url])
    notifier.send("start", "run r1 started on 2 node(s)", run_id="r1", state="running", nodes=["a", "b"])
    notifier.send("end", "run r1 succeeded", run_id="r1", state="succeeded", duration=3.5)
    assert notifier.close(wait=scaled(5.0)) == []
    assert sorted(d["event"] for d in hook.received) == ["end", "start"]
    assert all(d["run_id"] == "r1" and d["text"].startswith("run r1") for d in hook.received)


@pytest.mark.parametrize("hook", [30.0], indirect=True)
def test_a_hanging_webhook_delays_the_end_by_at_most_a_second(hook: _Hook) -> None:
    notifier = Notifier([hook.url, "http://127.0.0.1:9/refused"])
    started = time.monotonic()
    notifier.send("end", "run r2 failed", run_id="r2")
    sent = time.monotonic() - started
    undelivered = notifier.close(wait=1.0)
    # the hook hangs for 30 s: send returns at once, close after its one second (slack scaled with the load)
    assert sent < scaled(0.5) and time.monotonic() - started < 1.0 + scaled(1.0)
    assert {d.url for d in undelivered} == {hook.url, "http://127.0.0.1:9/refused"}
    refused = next(d for d in undelivered if d.url.endswith("/refused"))
    assert refused.ok is False and refused.error


@pytest.mark.parametrize("hook", [30.0], indirect=True)
def test_up_posts_start_and_end_and_a_hanging_hook_does_not_hold_it(hook: _Hook, tmp_path: Path) -> None:
    """A real local run: the webhook gets start and end with the run id; it never answers, and the run still
    ends at once (within the one second clusterrun waits for it)."""
    pytest.importorskip("torch", reason="local runs need the torch extra")
    (tmp_path / "hi.py").write_text("import os\nprint('hi', os.environ['RANK'], flush=True)\n")
    done = subprocess.run([sys.executable, "-m", "clusterrun", "up", "--nproc-per-node", "1", "--notify", hook.url,
                           str(ROOT / "inventories" / "localhost.yaml"), "hi.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr
    run_id = next(p.name for p in (tmp_path / "runs").iterdir())
    assert [d["event"] for d in hook.received] == ["start", "end"]
    assert {d["run_id"] for d in hook.received} == {run_id}
    assert hook.received[1]["state"] == "succeeded" and hook.received[1]["text"].startswith(f"clusterrun: run {run_id}")
    assert f"--notify {hook.url}: the 'end' document was still on its way" in done.stderr
