"""The container runtime as the node agent calls it: the run's command, the ready check's questions, removal by label.

The spec's ``container`` (``protocol.CONTAINER``) is the plan's container command in parts (clusterrun/planning/container.py
builds it): ``head``, then ``--env NAME`` per variable (values come from the client's own environment, never an
argv), then the user's ``options``, the ``image`` and torchrun's argv. Every call of the runtime here is bounded:
a runtime that hangs (a stuck daemon, a dead registry) costs at most its timeout, and says so.

Standard library only: this module travels to the nodes with the agent.
"""

import os
import shutil
import subprocess
import time

if __package__:
    from clusterrun.remote import wire
else:
    import wire

#: Seconds for a quick question to the runtime (version, image inspect, ps, rm).
ASK_TIMEOUT = 20.0
#: Seconds an image pull may take on a node; every PULL_REPORT seconds of it the node says it still pulls.
PULL_TIMEOUT, PULL_REPORT = 1200.0, 10.0
#: The event of a pull in progress (image, seconds): clusterrun shows it per node.
PULLING = "pulling"
#: Seconds for the image's Python to say its torch version.
TORCH_TIMEOUT = 120.0
#: Where a node remembers the torch version an image's python has (by image id and interpreter): an image does
#: not change under its id, so only the first launch with it pays for a container start in the check.
KNOWN = "~/.clusterrun/cache/images"

_TORCH = ("import importlib.util as u, glob, os, sys\n"
          "f = u.find_spec('torch')\n"
          "if f is None: print('NOTORCH ' + sys.executable); sys.exit(0)\n"
          "d = [os.path.basename(p)[6:-10] for l in f.submodule_search_locations or ()"
          " for p in glob.glob(os.path.join(os.path.dirname(l), 'torch-*.dist-info'))]\n"
          "print('TORCH ' + (d[0] if len(d) == 1 else 'unknown'))\n")


def _home(token: str) -> str:
    """``~/`` as the node user's home, at the start of a token and after a ``:`` (a mount's two paths)."""
    return ":".join(os.path.expanduser(part) if part.startswith("~/") else part for part in token.split(":"))


def argv(container: dict, env_names: list, command: list) -> list:
    """The runtime's argv that runs ``command`` inside the image."""
    env = []
    if container["runtime"] != "apptainer":
        for name in env_names:
            env += ["--env", name]
    return [*map(_home, container["head"]), *env, *container["options"], container["image"], *command]


def _run(args: list, timeout: float, env: "dict | None" = None) -> "tuple[int | None, str]":
    """(exit code or None on timeout, output)."""
    try:
        proc = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, ""
    except OSError as exc:
        return 127, str(exc.strerror or exc)
    return proc.returncode, proc.stdout.decode("utf-8", errors="replace").strip()


