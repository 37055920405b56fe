"""Names of exported jobs: a default from the script and the run id, and the checks of names the user gives.

Kubernetes names the job's objects after it: PyTorchJob's Services are ``NAME-worker-15``, a TrainJob's pods
``NAME-node-0-15``, and TrainJob requires an RFC 1035 label (``^[a-z]([-a-z0-9]*[a-z0-9])?$``, 63 characters at
most). A name is therefore checked with the longest suffix the engine adds, so that an object it creates later
is not refused after the job was accepted.
"""

from __future__ import annotations

import posixpath
import re

from clusterrun.errors import UsageError
from clusterrun.planning.plan import LaunchPlan

#: An RFC 1035 label: what Services and TrainJob names must be.
_LABEL_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
#: An RFC 1123 label: what a namespace must be.
_NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MAX_LABEL = 63
#: A derived name stays short enough to read in `kubectl get` and `squeue`.
_DEFAULT_MAX = 40


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def default_name(plan: LaunchPlan, suffix: str = "") -> str:
    """``train-ddp-20261123-134229-89d1`` for ``examples/train_ddp.py`` (``-m pkg.train``: ``pkg-train-...``): a valid
    RFC 1035 label that leaves room for ``suffix`` (the longest the engine appends)."""
    script = plan.job.script
    stem = _slug(script if plan.job.module else posixpath.basename(script).removesuffix(".py")) or "job"
    if not stem[0].isalpha():
        stem = f"job-{stem}"
    run = _slug(plan.run_id)
    room = min(_DEFAULT_MAX, MAX_LABEL - len(suffix)) - len(run) - 1
    return f"{stem[:max(room, 1)].rstrip('-')}-{run}"


def check_name(name: str, suffix: str = "", flag: str = "--name") -> str:
    """``name`` when it is an RFC 1035 label that still is one with ``suffix`` appended; else :class:`UsageError`."""
    if not _LABEL_RE.fullmatch(name):
        raise UsageError(f"{flag} {name!r}: a Kubernetes job name is lower-case letters, digits and '-', starting with "
                         "a letter and not ending with '-', like --name train-llm-01")
    if len(name) + len(suffix) > MAX_LABEL:
        what = f" plus the {suffix!r} the operator appends" if suffix else ""
        raise UsageError(f"{flag} {name!r}: {len(name)} characters{what} exceeds the {MAX_LABEL} a Kubernetes name may "
                         f"have; use at most {MAX_LABEL - len(suffix)}")
    return name


def check_namespace(namespace: str) -> str:
    if not _NAMESPACE_RE.fullmatch(namespace) or len(namespace) > MAX_LABEL:
        raise UsageError(f"--namespace {namespace!r}: a namespace is at most {MAX_LABEL} lower-case letters, digits and "
                         "'-', not starting or ending with '-', like --namespace ml-team")
    return namespace
