"""Where an SSH connection goes: the inventory's settings over ssh_config over OpenSSH's defaults.

ssh_config is read as OpenSSH reads it: ``~/.ssh/config`` (or the inventory's ``config_file``, which, like
``ssh -F``, replaces both files), then ``/etc/ssh/ssh_config``; for each keyword the first value that applies
wins. ``Include`` is followed (relative names from ``~/.ssh``, or ``/etc/ssh`` in the system file; globs),
``Host`` and ``Match`` blocks apply as in OpenSSH, and a ``Match`` criterion clusterrun cannot evaluate
(``exec``, ``localnetwork``, ...) makes its block not apply, with a warning naming the file and line.
The inventory's ``user``, ``port`` and ``jump_host`` act like ``ssh``'s command line: they win, and ``%r``
and ``%p`` in ``ProxyCommand`` or ``ProxyJump`` expand to them.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from clusterrun.errors import UsageError
from clusterrun.inventory.models import HostKeyPolicy, SshSettings

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
MAX_JUMP_DEPTH = 4
_MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH

log = logging.getLogger(__name__)
_said: set[str] = set()
_said_lock = threading.Lock()


def warn_once(logger: logging.Logger, message: str) -> None:
    """Log ``message`` as a warning the first time it comes up in this process.

    A run resolves every node through the same files, so the same finding would otherwise repeat per node.
    """
    with _said_lock:
        if message in _said:
            return
        _said.add(message)
    logger.warning(message)


# ------------------------------------------------------------------------------------------ ssh_config

@dataclass(frozen=True)
class Origin:
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Proxy:
    """How ssh_config says to reach a host: ``kind`` is ``command`` or ``jump``; ``value`` None means ``none``."""

    kind: str
    value: str | None
    origin: Origin


@dataclass
class HostConfig:
    """The ssh_config values that apply to one host: the first value of each keyword, lower-cased keys."""

    values: dict[str, tuple[str, Origin]] = field(default_factory=dict)
    identity_files: list[tuple[str, Origin]] = field(default_factory=list)
    proxy: Proxy | None = None

    def get(self, key: str) -> str | None:
        found = self.values.get(key)
        return found[0] if found else None

    def words(self, key: str) -> list[str]:
        found = self.values.get(key)
        return _words(found[0], found[1]) if found else []

    def origin(self, key: str) -> Origin | None:
        found = self.values.get(key)
        return found[1] if found else None


_KEYWORD = re.compile(r"\s*([A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+|$)(.*)")
# Keywords whose value is the rest of the line, given to a shell as it is.
_WHOLE_LINE = {"proxycommand", "localcommand", "remotecommand", "knownhostscommand"}
# Keywords clusterrun reads (the others are skipped, as long as the line can be read).
_USED = {"hostname", "port", "user", "identityfile", "proxycommand", "proxyjump", "userknownhostsfile",
         "globalknownhostsfile", "stricthostkeychecking", "connecttimeout", "hostkeyalias", "hashknownhosts"}
_MATCH_SUPPORTED = {"all", "canonical", "final", "host", "originalhost", "user", "localuser"}
_MATCH_NO_ARGUMENT = {"all", "canonical", "final"}


def _words(text: str, origin: Origin) -> list[str]:
    """Split an ssh_config argument list: whitespace-separated, '…' and "…" quote, a word starting with # ends it."""
    words: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        if text[i] == "#":
            break
        word = []
        while i < n and not text[i].isspace():
            if text[i] in "\"'":
                end = text.find(text[i], i + 1)
                if end < 0:
                    raise UsageError(f"{origin}: unterminated quote in ssh_config: {text.strip()}")
                word.append(text[i + 1:end])
                i = end + 1
            else:
                word.append(text[i])
                i += 1
        words.append("".join(word))
    return words


@functools.lru_cache(maxsize=4096)
def _pattern(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower()),
                      re.DOTALL)


def _pattern_matches(pattern: str, text: str) -> bool:
    """OpenSSH's wildcard match: ``*`` and ``?`` only (``[`` is an ordinary character), case-insensitive."""
    return _pattern(pattern).fullmatch(text.lower()) is not None


def matches_pattern_list(patterns: list[str], text: str) -> bool:
    """True when ``text`` matches one of ``patterns`` and none of the negated (``!``) ones."""
    hit = False
    for pattern in patterns:
        if pattern.startswith("!"):
            if _pattern_matches(pattern[1:], text):
                return False
        elif _pattern_matches(pattern, text):
            hit = True
    return hit


