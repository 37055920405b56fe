"""ssh_config as OpenSSH itself reads it: ``ssh -G`` wherever the ``ssh`` binary exists.

Which reader is used, and why (docs/ssh.md has the table and the measurements):

- **OpenSSH's**, ``ssh -G [-F FILE] [-l USER] [-p PORT] HOST`` per distinct target, wherever ``ssh`` is on PATH:
  ``Match exec``, ``Include``, every ``%`` token and every keyword behave exactly as for the user's own ``ssh``,
  including what a newer or distribution-patched OpenSSH knows and clusterrun's reader does not. The
  inventory's user and port are ``-l``/``-p``, as they act like ssh's command line (``Match user``, ``%r``,
  ``%p`` see them); a jump host decided outside ssh_config is ``-o ProxyJump=none``, as ``ssh -J`` is. A file
  OpenSSH refuses stops clusterrun with OpenSSH's own words, its ``file line N`` turned into ``file:N``.
- **Plain files, checked by OpenSSH and read by clusterrun's reader**: where every file is in the subset
  :meth:`Scan.plain <clusterrun.transport.ssh.scan.Scan.plain>` describes (``Host`` blocks, no ``Match``, no
  tokens where ``ssh -G`` expands them, ...), the answers are the same (tests/test_ssh_resolve.py compares
  them), so OpenSSH reads each file once (``ssh -G -F FILE``: it checks every line of every block) and
  clusterrun's reader answers per node. One ``ssh -G`` costs ~7 ms of CPU, half a paramiko connection: per
  node it would add half again to a launch's CPU per added node.
- **Nothing** where no file could set a keyword clusterrun uses (no ``~/.ssh/config``, a system file with only
  ``SendEnv`` and the like): both readers would answer "nothing set"; no process is started.
- **clusterrun's reader** (:mod:`clusterrun.transport.ssh.config`, as strict as OpenSSH 9.2) where ``ssh`` is
  absent (a container image with Python but no OpenSSH client).
- ``CLUSTERRUN_SSH_CONFIG_READER=openssh`` runs ``ssh -G`` per target always; ``=builtin`` uses clusterrun's
  reader alone (tests run each case both ways).

What the config *set*: ``ssh -G`` prints every option, defaults included, and clusterrun must keep its own
defaults (accept-new host keys, a 10 s connect timeout, the default keys of ``~/.ssh``) where the user
configured nothing. So each answer is compared with ``ssh -G -F /dev/null`` (nothing configured: OpenSSH's
defaults, run once per process): a value that differs was set by the config; ``hostname``, ``user`` and
``port`` are compared with the target itself. A value set to exactly OpenSSH's default reads as unset, which
changes nothing clusterrun does except for ``StrictHostKeyChecking ask``: clusterrun has no one to ask and
keeps accept-new, as its reader does. ``ssh -G`` prints no origins; the file and line of a value (for
messages) are found by :mod:`clusterrun.transport.ssh.scan`, else the value is said to come from ``ssh -G``.

Bounds: at most :data:`MAX_PROCESSES` ``ssh -G`` at a time, each killed with what it started (a ``Match exec``
command) after :data:`SSH_G_TIMEOUT`; one process per key however many nodes ask at once; answers kept for
:data:`REUSE_S` per version of the files, so the jump host every node shares is asked once. Resolution runs in
each node's connecting thread, overlapped with the other nodes' handshakes.

Why not ``paramiko.SSHConfig``: see :mod:`clusterrun.transport.ssh.config`.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from clusterrun.errors import UsageError
from clusterrun.transport.ssh.config import MATCH_EXEC_TIMEOUT, HostConfig, Proxy, lookup_config
from clusterrun.transport.ssh.jump_spec import parse_jump_spec
from clusterrun.transport.ssh.keywords import KEYWORDS
from clusterrun.transport.ssh.scan import Scan, scan
from clusterrun.transport.ssh.words import Origin, expand_tokens, parse_port

READER_ENV = "CLUSTERRUN_SSH_CONFIG_READER"
MAX_PROCESSES = 8  # ssh -G at once: each is ~6 ms of CPU, more at once only queues on the cores
SSH_G_TIMEOUT = MATCH_EXEC_TIMEOUT + 5.0  # its Match exec commands bounded as clusterrun's reader bounds them
REUSE_S = 60.0
#: Seconds an SSH connection may take to open where neither the inventory nor ssh_config says.
DEFAULT_CONNECT_TIMEOUT = 10.0
_QUEUE_TIMEOUT = 4 * SSH_G_TIMEOUT  # a slot frees within SSH_G_TIMEOUT unless every holder hangs to its end
#: The keywords clusterrun reads from ssh_config: where none is set in any file, ssh -G is not needed.
USED = frozenset({"hostname", "port", "user", "identityfile", "proxycommand", "proxyjump", "userknownhostsfile",
                  "globalknownhostsfile", "stricthostkeychecking", "connecttimeout", "hostkeyalias",
                  "hashknownhosts"})
_SAME_AS_TARGET = {"host", "hostname", "user", "port"}
_MULTI = {"identityfile", "certificatefile", "sendenv", "setenv", "localforward", "remoteforward",
          "dynamicforward"}
_BOOL = {"true": "yes", "false": "no"}  # ssh -G prints some yes/no options as true/false
#: Values ``ssh -G`` prints with their ``%`` tokens (``%%`` included) already expanded: their ``%`` is kept as
#: ``%%``, so that the expansion clusterrun applies to every reader's values gives them back as printed.
_EXPANDED = frozenset({"hostname", "userknownhostsfile"})

_slots = threading.BoundedSemaphore(MAX_PROCESSES)
_answers: dict[tuple[object, ...], tuple[HostConfig, float]] = {}
_baseline: dict[str, dict[str, list[str]]] = {}
_key_locks: dict[object, threading.Lock] = {}
_lock = threading.Lock()


def ssh_binary() -> str | None:
    """The ``ssh`` to ask, or None when clusterrun's own reader is to be used (see the module docstring)."""
    choice = _choice()
    if choice == "builtin":
        return None
    found = shutil.which("ssh")
    if choice == "openssh" and found is None:
        raise UsageError(f"{READER_ENV}=openssh but no ssh binary is on PATH; install the OpenSSH client or "
                         f"unset {READER_ENV}")
    if choice not in ("", "openssh"):
        raise UsageError(f"{READER_ENV}={choice!r}: expected openssh or builtin")
    return found


