"""acemq-proxy started on a free port with a rules directory and a data
directory (claim check, idempotency, publish dedup, schedule), and a
connection straight to the broker."""
import os
import signal
import socket
import subprocess
import tempfile
import time

import pika

import support

HERE = os.path.dirname(os.path.abspath(__file__))
PROXY = os.environ.get("ACEMQ_PROXY", os.path.join(HERE, "..", "..", "..", "build", "src", "acemq-proxy"))
SANITIZED = os.environ.get("ACEMQ_IT_SANITIZED") == "1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proxy:
    """acemq-proxy on a free port with a rules directory and a data dir."""

    def __init__(self, rules, data, extra=(), upstream="127.0.0.1:5672"):
        self.rules, self.data, self.extra = rules, data, list(extra)
        self.upstream = upstream
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="acemq-cc-", suffix=".log", delete=False)
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            [PROXY, "--listen", "127.0.0.1:%d" % self.port, "--upstream", self.upstream,
             "--rules", self.rules, "--data-dir", self.data, "--log-level", "info"] + self.extra,
            stderr=self.log)
        deadline = time.time() + 10
        while True:
            try:
                if support.port_accepts(self.port):
                    return
                raise OSError("not listening yet")
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise AssertionError("proxy did not start:\n" + self.stderr())
                time.sleep(0.05)

    def stderr(self):
        with open(self.log.name) as f:
            return f.read()

    def status(self, field):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.returncode

    def connect(self, vhost="/"):
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.port, vhost, socket_timeout=30, stack_timeout=60,
            blocked_connection_timeout=120))


def direct(vhost="/"):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", 5672, vhost, socket_timeout=30, stack_timeout=60))
