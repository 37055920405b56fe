"""A stand-in for ``nvidia-smi --query-gpu=... -lms N`` (the series' GPU loop) and ``--query-compute-apps``.

Synthetic readings, not a recording: every GPU of ``-i`` (default ``0,1``) at 97 % and 250 W; the energy counter
(``total_energy_consumption``, mJ) grows by 250 W over each interval. ``STANDIN_SMI_LOOP_MODE``: ``ok`` (default),
``hang`` (silent for an hour after ``STANDIN_SMI_LOOP_AFTER`` rounds, 2 by default), ``die`` (exit 3 after
them), ``noenergy`` (refuses the energy field as an older nvidia-smi does). ``STANDIN_SMI_APPS``: the lines
``--query-compute-apps`` prints (``;`` between lines). ``STANDIN_SMI_LOOP_SLOW``: a straggler's GPU (a physical
index): it keeps working at 97 % and 300 W while every other GPU waits at 20 % and 90 W.
"""

import os
import sys
import time


def main(args: list[str]) -> int:
    mode = os.environ.get("STANDIN_SMI_LOOP_MODE", "ok")
    if any(a.startswith("--query-compute-apps=") for a in args):
        apps = os.environ.get("STANDIN_SMI_APPS", "")
        sys.stdout.write("".join(line + "\n" for line in apps.split(";") if line))
        return 0
    fields = next(a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")).split(",")
    if mode == "noenergy" and "total_energy_consumption" in fields:
        print('Field "total_energy_consumption" is not a valid field to query.')
        return 2
    ms = int(args[args.index("-lms") + 1]) if "-lms" in args else 0
    gpus = [int(g) for g in args[args.index("-i") + 1].split(",")] if "-i" in args else [0, 1]
    values = {"utilization.gpu": "97", "memory.used": "30000", "power.draw": "250.00", "temperature.gpu": "61"}
    slow = os.environ.get("STANDIN_SMI_LOOP_SLOW")
    after = int(os.environ.get("STANDIN_SMI_LOOP_AFTER", "2"))
    rounds = 0
    while True:
        for index in gpus:
            row = dict(values, index=str(index))
            if slow:
                waits = str(index) != slow
                row.update({"utilization.gpu": "20" if waits else "97", "power.draw": "90.00" if waits else "300.00"})
            watts = float(row["power.draw"])
            row["total_energy_consumption"] = str(1000000 + int(rounds * watts * ms))
            row["pci.bus_id"] = "00000000:%02X:00.0" % (index + 1)
            print(", ".join(row.get(f, "[N/A]") for f in fields))
        sys.stdout.flush()
        rounds += 1
        if rounds >= after and mode == "hang":
            time.sleep(3600)
        if rounds >= after and mode == "die":
            return 3
        if not ms:
            return 0
        time.sleep(ms / 1000)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
