"""The GPU part of the node's series: one nvidia-smi for the life of the run, printing the run's GPUs every
sample (``--query-gpu ... -lms``), and a bounded ``--query-compute-apps`` now and then for the other processes
on those GPUs.

Why a looping nvidia-smi and not NVML through ctypes: NVML is set up once inside nvidia-smi, so a sample costs
the agent one line read, not a process start (tens of ms of CPU each); and a driver that hangs hangs nvidia-smi,
which the agent kills and starts again, where a hung NVML call would hold one of the agent's own threads for
ever. Whatever goes wrong (no answer within ``silent_after`` seconds, nvidia-smi dying, a field it does not know)
is a gap with its reason in the samples, never a stalled sampler.

Standard library only: this module travels to the nodes with the agent.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

FIELDS = ("index", "utilization.gpu", "memory.used", "power.draw", "temperature.gpu")
KEYS = ("util", "mem", "power", "temp")  # MiB, W, degrees C
ENERGY_FIELD = "total_energy_consumption"  # mJ since the driver loaded, where nvidia-smi knows it (Volta and later)
APP_FIELDS = "gpu_bus_id,pid,used_memory"
BUS_FIELD = "pci.bus_id"
RESTART_AFTER = (1.0, 5.0, 30.0)  # seconds before each new start of a nvidia-smi that ended, then the last again
APPS_TIMEOUT = 10.0
START_GRACE = 20.0  # seconds a new nvidia-smi may take to its first line (NVML's start on 8 GPUs takes seconds)


def _number(text):
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


class GpuLoop:
    """The latest reading of each GPU in ``gpus`` (physical indices; empty: every GPU), from ``tool``."""

    def __init__(self, tool, gpus, every, silent_after=None, apps_every=10.0):
        self.tool = tool
        self.gpus = [int(g) for g in gpus]
        self.every = float(every)
        self.silent_after = silent_after or max(5.0, 3 * self.every)
        self.apps_every = apps_every
        self.energy = True
        self.latest = {}  # index -> reading
        self.bus = {}  # pci bus id -> index
        self.apps = []  # [(index, pid, MiB)]
        self.line_at = time.monotonic()
        self.start_grace = START_GRACE
        self.answered = False  # the running nvidia-smi gave a line
        self.why = None  # what went wrong last, while nothing newer came
        self.proc = None
        self.killed = None  # the nvidia-smi killed for its silence (each one once)
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def start(self):
        threading.Thread(target=self._loop, daemon=True, name="gpuloop").start()
        if self.apps_every > 0:
            threading.Thread(target=self._apps_loop, daemon=True, name="gpuapps").start()

    def close(self):
        self.stop.set()
        self._kill()

    def _kill(self):
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.kill()
            except OSError:
                pass

    def _argv(self, energy):
        fields = ",".join(FIELDS + (BUS_FIELD,) + ((ENERGY_FIELD,) if energy else ()))
        argv = [self.tool, "--query-gpu=" + fields, "--format=csv,noheader,nounits",
                "-lms", str(max(100, int(self.every * 1000)))]
        return argv + (["-i", ",".join(map(str, self.gpus))] if self.gpus else [])

    def _loop(self):
        failures = 0
        while not self.stop.is_set():
            lines, tail, rc = self._run_once()
            if self.stop.is_set():
                return
            if self.energy and not lines and ENERGY_FIELD in tail:
                self.energy = False  # this nvidia-smi does not know the counter: power is integrated instead
                continue
            failures = 0 if lines else failures + 1
            with self.lock:
                if self.why is None:  # a hang's reason stays: it says more than the exit of the killed one
                    self.why = "nvidia-smi ended (exit %s): %s" % (rc, tail or "no output")
            pause = RESTART_AFTER[min(failures, len(RESTART_AFTER) - 1)]
            if self.stop.wait(pause):
                return

    def _run_once(self):
        """Run one nvidia-smi loop until it ends: (lines read, its last words, exit code)."""
        try:
            self.proc = proc = subprocess.Popen(
                self._argv(self.energy), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                universal_newlines=True, env=dict(os.environ, LC_ALL="C"))
        except OSError as exc:
            return 0, "cannot run %s: %s" % (self.tool, exc.strerror or exc), None
        self.line_at, self.answered = time.monotonic(), False
        lines, last = 0, ""
        for line in proc.stdout:
            if self._take(line):
                lines += 1
            elif line.strip():
                last = line.strip()[:300]
        proc.stdout.close()
        try:
            rc = proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            rc = "none: it does not die (a process stuck in the driver)"
        return lines, last, rc

    def _take(self, line):
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < len(FIELDS) + 1 or not cells[0].isdigit():
            return False
        reading = {key: _number(cells[1 + i]) for i, key in enumerate(KEYS)}
        if self.energy and len(cells) > len(FIELDS) + 1:
            mj = _number(cells[len(FIELDS) + 1])
            if mj is not None:
                reading["energy"] = round(mj / 1000.0, 3)  # J
        index = int(cells[0])
        with self.lock:
            self.latest[index] = reading
            self.bus[cells[len(FIELDS)].lower()] = index
            self.line_at, self.answered = time.monotonic(), True
            self.why = None
        return True

    def _apps_loop(self):
        while not self.stop.wait(self.apps_every):
            argv = [self.tool, "--query-compute-apps=" + APP_FIELDS, "--format=csv,noheader,nounits"]
            try:
                done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True,
                                      stdin=subprocess.DEVNULL, timeout=APPS_TIMEOUT, env=dict(os.environ, LC_ALL="C"))
            except (OSError, subprocess.TimeoutExpired):
                continue  # the loop above says what is wrong with nvidia-smi; the processes wait for the next try
            found = []
            for line in done.stdout.splitlines():
                cells = [c.strip() for c in line.split(",")]
                if len(cells) >= 3 and cells[1].isdigit():
                    found.append((cells[0].lower(), int(cells[1]), _number(cells[2])))
            with self.lock:
                self.apps = [(self.bus.get(bus), pid, mem) for bus, pid, mem in found]

    def read(self, now=None):
        """``(readings by index, other processes [(index, pid, MiB)], gap reason or None)``. A nvidia-smi silent
        for ``silent_after`` seconds is killed (and started again by its loop): its readings are a gap meanwhile."""
        now = time.monotonic() if now is None else now
        hung = None
        with self.lock:
            silent = now - self.line_at
            limit = self.silent_after if self.answered else self.start_grace
            if silent > limit and self.proc is not None and self.proc is not self.killed:
                self.why = "nvidia-smi silent for %.0fs (hung: a stuck driver or GPU?); killed, started again" % silent
                hung = self.killed = self.proc
            readings = {} if self.why else dict(self.latest)
            apps = [a for a in self.apps if not self.gpus or a[0] in self.gpus]
            why = self.why
        if hung is not None and hung.poll() is None:
            try:
                hung.kill()  # once: the loop starts the next one, which must not be killed before its first line
            except OSError:
                pass
        return readings, apps, why