def _choice() -> str:
    return os.environ.get(READER_ENV, "").strip().lower()


def host_config(host: str, config_file: str | None, files: list[tuple[Path, bool]], *, user: str | None,
                port: int | None, jump_given: bool = False) -> HostConfig:
    """What ssh_config sets for ``host`` (``user``/``port`` as given outside it), read by OpenSSH where its
    client is installed, else by clusterrun's reader over ``files``. Raises UsageError naming file and line.

    ``jump_given``: how the host is reached was decided outside ssh_config (the inventory's ``jump_host``, or a
    later hop of a chain), as ``ssh -J`` decides it: OpenSSH then neither reads nor checks the config's
    ProxyJump and ProxyCommand for it (``-o ProxyJump=none``), so a catch-all ProxyJump is no loop."""
    ssh = ssh_binary()
    if ssh is None:
        return lookup_config(host, files, user=user)
    found = scan(files)  # the files ssh reads: ~/.ssh/config from the same (password database's) home
    if _choice() != "openssh":
        if not found.sets_any(USED):
            return HostConfig()
        if host == host.lower() and found.plain(USED):
            _validate(ssh, found, host)
            return lookup_config(host, files, user=user)
    key = (config_file, host, user, port, jump_given, found.version)
    with _first(key):
        with _lock:
            known = _answers.get(key)
            if known is not None and time.monotonic() - known[1] < REUSE_S:
                return known[0]
        values = _ssh_g(ssh, host, config_file, user, port, jump_given)
        answer = _to_host_config(host, user, port, values, _baseline_of(ssh), found)
        with _lock:
            if len(_answers) > 4096:
                _answers.clear()
            _answers[key] = (answer, time.monotonic())
    return answer