def _local_user() -> str:
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "root"


@dataclass
class _Lookup:
    """State while reading ssh_config for one host (OpenSSH's readconf.c, the parts clusterrun uses)."""

    host: str  # as given: the inventory's host, an alias or an address
    user: str | None  # the inventory's user, like `ssh user@host`
    final: bool
    config: HostConfig = field(default_factory=HostConfig)
    wants_final: bool = False

    def match(self, text: str, origin: Origin) -> bool:
        words = _words(text, origin)
        if not words:
            raise UsageError(f"{origin}: Match needs a criterion (for example `Match host gpu*`)")
        result = True
        while words:
            word = words.pop(0)
            negate = word.startswith("!")
            criterion = word[1:].lower() if negate else word.lower()
            if criterion not in _MATCH_SUPPORTED:
                warn_once(log, f"{origin}: `Match {criterion}` is not supported by clusterrun: this Match block is "
                               "treated as not matching and its settings are not used (set them under a Host "
                               "line or in the inventory's ssh settings)")
                return False
            if criterion in _MATCH_NO_ARGUMENT:
                if criterion == "all":
                    passed = True
                elif criterion == "final":
                    self.wants_final = True
                    passed = self.final
                else:  # canonical: clusterrun does not canonicalize host names
                    passed = False
            else:
                if not words:
                    raise UsageError(f"{origin}: `Match {criterion}` needs an argument")
                patterns = words.pop(0).split(",")
                hostname = self.config.get("hostname")
                subject = {
                    "host": _expand_tokens(hostname, {"h": self.host}, origin) if hostname else self.host,
                    "originalhost": self.host,
                    "user": self.user or self.config.get("user") or _local_user(),
                    "localuser": _local_user(),
                }[criterion]
                passed = matches_pattern_list(patterns, subject)
            if passed == negate:
                result = False  # keep reading: later criteria still get their checks and warnings
        return result

    def read(self, path: Path, *, system: bool, active: bool, never_match: bool, depth: int) -> None:
        for origin, keyword, rest, patterns in _config_lines(path):
            if keyword == "host":
                active = not never_match and matches_pattern_list(patterns, self.host)
            elif keyword == "match":
                matched = self.match(rest, origin)
                active = not never_match and matched
            elif keyword == "include":
                if active:
                    self.include(rest, origin, system=system, depth=depth)
            elif active:
                self.set(keyword, rest, origin)

    def include(self, rest: str, origin: Origin, *, system: bool, depth: int) -> None:
        if depth >= _MAX_INCLUDE_DEPTH:
            raise UsageError(f"{origin}: Include nested more than {_MAX_INCLUDE_DEPTH} deep (does a file include "
                             "itself?)")
        for name in _words(rest, origin):
            name = os.path.expanduser(name)
            if not os.path.isabs(name):
                name = os.path.join("/etc/ssh" if system else os.path.expanduser("~/.ssh"), name)
            for found in sorted(glob.glob(name)):
                if os.path.isfile(found):
                    # An included file starts in the including block's state and cannot leave it.
                    self.read(Path(found), system=system, active=True, never_match=False, depth=depth + 1)

    def set(self, keyword: str, rest: str, origin: Origin) -> None:
        config = self.config
        value = rest.strip() if keyword in _WHOLE_LINE else rest
        if not value.strip():
            if keyword in _USED:
                raise UsageError(f"{origin}: {keyword} needs a value")
            return
        if keyword == "identityfile":
            listed = {name for name, _ in config.identity_files}  # as OpenSSH, each file once
            config.identity_files += [(word, origin) for word in _words(value, origin) if word not in listed]
        elif keyword in ("proxycommand", "proxyjump"):
            # As OpenSSH: whichever of the two comes first wins, `none` included.
            if config.proxy is None:
                if keyword == "proxyjump":
                    words = _words(value, origin)
                    value = words[0] if words else ""
                config.proxy = Proxy("command" if keyword == "proxycommand" else "jump",
                                     None if value.lower() == "none" else value, origin)
        elif keyword not in config.values:
            config.values[keyword] = (value, origin)


_ConfigLine = tuple[Origin, str, str, list[str]]  # where, keyword (lower case), the rest, Host's patterns
_parsed: dict[tuple[str, int, int], list[_ConfigLine]] = {}
_parsed_lock = threading.Lock()


