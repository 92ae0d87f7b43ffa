"""A throwaway PostgreSQL cluster: initdb into a temporary directory as the
postgres user, pg_ctl start on a free loopback port with trust
authentication for 127.0.0.1, removed at the end. Used by the postgres
suite, the fleet test and bench/compare."""
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time


def _bindir():
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(d, "initdb")):
            return d
    return None


BINDIR = _bindir()


def available():
    return BINDIR is not None and shutil.which("runuser") is not None and os.geteuid() == 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(*cmd, check=True, timeout=120):
    return subprocess.run(["runuser", "-u", "postgres", "--"] + list(cmd), check=check,
                          timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, cwd="/")


class Cluster:
    """One cluster; url names the database "acemq" (created at start)."""

    def __init__(self, settings=()):
        self.top = tempfile.mkdtemp(prefix="acemq-pg-")
        os.chmod(self.top, 0o755)
        shutil.chown(self.top, "postgres", "postgres")
        self.data = os.path.join(self.top, "data")
        self.port = free_port()
        self.settings = list(settings)
        _as_postgres(os.path.join(BINDIR, "initdb"), "-D", self.data, "-A", "trust",
                     "-U", "postgres", "--no-sync", "-E", "UTF8")
        self.start()
        self.psql("CREATE DATABASE acemq", db="postgres")

    @property
    def url(self):
        return "postgresql://postgres@127.0.0.1:%d/acemq" % self.port

    def url_with_password(self, password):
        """trust authentication: any password is accepted (and must never be shown)."""
        return "postgresql://postgres:%s@127.0.0.1:%d/acemq" % (password, self.port)

    def running(self):
        return _as_postgres(os.path.join(BINDIR, "pg_ctl"), "-D", self.data, "status",
                            check=False).returncode == 0

    def start(self):
        if self.running():
            return
        opts = "-c listen_addresses=127.0.0.1 -p %d -k %s %s" % (
            self.port, self.top, " ".join("-c %s" % s for s in self.settings))
        _as_postgres(os.path.join(BINDIR, "pg_ctl"), "-D", self.data, "-l",
                     os.path.join(self.top, "log"), "-o", opts, "-w", "start")

    def stop(self, mode="fast"):
        _as_postgres(os.path.join(BINDIR, "pg_ctl"), "-D", self.data, "-m", mode, "-w", "stop",
                     check=False)

    def psql(self, sql, db="acemq"):
        """Run sql; the rows as lists of strings."""
        out = subprocess.run(["psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h",
                              "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", db,
                              "-c", sql], check=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, timeout=60)
        return [line.split("|") for line in out.stdout.splitlines() if line]

    def log(self):
        try:
            with open(os.path.join(self.top, "log")) as f:
                return f.read()
        except OSError:
            return ""

    def destroy(self):
        self.stop("immediate")
        shutil.rmtree(self.top, ignore_errors=True)


class HangingListener:
    """A socket that accepts connections and never answers: a database that
    hangs."""

    def __init__(self):
        import threading
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held = []
        self.accepted = 0
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.held.append(c)

    @property
    def url(self):
        return "postgresql://postgres@127.0.0.1:%d/acemq?sslmode=disable" % self.port

    def close(self):
        self.sock.close()
        for c in self.held:
            c.close()


if __name__ == "__main__":
    # Manual use: start one and print its URL until interrupted.
    c = Cluster()
    print(c.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        c.destroy()
