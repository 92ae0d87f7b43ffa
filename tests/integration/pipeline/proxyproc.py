"""Start and stop a proxy binary on a free loopback port for these tests."""
import signal
import socket
import subprocess
import time

import support  # noqa: E402


def start(argv, env=None, stderr=subprocess.DEVNULL):
    """Run argv plus --listen on a free port; returns (process, port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(argv + ["--listen", f"127.0.0.1:{port}"], env=env, stderr=stderr)
    deadline = time.time() + 10
    while True:
        try:
            if support.port_accepts(port):
                return proc, port
            raise OSError("not listening yet")
        except OSError:
            assert time.time() < deadline and proc.poll() is None, "proxy did not start"
            time.sleep(0.05)


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
