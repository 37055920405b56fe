"""A real headless browser for the HTML pages: Debian's chromium, run once per page, offline (every network
feature it has switched off), with a profile of its own. ``dom`` is the document after the browser built it,
``screenshot`` a PNG of the window."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

BROWSER_TIMEOUT = 90.0


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _run(page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = chromium()
    if exe is None:
        raise RuntimeError("no chromium on this machine (.ci/install-cluster-deps installs it)")
    with tempfile.TemporaryDirectory(prefix="clusterrun-chromium-") as profile:
        argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-extensions", f"--user-data-dir={profile}", *args, page.resolve().as_uri()]
        return subprocess.run(argv, capture_output=True, text=True, timeout=BROWSER_TIMEOUT, check=False,
                              stdin=subprocess.DEVNULL)


def dom(page: Path) -> str:
    """The page's DOM as the browser built it (serialized)."""
    done = _run(page, "--dump-dom")
    if done.returncode != 0 or "<html" not in done.stdout:
        raise RuntimeError(f"chromium could not show {page} (exit {done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def screenshot(page: Path, png: Path, width: int = 1300, height: int = 1800) -> Path:
    """A PNG of the page in a window of ``width`` x ``height``."""
    png.parent.mkdir(parents=True, exist_ok=True)
    done = _run(page, f"--screenshot={png.resolve()}", f"--window-size={width},{height}",
                "--hide-scrollbars")
    if not png.is_file() or png.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot of {page} (exit {done.returncode}): {done.stderr[-2000:]}")
    return png


def text_of(html: str) -> str:
    """The page's visible text, roughly (tags dropped, entities left): enough to look for names in."""
    import html as html_lib
    import re

    no_style = re.sub(r"<style.*?</style>", " ", html, flags=re.S)
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", no_style))