def _config_lines(path: Path) -> list[_ConfigLine]:
    """The lines of one ssh_config file that say something, split once per version of the file: every node of
    a large inventory looks itself up in the same files, and each lookup walks every Host line."""
    try:
        info = path.stat()
    except OSError:
        info = None
    if info is not None and not path.is_file():  # a FIFO or a device would block or never end
        raise UsageError(f"{path}: is not a regular file, so not read as an ssh_config")
    key = (str(path), info.st_mtime_ns, info.st_size) if info is not None else None
    with _parsed_lock:
        if key is not None and key in _parsed:
            return _parsed[key]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read this ssh_config: {exc}") from None
    lines: list[_ConfigLine] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        origin = Origin(str(path), lineno)
        parsed = _KEYWORD.fullmatch(stripped)
        if parsed is None:
            raise UsageError(f"{origin}: cannot read this ssh_config line: {stripped}")
        keyword, rest = parsed.group(1).lower(), parsed.group(2)
        patterns: list[str] = []
        if keyword == "host":
            patterns = _words(rest, origin)
            if not patterns:
                raise UsageError(f"{origin}: Host needs at least one pattern")
        lines.append((origin, keyword, rest, patterns))
    if key is not None:
        with _parsed_lock:
            if len(_parsed) > 64:
                _parsed.clear()
            _parsed[key] = lines
    return lines


def config_files(config_file: str | None) -> list[tuple[Path, bool]]:
    """The ssh_config files to read, in order, each with whether it is the system file."""
    if config_file:
        path = Path(os.path.expanduser(config_file))
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "not found"
            raise UsageError(f"{path}: ssh config_file {what} (set in the inventory's ssh settings or with "
                             "--ssh-config)")
        return [(path, False)]
    candidates = [(Path(os.path.expanduser(DEFAULT_CONFIG)), False), (Path(SYSTEM_CONFIG), True)]
    return [(path, system) for path, system in candidates if path.is_file()]


def lookup_config(host: str, files: list[tuple[Path, bool]], *, user: str | None = None) -> HostConfig:
    """The ssh_config values for ``host``, reading ``files`` in order (first value wins).

    ``user`` is the user given outside ssh_config (``Match user`` sees it). Raises UsageError naming the
    file and line of a line that cannot be read.
    """
    state = _Lookup(host, user, final=False)
    for path, system in files:
        state.read(path, system=system, active=True, never_match=False, depth=0)
    if state.wants_final:
        # `Match final` blocks apply in a second pass over the files, values of the first pass still first.
        final = _Lookup(host, user, final=True, config=state.config)
        for path, system in files:
            final.read(path, system=system, active=True, never_match=False, depth=0)
        return final.config
    return state.config