def address_of(host: str, found: HostConfig, port: int | None) -> tuple[str, int]:
    """Where ``host`` is reached as ``found`` (its ssh_config) says: its HostName (``%h`` expanded) and port
    (``port`` given outside ssh_config wins; 22 by default)."""
    hostname = expand_tokens(found.get("hostname") or "%h", {"h": host}, found.origin("hostname") or host)
    if port is None and found.get("port"):
        port = parse_port(found.words("port")[0], "Port", found.origin("port") or host)
    return hostname, port or 22


def connect_timeout_of(found: HostConfig, given: float | None) -> float:
    """The connect bound: ``given`` (the inventory's), else ssh_config's ConnectTimeout, else
    :data:`DEFAULT_CONNECT_TIMEOUT` (also for OpenSSH's ``ConnectTimeout 0``, none: clusterrun keeps one)."""
    if given is not None:
        return given
    text = (found.words("connecttimeout") or [None])[0]
    try:
        timeout = float(text) if text else DEFAULT_CONNECT_TIMEOUT
    except ValueError:
        raise UsageError(f"{found.origin('connecttimeout')}: ConnectTimeout {text!r} is not a number of "
                         "seconds") from None
    return timeout if 0 < timeout <= 600 else DEFAULT_CONNECT_TIMEOUT


@contextlib.contextmanager
def _first(key: object) -> Iterator[None]:
    """One thread at a time per key: the others wait for its answer (the shared jump host, the one check of a
    file) instead of starting the same ssh -G. Bounded: the holder's ssh -G is."""
    with _lock:
        held = _key_locks.setdefault(key, threading.Lock())
    got = held.acquire(timeout=SSH_G_TIMEOUT + 5.0)
    try:
        yield
    finally:
        if got:
            held.release()


def _validate(ssh: str, found: Scan, host: str) -> None:
    """Have OpenSSH read each file once per version (``ssh -G -F FILE``: it checks every line, in every block,
    whichever host is asked), so a file it refuses stops clusterrun with its words."""
    for path, mtime, size in found.version:
        key = ("validated", path, mtime, size)
        with _first(key):
            with _lock:
                if key in _answers:
                    continue
            done = _run([ssh, "-G", "-F", path, "--", "clusterrun-check"], path)
            if done.returncode != 0:
                raise _refused(host, done.stderr, f"ssh -G -F {path}")
            with _lock:
                _answers[key] = (HostConfig(), time.monotonic())


def _run(argv: Sequence[str], what: str) -> subprocess.CompletedProcess[str]:
    """Run one ``ssh -G``, at most MAX_PROCESSES at once; on timeout its whole session is killed."""
    if not _slots.acquire(timeout=_QUEUE_TIMEOUT):
        raise UsageError(f"{what}: no ssh -G could start within {_QUEUE_TIMEOUT:g}s: the ssh -G before it each ran "
                         "to its timeout (a Match exec command that does not return?)")
    try:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True)
        except OSError as exc:
            raise UsageError(f"{what}: cannot run {argv[0]}: {exc}") from None
        try:
            out, err = proc.communicate(timeout=SSH_G_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):  # a command that left the session keeps a pipe
                proc.communicate(timeout=5.0)
            raise UsageError(f"{what}: `{' '.join(argv)}` did not answer within {SSH_G_TIMEOUT:g}s (a Match exec "
                             "command that does not return?); make that command answer quickly") from None
    finally:
        _slots.release()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _parse(out: str) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key:
            values.setdefault(key.lower(), []).append(_BOOL.get(value, value))
    return values


def _baseline_of(ssh: str) -> dict[str, list[str]]:
    with _first(("baseline", ssh)):
        with _lock:
            known = _baseline.get(ssh)
        if known is None:
            done = _run([ssh, "-G", "-F", "/dev/null", "--", "clusterrun-defaults"], "ssh -G with no config")
            if done.returncode != 0:
                raise UsageError(f"`{ssh} -G -F /dev/null` failed: {done.stderr.strip()}")
            known = _parse(done.stdout)
            with _lock:
                _baseline[ssh] = known
    return known


