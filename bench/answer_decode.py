"""What reading the agent's answers with their specs costs on the event path (clusterrun/remote/decode.py), against
what an ``out`` frame costs anyway: the frame decoder and the log relay (rank log file and terminal).

    PYTHONPATH=. python bench/answer_decode.py

An ``out`` frame of one 100-byte line, and one of 40 lines (what bench/flood.py's workers write at a time); the
``exit`` event of an 8-rank node (once per node and attempt).
"""

from __future__ import annotations

import io
import tempfile
import timeit
from pathlib import Path

from clusterrun.launch.console import Console
from clusterrun.launch.relay import LogRelay
from clusterrun.remote import protocol
from clusterrun.remote.decode import decode
from clusterrun.runs import RunDir

ev = {"ev": "out", "rank": 3, "local_rank": 3, "stream": "stdout", "open": False}
one_line = b"R0003 L000000001 " + b"x" * 82 + b"\n"            # 100 bytes, as bench/flood.py prints
payload = one_line * 40                                           # 40 lines per frame (flood.py's writes)
frame = protocol.encode(ev, payload)
stream = frame * 500
N = 20
feed = timeit.timeit(lambda: protocol.FrameDecoder().feed(stream), number=N) / (N * 500)
header = {**ev, "n": len(payload)}
n = 200_000
dec = timeit.timeit(lambda: decode(header, "crn1"), number=n) / n
tmp = tempfile.mkdtemp()
relay = LogRelay(RunDir.create(Path(tmp), "r1"), Console(io.StringIO(), io.StringIO(), color=False), {"crn1": "/x"})
m = 2000
write = timeit.timeit(lambda: relay.write("crn1", 3, "stdout", payload, False), number=m) / m
print(f"per out frame of 40 lines: FrameDecoder.feed {feed*1e6:.2f} us, relay.write {write*1e6:.1f} us; "
      f"decode {dec*1e6:.2f} us (= {dec/(feed+write)*100:.1f}% of the two)")
ex = {"ev": "exit", "rc": 0, "signal": None, "reason": "finished", "time": 1.0, "watch": None, "gpus_after": None,
      "ranks": {str(i): {"rc": 0, "signal": None, "time": None, "started": 1.0} for i in range(8)},
      "logs": {f"{i}/stdout": {"bytes": 10, "sent": 10, "lines": 1} for i in range(8)}}
print(f"decode exit of 8 ranks: {timeit.timeit(lambda: decode(ex, 'crn1'), number=20000)/20000*1e6:.1f} us (once per node)")
one = protocol.encode(ev, one_line) * 5000
feed1 = timeit.timeit(lambda: protocol.FrameDecoder().feed(one), number=10) / (10 * 5000)
write1 = timeit.timeit(lambda: relay.write("crn1", 3, "stdout", one_line, False), number=20000) / 20000
print(f"per out frame of 1 line: FrameDecoder.feed {feed1*1e6:.2f} us, relay.write {write1*1e6:.1f} us; decode {dec*1e6:.2f} us (= {dec/(feed1+write1)*100:.1f}%)")
