"""Every failure clusterrun reports to a user, as one exception tree.

    ClusterrunError                 exit_code 1; base of everything below; ``reason``: the message for a
                                    line that already names its subject (``node: reason``)
    ├── UsageError                  exit_code 2; a flag or argument is wrong
    ├── InventoryError              exit_code 2; the inventory is invalid (carries file:line)
    ├── PlanError                   exit_code 2; the inventory is valid but no launch plan fits it
    ├── ParseError                  exit_code 1; a tool printed output we do not recognise
    ├── NodeError                   exit_code 125; one node failed: ``node`` and a one-line ``reason``
    │   ├── TransportError          the node could not be reached or driven
    │   │   ├── ConnectError        connect refused, timed out, unreachable, DNS
    │   │   ├── AuthError           ssh authentication failed
    │   │   ├── HostKeyError        unknown or changed host key
    │   │   ├── CommandTimeout      a command (or a whole fan-out step) did not finish within its timeout
    │   │   └── ProtocolError       the node agent answered what this clusterrun cannot read (remote/answers.py)
    │   └── NodeNotReady            reachable, but it cannot run the job as planned
    │       ├── PythonNotFound      the inventory's python does not exist there
    │       └── NoTorch             that python has no torch (or no torchrun)
    └── StartError                  exit_code 125; preflight failed on one or more nodes, nothing started
        └── GpusLeased              a GPU the run needs is leased by another run (``up --wait-gpus`` waits)

Per-node work fans out with :func:`clusterrun.transport.fanout.fan_out`, which keeps each node's
:class:`NodeError` (not a string), so callers can tell an unreachable node from one without torch.

Messages are written for the person at the terminal: they name the node or the
``file:line``, what was tried, and what to do next. They never carry colour codes.
A job whose ranks fail is not an exception: the supervisor returns its outcome and
the CLI turns the first failing rank's code into the exit code.
"""

from __future__ import annotations

#: Exit code when clusterrun could not start the job at all (nothing runs anywhere).
#: Distinct from any code a rank returns in the usual cases (like ``docker run``'s 125).
EXIT_COULD_NOT_START = 125
#: Exit code for invalid input: flags, inventory, plan.
EXIT_USAGE = 2
#: Exit code after Ctrl-C (128 + SIGINT), the shell convention.
EXIT_INTERRUPTED = 130
#: The job ran past its time limit (as timeout(1) reports it).
EXIT_TIMEOUT = 124


class ClusterrunError(Exception):
    """Base class; ``exit_code`` is what the CLI exits with.

    ``reason`` is the failure in words for a place that names its subject itself (a row or a ``node: ...`` line
    of a per-node report): by default the whole message; a :class:`NodeError` leaves out the node's name."""

    exit_code: int = 1
    reason: str

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.reason = message

    def __str__(self) -> str:
        return self.message


class UsageError(ClusterrunError):
    """A command-line flag or argument is wrong."""

    exit_code = EXIT_USAGE


class InventoryError(ClusterrunError):
    """The inventory is invalid. ``problems`` holds one line per problem, each ``file:line:col: path: msg``."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)


class PlanError(ClusterrunError):
    """The inventory is valid but the requested job cannot be planned on it."""

    exit_code = EXIT_USAGE


class ParseError(ClusterrunError):
    """A tool's output did not match any format we know. Names the tool and the offending line."""

    def __init__(self, tool: str, message: str, line: str | None = None, lineno: int | None = None) -> None:
        where = f" (line {lineno}: {line!r})" if line is not None and lineno is not None else (
            f" ({line!r})" if line is not None else ""
        )
        super().__init__(f"unrecognised output from {tool}: {message}{where}")
        self.tool = tool
        self.line = line
        self.lineno = lineno


class NodeError(ClusterrunError):
    """One node failed. ``reason`` is the message without the node's name."""

    exit_code = EXIT_COULD_NOT_START

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"{node}: {message}")
        self.node = node
        self.reason = message


class TransportError(NodeError):
    """A node could not be reached or a command on it could not be run."""


class ConnectError(TransportError):
    """TCP/SSH connection could not be established (refused, timed out, unreachable)."""


class AuthError(TransportError):
    """SSH authentication failed."""


class HostKeyError(TransportError):
    """The host key is unknown under a strict policy, or it changed."""


class CommandTimeout(TransportError):
    """A remote or local command did not finish within its timeout."""


class ProtocolError(TransportError):
    """The node agent sent an answer that does not fit its kind's spec (the reason names the event and field)."""


class NodeNotReady(NodeError):
    """The node answers, but it cannot run the job as planned (the reason says why and what to do)."""


class PythonNotFound(NodeNotReady):
    """The inventory's python does not exist on the node."""


class NoTorch(NodeNotReady):
    """The node's python has no torch, or a torch without torchrun."""


class StartError(ClusterrunError):
    """One or more nodes failed preflight; nothing was started. ``problems`` maps node to message."""

    exit_code = EXIT_COULD_NOT_START

    def __init__(self, problems: dict[str, str], hint: str = "") -> None:
        lines = [f"could not start: {len(problems)} problem(s) found by the checks before launch; nothing was started"]
        lines += [f"  {node}: {msg}" for node, msg in problems.items()]
        if hint:
            lines.append(hint)
        super().__init__("\n".join(lines))
        self.problems = dict(problems)


class GpusLeased(StartError):
    """GPUs the run needs are leased by other runs (``problems`` names node, GPU and holder); nothing started."""


def reason_of(exc: BaseException) -> str:
    """The reason of any exception: ours (:attr:`ClusterrunError.reason`), one of the standard library's that
    carries its cause in ``reason`` (urllib's ``URLError``, ``ssl.SSLError``), or else its text."""
    if isinstance(exc, ClusterrunError):
        return exc.reason
    return str(getattr(exc, "reason", None) or exc)