_REFUSED_LINE = re.compile(r"^(?P<path>.+?):? line (?P<line>\d+): (?P<what>.*)$")
_BAD_OPTION = re.compile(r"Bad configuration option: (\S+)")


def _refused(host: str, stderr: str, command: str = "") -> UsageError:
    """OpenSSH's refusal of a config, its ``path line N:`` as ``path:N:``, a near keyword suggested."""
    said = []
    for line in stderr.splitlines():
        line = line.strip()
        if not line or "terminating," in line or line.startswith("Pseudo-terminal"):
            continue
        refused = _REFUSED_LINE.match(line)
        if refused:
            line = f"{refused['path']}:{refused['line']}: {refused['what']}"
        line = line.rstrip(".")
        bad = _BAD_OPTION.search(line)
        if bad:
            near = difflib.get_close_matches(bad.group(1).lower(), KEYWORDS, n=1, cutoff=0.75)
            line += f" (did you mean {near[0]!r}?)" if near else (
                " (an option of another SSH client can be named in an IgnoreUnknown line before it)")
        said.append(line)
    reason = "; ".join(said) or "no reason given"
    return UsageError(f"{host}: OpenSSH refuses this ssh_config (`{command or f'ssh -G {host}'}`): {reason}")


def _ssh_g(ssh: str, host: str, config_file: str | None, user: str | None, port: int | None,
           jump_given: bool) -> dict[str, list[str]]:
    argv = [ssh, "-G"] + (["-o", "ProxyJump=none"] if jump_given else [])
    if config_file:
        argv += ["-F", os.path.expanduser(config_file)]
    if user:
        argv += ["-l", user]
    if port:
        argv += ["-p", str(port)]
    done = _run([*argv, "--", host], host)
    if done.returncode != 0:
        raise _refused(host, done.stderr)
    return _parse(done.stdout)


def _same_hops(hops: object, value: str) -> bool:
    """Whether a ProxyJump value as written names ``hops`` (``ssh -G`` prints them as user@host:port)."""
    try:
        return parse_jump_spec(value) == hops
    except UsageError:
        return False


def _to_host_config(host: str, user: str | None, port: int | None, values: dict[str, list[str]],
                    baseline: dict[str, list[str]], found: Scan) -> HostConfig:
    """The values the config set: those ``ssh -G`` prints differently from ``ssh -G -F /dev/null``."""
    label = Origin(f"ssh_config as `ssh -G {host}` reads it", 0)
    config = HostConfig()

    def origin(keyword: str, value: str) -> Origin:
        return found.locate(keyword, value) or label

    first = {k: v[0] for k, v in values.items() if v}
    if first.get("hostname", host.lower()) != host.lower():
        config.values["hostname"] = (_unexpanded("hostname", first["hostname"]),
                                     origin("hostname", first["hostname"]))
    if user is None and first.get("user") not in (None, *baseline.get("user", [])):
        config.values["user"] = (first["user"], origin("user", first["user"]))
    if port is None and first.get("port") not in (None, *baseline.get("port", [])):
        config.values["port"] = (first["port"], origin("port", first["port"]))
    for keyword, said in values.items():
        if keyword in _SAME_AS_TARGET or said == baseline.get(keyword):
            continue
        if keyword == "identityfile":
            config.identity_files = [(name, origin(keyword, name)) for name in said]
        elif keyword == "proxycommand" and config.proxy is None:
            config.proxy = Proxy("command", said[0], origin(keyword, said[0]))
        elif keyword == "proxyjump" and config.proxy is None:
            # ssh -G prints the hops as user@host:port: the line is the one naming the same hops.
            hops = parse_jump_spec(said[0])
            where = found.locate_where(keyword, functools.partial(_same_hops, hops))
            config.proxy = Proxy("jump", said[0], where or label)
        else:
            value = " ".join(said) if keyword in _MULTI else said[0]
            config.values[keyword] = (_unexpanded(keyword, value), origin(keyword, value))
    return config


def _unexpanded(keyword: str, value: str) -> str:
    """``value`` as ``ssh -G`` printed it, safe from a second ``%`` expansion (``HostName 100%%h`` is ``100%h``)."""
    return value.replace("%", "%%") if keyword in _EXPANDED else value