def _pull(runtime: str, image: str, env: dict) -> "tuple[int | None, str]":
    """``runtime pull image``, bounded by PULL_TIMEOUT, saying every PULL_REPORT seconds that it goes on."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen([runtime, "pull", image], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env)
    except OSError as exc:
        return 127, str(exc.strerror or exc)
    while True:
        try:
            out, _ = proc.communicate(timeout=PULL_REPORT)
            return proc.returncode, out.decode("utf-8", errors="replace").strip()
        except subprocess.TimeoutExpired:
            seconds = time.monotonic() - started
            if seconds >= PULL_TIMEOUT:
                proc.kill()
                proc.communicate()
                return None, ""
            wire.emit({"ev": PULLING, "image": image, "seconds": round(seconds)})


def _filters(labels: dict) -> list:
    out = []
    for key, value in sorted(labels.items()):
        out += ["--filter", "label=%s=%s" % (key, value)]
    return out


def listed(runtime: str, labels: dict, timeout: float = ASK_TIMEOUT, env: "dict | None" = None) -> list:
    """The ids of the containers (running or not) that carry every label of ``labels``."""
    if runtime == "apptainer" or shutil.which(runtime) is None:
        return []
    code, out = _run([runtime, "ps", "-aq", *_filters(labels)], timeout, env)
    return out.split() if code == 0 else []


def remove(runtime: str, labels: dict, timeout: float = ASK_TIMEOUT, env: "dict | None" = None) -> list:
    """Remove (``rm -f``: killed first) every container with ``labels``: the ids removed. Apptainer keeps none."""
    ids = listed(runtime, labels, timeout, env)
    if ids:
        _run([runtime, "rm", "-f", *ids], timeout, env)
    return ids


def _short(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[:300]


def check(container: dict, python: str, env: dict) -> dict:
    """The ready check's container part: the runtime answers, the image is here (pulled as ``pull`` says), the
    mount sources exist, and the image's ``python`` has torch. ``env``: the job's environment (the runtime's
    settings, such as CONTAINERS_CONF or DOCKER_HOST, may be there). Returns {"problems", "image_id", "torch",
    "pulled"}."""
    runtime, image = container["runtime"], container["image"]
    out = {"problems": [], "image_id": None, "torch": None, "pulled": False}
    problems = out["problems"]
    if shutil.which(runtime) is None:
        problems.append("the container runtime %r is not installed on this node; install it, or set "
                        "container.runtime to one the node has (docker, podman, apptainer)" % runtime)
        return out
    for spec in container.get("mounts") or ():
        src = _home(spec.split(":")[0])
        if not os.path.exists(src):
            problems.append("the mount source %s does not exist on this node; create it there or remove %r "
                            "from container.mounts" % (src, spec))
    if runtime == "apptainer":
        if not os.path.exists(_home(image)):
            problems.append("the image %s is not on this node; copy the .sif there" % image)
        return out
    # One question when all is well (the image's id proves the runtime answers); `version` only when the answer
    # is no, to tell a runtime that does not work from an image that is not there.
    inspect = [runtime, "image", "inspect", "--format", "{{.Id}}", image]
    code, text = _run(inspect, ASK_TIMEOUT, env)
    present = code == 0 and text
    if not present:
        code, said = _run([runtime, "version"], ASK_TIMEOUT, env) if code is not None else (None, "")
        if code is None:
            problems.append("`%s` did not answer within %gs (a stuck daemon?); restart %s there"
                            % (runtime, ASK_TIMEOUT, runtime))
            return out
        if code != 0:
            problems.append("`%s version` failed: %s" % (runtime, _short(said)))
            return out
    if container["pull"] == "always" or (not present and container["pull"] == "missing"):
        code, pulled = _pull(runtime, image, env)
        if code is None:
            problems.append("pulling %s took longer than %gs; pull it there beforehand" % (image, PULL_TIMEOUT))
            return out
        if code != 0 and not present:
            problems.append("cannot pull %s: %s; check the image name, or put the image on the node and set "
                            "container.pull: never" % (image, _short(pulled)))
            return out
        out["pulled"] = code == 0
        code, text = _run(inspect, ASK_TIMEOUT, env)
        present = code == 0 and text
    if not present:
        problems.append("the image %s is not on this node (container.pull: never); pull or load it there"
                        % image)
        return out
    out["image_id"] = text.split()[0]
    import hashlib  # here, not at the top: every agent start would load OpenSSL for a container run's sake

    known = os.path.join(os.path.expanduser(KNOWN), hashlib.sha256(
        ("%s\0%s\0%s" % (runtime, out["image_id"], python)).encode()).hexdigest()[:32])
    try:
        with open(known) as fh:
            out["torch"] = fh.read().strip()
        return out
    except OSError:
        pass
    # The job's workdir may be its code directory, which is staged later: the check runs where the image says.
    head = container["head"]
    at = head.index("--workdir") if "--workdir" in head else len(head)
    code, text = _run(argv(dict(container, head=head[:at] + head[at + 2:]), [], [python, "-c", _TORCH]),
                      TORCH_TIMEOUT, env)
    if code is None:  # the client was killed: its container may live on
        remove(runtime, container["labels"], env=env)
    said = [line for line in text.splitlines() if line.startswith(("TORCH ", "NOTORCH "))]
    if code is None:
        problems.append("the image %s did not start within %gs" % (image, TORCH_TIMEOUT))
    elif not said:
        problems.append("the image %s could not run %s: %s" % (image, python, _short(text)))
    elif said[-1].startswith("NOTORCH"):
        problems.append("%s in the image %s has no torch; use an image with torch (e.g. an NGC PyTorch "
                        "image) or set `python` to the image's interpreter that has it" % (python, image))
    else:
        out["torch"] = said[-1].split(" ", 1)[1]
        try:
            os.makedirs(os.path.dirname(known), exist_ok=True)
            with open(known + ".%d" % os.getpid(), "w") as fh:
                fh.write(out["torch"])
            os.replace(known + ".%d" % os.getpid(), known)
        except OSError:
            pass  # asked again next time
    return out
