"""Everything that runs on a node, as real files. Standard library only, for any Python 3.8+ a node has.

=================== ====================================================================================
agent.py            the node agent's entry: reads a mode's spec and runs it (modes ``prepare``, ``run``,
                    ``exec``, ``collect``, ``sweep``, ``ps``)
session.py          the agent's first phase (``prepare``): the ready check and the path probes before ``go``
torchrun_summary.py torchrun's words about its workers: the failure line, the failure summary at the end
job.py              the agent's ``run`` (and ``go``): torchrun in its own session, its output relayed, stopped
warm.py             a torchrun started at the ready check, importing torch until ``go`` hands it the job
mirror.py           the agent's ``mirror``: a detached run's record, from its supervisor's directory on rank 0's node
collect.py          the agent's ``collect``: what is left of a run after a broken stream, and its missing logs
execmode.py         the agent's ``exec``: one shell command for ``clusterrun exec``
procs.py            the agent's process tools: descendants, a run's marked processes, stopping them
leases.py           the GPU and master-port leases a run holds on a node for its whole life (flock)
protocol.py         the agent's contract: each mode's spec (keys, types, the one set of defaults) and the wire
                    protocol (events, payloads, commands); written by the agent, read by clusterrun
answers.py          the agent's answers as clusterrun reads them: one spec (fields, types, defaults) per event
                    kind, which is also the kind's typed, immutable event (not sent to the agent)
decode.py           reading an answer with its spec, once, where frames are read (agents/link.py); a malformed
                    one names the node and the field (with answers.py, for the cluster supervisor only: 3.10+)
wire.py             the agent's output: events written whole
relay.py            a detached run: the agent's stream moved to the run's supervisor on rank 0's node (handshake)
bundle.py           clusterrun's own modules taken to a node whole: the cluster supervisor of a detached run
tailing.py          the agent's reading of the rank log files, sent on as ``out`` events
pathwatch.py        the agent's data-path watch: UDP probes to its peers, answers to theirs
sampler.py          the agent's series of the node: NICs, RDMA ports, ranks, load, GPUs, every few seconds
ranksockets.py      its part on the ranks' own TCP connections: which NIC, which peers, how many bytes
gpuloop.py          its GPU part: one looping nvidia-smi for the run, bounded, restarted when it hangs or dies
stacks.py           the agent's stack dumps of its workers (py-spy, or the hook below)
stackhook.py        a sitecustomize for the workers: faulthandler on a signal, for stacks without py-spy
ready.py            the ready check before a launch: python, torch, run directory, master port, staged
                    files, and the node's facts (below)
nodefacts.py        the one reporter of a node's facts (NICs, RDMA ports, GPUs): for ``up``'s ready check,
                    ``plan --probe``, ``init`` and doctor
gpufacts.py         its GPU part: nvidia-smi's GPUs, their processes and topology, each call bounded
netprobe.py         doctor's network probes: listen, send, connect
pyreport.py         doctor's report of the node's Python, torch, CUDA and NCCL (read from torch's files, not imported)
allreduce_smoke.py  doctor's all-reduce, run under torchrun (needs torch)
=================== ====================================================================================

:func:`argv` says how a program reaches a node: inline, in the command line itself (``python -c``), so a
node needs nothing installed; or by its path, for nodes that share this machine's files (``transport: local``).
The agent goes inline compressed, together with the modules it imports; a node keeps their compiled code
(``~/.clusterrun/cache/agent-<hash>-<python>.bin``), so a later start does not compile them again.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = ("agent", "nodefacts", "netprobe", "pyreport", "allreduce_smoke")
FILES = ("stackhook",)  # written on the nodes by the agent, from the text clusterrun sends it


def path(name: str) -> Path:
    """The file of program ``name`` (one of PROGRAMS, or ``protocol``)."""
    return HERE / f"{name}.py"


#: Node files given with a bundle (remote/bundle.py): a cluster supervisor has no files beside it, and hands these on.
BUNDLED: dict[str, str] = {}


@lru_cache(maxsize=None)
def source(name: str) -> str:
    return BUNDLED.get(name) or path(name).read_text(encoding="utf-8")


def _packed(name: str) -> str:
    return base64.b64encode(zlib.compress(source(name).encode(), 9)).decode("ascii")


# What the agent imports, sent with it, in import order.
AGENT_MODULES = ("protocol", "wire", "relay", "procs", "warm", "containers", "leases", "tailing", "pathwatch", "torchrun_summary", "stacks", "flight", "gpufacts", "nodefacts",
                 "ranksockets", "gpuloop", "sampler",
                 "ready", "session", "job", "collect", "execmode", "mirror")
#: The modules a program other than the agent imports, sent with it when it goes inline.
PROGRAM_MODULES = {"nodefacts": ("protocol", "gpufacts")}


@lru_cache(maxsize=None)
def program(name: str) -> str:
    """The text ``python -c`` runs for program ``name``: its source, after the modules it imports registered
    under the names it imports them by."""
    lines = [f"import sys as _s,types as _t,zlib as _z,base64 as _b\n"
             f"_m=_t.ModuleType({module!r});_s.modules[{module!r}]=_m\n"
             f"exec(compile(_z.decompress(_b.b64decode({_packed(module)!r})),{module + '.py'!r},'exec'),_m.__dict__)\n"
             for module in PROGRAM_MODULES.get(name, ())]
    return "".join(lines) + source(name)


#: Where a node keeps the agent's compiled code, by the code's hash and the interpreter's cache tag (relative
#: to the node user's home): each start skips compiling it again.
CODE_CACHE = ".clusterrun/cache"


@lru_cache(maxsize=1)
def _agent_loader() -> str:
    # Its modules are registered first, under the names the agent imports them by when it is not part of
    # clusterrun; then the agent runs as __main__. The compiled modules are kept on the node (written to a
    # temporary name, then renamed): a later start loads them instead of compiling 70 KB of source again.
    names = [*AGENT_MODULES, "agent"]
    packed = [_packed(name) for name in names]
    key = hashlib.sha256("".join(packed).encode()).hexdigest()[:24]
    lines = [
        "import base64,marshal,os,sys,types,zlib",
        f"S={list(zip(names, packed, strict=True))!r}",
        f"P=os.path.join(os.path.expanduser('~'),{CODE_CACHE!r},'agent-{key}-%s.bin'%sys.implementation.cache_tag)",
        "def _codes():",
        " try:",
        "  with open(P,'rb') as f: c=marshal.load(f)",
        "  if [n for n,_ in c]==[n for n,_ in S]: return c",
        " except Exception: pass",
        " c=[(n,compile(zlib.decompress(base64.b64decode(s)),n+'.py','exec')) for n,s in S]",
        " try:",
        "  os.makedirs(os.path.dirname(P),exist_ok=True)",
        "  t='%s.%d'%(P,os.getpid())",
        "  with open(t,'wb') as f: marshal.dump(c,f)",
        "  os.replace(t,P)",
        " except Exception: pass",
        " return c",
        "C=_codes()",
        "for n,c in C[:-1]:",
        " m=types.ModuleType(n)",
        " sys.modules[n]=m",
        " exec(c,m.__dict__)",
        "del S",
        "exec(C[-1][1])",
    ]
    return "\n".join(lines) + "\n"


def argv(python: str, name: str, *args: object, inline: bool = True) -> list[str]:
    """The command that runs program ``name`` with ``args`` under ``python`` on a node."""
    if name not in PROGRAMS:
        raise ValueError(f"no node program {name!r}")
    words = [str(a) for a in args]
    # The agent needs the standard library only: it starts without ``site`` (-S), whose .pth files cost every
    # node milliseconds at every start; its one look at site-packages (torch, in ready.py) finds them itself.
    flags = ["-S"] if name == "agent" else []
    if not inline:
        return [python, *flags, str(path(name)), *words]
    if name == "agent":
        return [python, *flags, "-c", _agent_loader(), *words]
    return [python, "-c", program(name), *words]