def _expand_tokens(text: str, tokens: Mapping[str, str], origin: Origin | str) -> str:
    """Replace ``%x`` by ``tokens[x]`` and ``%%`` by ``%``; an unknown token is an error, as in OpenSSH."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "%" and i + 1 < len(text):
            key = text[i + 1]
            if key == "%":
                out.append("%")
            elif key in tokens:
                out.append(tokens[key])
            else:
                raise UsageError(f"{origin}: unknown token %{key} in {text!r} (supported here: "
                                 f"{', '.join('%' + k for k in sorted(tokens))})")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _expand_path(text: str, tokens: Mapping[str, str], origin: Origin | str) -> str:
    """A file name from ssh_config: ``~``, ``${VAR}`` and ``%`` tokens expanded."""
    def env(found: re.Match[str]) -> str:
        name = found.group(1)
        if name not in os.environ:
            raise UsageError(f"{origin}: environment variable {name} in {text!r} is not set")
        return os.environ[name]

    return os.path.expanduser(_expand_tokens(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", env, text), tokens, origin))


# ------------------------------------------------------------------------------------------ jump specs

@dataclass(frozen=True)
class JumpHop:
    user: str | None
    host: str
    port: int | None


def _port(text: str, what: str, origin: Origin | str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise UsageError(f"{origin}: {what}: port {text!r} is not a number from 1 to 65535")
    return int(text)


def _parse_hop(hop: str, spec: str, origin: Origin | str) -> JumpHop:
    example = "expected [user@]host[:port], [user@][IPv6]:port or ssh://[user@]host[:port]"
    text = hop
    if text.lower().startswith("ssh://"):
        text = text[6:].rstrip("/")
        if "/" in text:
            raise UsageError(f"{origin}: ProxyJump {spec!r}: an ssh:// URI has no path; {example}")
    user, at, rest = text.rpartition("@")
    if at and not user:
        raise UsageError(f"{origin}: ProxyJump {spec!r}: empty user before @; {example}")
    port = None
    if rest.startswith("["):
        host, bracket, tail = rest[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise UsageError(f"{origin}: ProxyJump {spec!r}: {example}")
        if tail:
            port = _port(tail[1:], f"ProxyJump {spec!r}", origin)
    elif rest.count(":") == 1:
        host, port_text = rest.split(":")
        port = _port(port_text, f"ProxyJump {spec!r}", origin)
    else:
        host = rest  # a name, or an IPv6 address without a port
    if not host or any(c.isspace() for c in host):
        raise UsageError(f"{origin}: ProxyJump {spec!r}: {example}")
    return JumpHop(user or None, host, port)


def parse_jump_spec(spec: str, origin: Origin | str = "jump_host") -> tuple[JumpHop, ...] | None:
    """A ProxyJump value as hops, first hop first; None for ``none``. Raises UsageError naming ``origin``."""
    spec = spec.strip()
    if spec.lower() == "none":
        return None
    if not spec:
        raise UsageError(f"{origin}: empty ProxyJump")
    return tuple(_parse_hop(hop.strip(), spec, origin) for hop in spec.split(","))


# ------------------------------------------------------------------------------------------ the target

@dataclass(frozen=True)
class SshTarget:
    alias: str  # what the inventory says (host or ssh_config alias)
    hostname: str  # what is connected to
    port: int
    user: str
    identity_files: tuple[str, ...]
    jump: SshTarget | None  # the hop this host is reached through
    proxy_command: str | None  # or the command whose stdin/stdout is the connection (never both)
    proxy_origin: str  # where jump or proxy_command came from, for messages
    known_hosts: tuple[str, ...]  # the user's known_hosts files; new keys are added to the first
    global_known_hosts: tuple[str, ...]
    host_key_alias: str | None
    hash_known_hosts: bool
    policy: HostKeyPolicy
    connect_timeout: float

    @property
    def known_hosts_name(self) -> str:
        """The name the host key is filed under: ``host`` or ``[host]:port``, as OpenSSH writes it."""
        name = self.host_key_alias or self.hostname
        return name if self.port == 22 else f"[{name}]:{self.port}"

    def describe(self) -> str:
        if self.proxy_command:
            command = self.proxy_command if len(self.proxy_command) <= 80 else self.proxy_command[:77] + "..."
            via = f" via ProxyCommand `{command}`"
        else:
            via = f" via {self.jump.describe()}" if self.jump else ""
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname  # an IPv6 address
        return f"{self.user}@{host}:{self.port}{via}"


def _policy(settings: SshSettings, found: HostConfig) -> HostKeyPolicy:
    if settings.host_key_policy is not None:
        return settings.host_key_policy
    strict = (found.get("stricthostkeychecking") or "accept-new").lower()
    return {"yes": HostKeyPolicy.strict, "no": HostKeyPolicy.off, "off": HostKeyPolicy.off}.get(
        strict, HostKeyPolicy.accept_new)


def resolve_target(host: str, settings: SshSettings) -> SshTarget:
    """Resolve ``host`` the way OpenSSH would, with the inventory's ``settings`` winning over ssh_config.

    Raises UsageError naming the file and line (or the inventory setting) of a value that cannot be used.
    """
    files = config_files(settings.config_file)
    return _resolve(host, settings, files, user=settings.user, port=settings.port,
                    identity_file=settings.identity_file, jump_spec=settings.jump_host, depth=0)


def _resolve(host: str, settings: SshSettings, files: list[tuple[Path, bool]], *, user: str | None,
             port: int | None, identity_file: str | None, jump_spec: str | None, depth: int) -> SshTarget:
    if depth > MAX_JUMP_DEPTH:
        raise UsageError(f"{host}: ProxyJump chain longer than {MAX_JUMP_DEPTH} hops (a loop in ssh_config?)")
    found = lookup_config(host, files, user=user)
    hostname = _expand_tokens(found.get("hostname") or "%h", {"h": host}, found.origin("hostname") or host)
    if port is None and found.get("port"):
        port = _port(found.words("port")[0], "Port", found.origin("port") or host)
    port = port or 22
    user = user or (found.words("user") or [None])[0] or _local_user()
    # The tokens OpenSSH offers in ProxyCommand, ProxyJump and file names.
    local_host = os.uname().nodename
    tokens = {"h": hostname, "n": host, "p": str(port), "r": user, "u": _local_user(), "d": os.path.expanduser("~"),
              "i": str(os.getuid()), "L": local_host.split(".")[0], "l": local_host}
    proxy_tokens = {k: tokens[k] for k in "hnpr"}

    if identity_file:
        identities: tuple[str, ...] = (os.path.expanduser(identity_file),)
    else:
        expanded = (_expand_path(name, tokens, origin) for name, origin in found.identity_files)
        identities = tuple(p for p in expanded if os.path.exists(p))

    jump: SshTarget | None = None
    proxy_command: str | None = None
    proxy_origin = ""
    jump_origin = ""
    if jump_spec is not None:
        jump_origin = "the inventory's jump_host"
        hops = parse_jump_spec(_expand_tokens(jump_spec, proxy_tokens, jump_origin), jump_origin)
    elif found.proxy is not None and found.proxy.kind == "jump" and found.proxy.value is not None:
        jump_origin = f"ProxyJump at {found.proxy.origin}"
        hops = parse_jump_spec(_expand_tokens(found.proxy.value, proxy_tokens, found.proxy.origin), jump_origin)
    else:
        hops = None
        if found.proxy is not None and found.proxy.value is not None:
            proxy_command = _expand_tokens(found.proxy.value, proxy_tokens, found.proxy.origin)
            proxy_origin = f"ProxyCommand at {found.proxy.origin}"
    if hops:
        last = hops[-1]
        if (last.host, last.port or 22, last.user or user) == (hostname, port, user):
            # OpenSSH refuses this too ("jumphost loop"): typically `Host *` with a ProxyJump that also
            # matches the jump host itself.
            raise UsageError(f"{jump_origin}: {user}@{hostname}:{port} would be reached through itself; give the "
                             f"jump host `ProxyJump none` (a `Host {host}` block before the one that sets it)")
    for index, hop in enumerate(hops or ()):
        # As `ssh -i KEY -J a,b`: the first hop is reached as ssh_config says (its own ProxyJump or
        # ProxyCommand included), each later hop through the one before it; KEY is the node's alone.
        hop_target = _resolve(hop.host, settings, files, user=hop.user, port=hop.port, identity_file=None,
                              jump_spec=None if index == 0 else "none", depth=depth + 1)
        jump = hop_target if index == 0 else replace(hop_target, jump=jump, proxy_origin="the ProxyJump chain")
    if hops:
        proxy_origin = jump_origin

    if settings.known_hosts:
        known: tuple[str, ...] = (os.path.expanduser(settings.known_hosts),)
    else:
        known = _known_hosts_files(found, "userknownhostsfile", DEFAULT_KNOWN_HOSTS, tokens)
    global_known = _known_hosts_files(found, "globalknownhostsfile", DEFAULT_GLOBAL_KNOWN_HOSTS, tokens)

    timeout = settings.connect_timeout
    if timeout is None:
        text = (found.words("connecttimeout") or [None])[0]
        try:
            timeout = float(text) if text else DEFAULT_CONNECT_TIMEOUT
        except ValueError:
            raise UsageError(f"{found.origin('connecttimeout')}: ConnectTimeout {text!r} is not a number of "
                             "seconds") from None
        if not 0 < timeout <= 600:
            timeout = DEFAULT_CONNECT_TIMEOUT  # OpenSSH's `ConnectTimeout 0` means none: clusterrun keeps one
    return SshTarget(alias=host, hostname=hostname, port=port, user=user, identity_files=identities, jump=jump,
                     proxy_command=proxy_command, proxy_origin=proxy_origin, known_hosts=known,
                     global_known_hosts=global_known, host_key_alias=(found.words("hostkeyalias") or [None])[0],
                     hash_known_hosts=(found.get("hashknownhosts") or "no").lower() == "yes",
                     policy=_policy(settings, found), connect_timeout=timeout)


def _known_hosts_files(found: HostConfig, key: str, default: tuple[str, ...],
                       tokens: Mapping[str, str]) -> tuple[str, ...]:
    names = found.words(key) or list(default)
    if [n.lower() for n in names] == ["none"]:
        return ()
    return tuple(_expand_path(n, tokens, found.origin(key) or n) for n in names)

