"""Network probes that doctor runs on the nodes (standard library only; the launch's own path check is done by the
node agent, see session.py).

``listen ADDR PORT SECONDS``: listen on ADDR:PORT (0: any free port), print ``LISTENING <port>``, then for each
connection print ``RECEIVED <bytes> <seconds>`` once its sender is done; it stops after SECONDS or when its
stdin closes (clusterrun went away).
``send ADDR PORT SECONDS [CONNECT_TIMEOUT]``: connect (within CONNECT_TIMEOUT, default 5 s) and send as fast as
possible for SECONDS; prints ``SENT <bytes>``, or ``FAILED <reason>`` when the connect does not get through.
``connect ADDR PORT TIMEOUT``: one TCP connect; prints ``CONNECTED`` or ``FAILED <reason>``.
The receiver's count over the receiver's time is the measure: a sender's count includes what is still in
socket buffers. Runs under any Python 3 the node has (it is sent inline, as ``python -c``).
"""
import os
import socket
import sys
import threading
import time

mode = sys.argv[1]
if mode == "listen":
    addr, port, seconds = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    srv = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((addr, port))
    except OSError as exc:
        print("FAILED %s" % (exc.strerror or exc), flush=True)
        sys.exit(1)
    srv.listen(64)
    print("LISTENING %d" % srv.getsockname()[1], flush=True)
    def watch():
        sys.stdin.read()
        os._exit(0)
    threading.Thread(target=watch, daemon=True).start()
    def serve(conn):
        total, first, last = 0, None, None
        conn.settimeout(seconds)
        try:
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    break
                now = time.monotonic()
                first = first or now
                last = now
                total += len(data)
        except OSError:
            pass
        conn.close()
        if total:
            print("RECEIVED %d %.6f" % (total, (last - first) if last and first and last > first else 0.0), flush=True)
    srv.settimeout(0.5)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
    os._exit(0)
elif mode == "send":
    addr, port, seconds = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 5.0
    try:
        s = socket.create_connection((addr, port), timeout=timeout)
    except OSError as exc:
        print("FAILED %s" % ("timed out after %gs" % timeout if isinstance(exc, socket.timeout) else exc.strerror or exc),
              flush=True)
        sys.exit(1)
    buf = b"\0" * (1 << 20)
    total, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        total += s.send(buf)
    s.shutdown(socket.SHUT_WR)
    s.settimeout(10)
    try:
        s.recv(1)
    except OSError:
        pass
    print("SENT %d" % total, flush=True)
elif mode == "connect":
    addr, port, timeout = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    try:
        socket.create_connection((addr, port), timeout=timeout).close()
        print("CONNECTED", flush=True)
    except OSError as exc:
        print("FAILED %s" % ("timed out after %gs" % timeout if isinstance(exc, socket.timeout) else exc.strerror or exc),
              flush=True)
