"""Helpers shared by the integration tests (broker control, pika shortcuts)."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid

import pika

HOST = "127.0.0.1"
BROKER_PORT = int(os.environ.get("ACEMQ_IT_BROKER_PORT", "5672"))


def unique_name(prefix="acemq-it"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:16])


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((HOST, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def silent_listener():
    """A listening socket whose accept queue is full, so connects to it hang;
    returns it and the sockets that fill the queue (close them all after)."""
    lst = socket.socket()
    lst.bind((HOST, 0))
    lst.listen(0)
    fillers = []
    for _ in range(4):
        f = socket.socket()
        f.setblocking(False)
        try:
            f.connect(lst.getsockname())
        except BlockingIOError:
            pass
        fillers.append(f)
    time.sleep(0.2)
    return lst, fillers


def closing_listener():
    """A listener that accepts each connection and closes it at once, as a
    node that is starting or stopping may; returns it (close it after)."""
    import threading
    lst = socket.socket()
    lst.bind((HOST, 0))
    lst.listen(16)

    def run():
        while True:
            try:
                c, _ = lst.accept()
            except OSError:
                return
            c.close()
    threading.Thread(target=run, daemon=True).start()
    return lst


def port_accepts(port, host=HOST, timeout=0.5):
    """Whether something listens on the port. A connect to a free port in
    the ephemeral range can pick that same port as its source and connect
    to itself (TCP simultaneous open): that is not a listener."""
    try:
        s = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return False
    own = s.getsockname() == s.getpeername()
    s.close()
    return not own


def params(port, **kw):
    kw.setdefault("connection_attempts", 1)
    kw.setdefault("socket_timeout", 10)
    kw.setdefault("stack_timeout", 20)
    return pika.ConnectionParameters(host=HOST, port=port,
                                     credentials=pika.PlainCredentials("guest", "guest"), **kw)


def connect(port, **kw):
    return pika.BlockingConnection(params(port, **kw))


def safe_close(conn):
    try:
        if conn is not None and conn.is_open:
            conn.close()
    except Exception:
        pass


# --------------------------------------------------------------------------
# broker control


def rabbitmqctl(*args, timeout=60, check=True):
    proc = subprocess.run(["rabbitmqctl", "-q"] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout, universal_newlines=True)
    if check and proc.returncode != 0:
        raise RuntimeError("rabbitmqctl %s failed (%d): %s %s" % (" ".join(args), proc.returncode,
                                                                 proc.stdout, proc.stderr))
    return proc


def broker_status_ok():
    try:
        return rabbitmqctl("ping", timeout=30, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def broker_answers(port=BROKER_PORT):
    """True once an AMQP connection to the broker can be opened and used."""
    try:
        conn = connect(port, socket_timeout=3, stack_timeout=5, blocked_connection_timeout=5)
    except Exception:
        return False
    try:
        ch = conn.channel()
        ch.queue_declare("", exclusive=True)
        return True
    except Exception:
        return False
    finally:
        safe_close(conn)


def wait_broker(timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker_answers():
            return True
        time.sleep(0.5)
    return False


def ensure_rabbitmq(timeout=60):
    # A broker that answers AMQP is up. (RabbitMQ 3.10's `rabbitmqctl status`
    # fails once a test has changed the memory watermark at run time, so it
    # is not the judge.)
    if wait_broker(5):
        return
    # the project's starter: it gives the broker enough open files
    subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "broker"),
                    "start"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker_status_ok() or broker_answers():
            break
        time.sleep(1)
    else:
        raise RuntimeError("RabbitMQ did not come up within %d s" % timeout)
    if not wait_broker(max(deadline - time.monotonic(), 10)):
        raise RuntimeError("RabbitMQ status is ok but port %d does not answer AMQP" % BROKER_PORT)


def broker_pids():
    """PIDs of the broker's Erlang VM (beam.smp)."""
    out = subprocess.run(["pgrep", "-f", "beam.smp"], stdout=subprocess.PIPE,
                         universal_newlines=True).stdout.split()
    pids = []
    for pid in out:
        try:
            with open("/proc/%s/comm" % pid) as f:
                comm = f.read().strip()
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        # pgrep -f also matches shells whose command line mentions beam.smp
        if comm.startswith("beam") and b"rabbit" in cmdline:
            pids.append(int(pid))
    return pids


def queue_depth(port, queue):
    """(message_count, consumer_count) of a queue via passive declare."""
    conn = connect(port)
    try:
        ok = conn.channel().queue_declare(queue, passive=True)
        return ok.method.message_count, ok.method.consumer_count
    finally:
        safe_close(conn)


def queue_stats(queue):
    """(ready, unacknowledged, consumers) as the broker itself reports them."""
    out = rabbitmqctl("list_queues", "name", "messages_ready", "messages_unacknowledged",
                      "consumers", "--no-table-headers").stdout
    for line in out.splitlines():
        parts = line.split("\t")
        if parts and parts[0] == queue:
            return int(parts[1]), int(parts[2]), int(parts[3])
    raise AssertionError("queue %r not listed by rabbitmqctl: %r" % (queue, out))


def drain(port, queue, limit=100000):
    """Fetch everything from a queue with auto-ack; returns [(properties, body)]."""
    conn = connect(port)
    try:
        ch = conn.channel()
        out = []
        for _ in range(limit):
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            out.append((props, body))
        return out
    finally:
        safe_close(conn)


def engine_ladder_ready(admin_port, vhost="/"):
    """Whether the proxy's own connection for vhost has declared the
    schedule ladder (GET /stats on the admin endpoint)."""
    import json
    import urllib.request
    with urllib.request.urlopen("http://127.0.0.1:%d/stats" % admin_port, timeout=5) as r:
        return json.loads(r.read())["engines"].get(vhost, {}).get("ladder_ready") == 1


def wait_until(predicate, timeout, interval=0.05, pump=None):
    """Poll predicate until true or timeout; pump(interval) is called between
    polls (e.g. a pika connection's process_data_events)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        if pump is not None:
            pump(interval)
        else:
            time.sleep(interval)


def start_node(name, conf, node_port, dist_port, wait_port=None, timeout=90):
    """A RabbitMQ node of a test's own (settings such as proxy_protocol or a
    TLS listener apply to a whole broker): conf is its rabbitmq.conf text.
    Returns its directory, for stop_node."""
    top = tempfile.mkdtemp(prefix="acemq-node-")
    os.chmod(top, 0o777)
    with open(os.path.join(top, "rabbitmq.conf"), "w") as f:
        f.write(conf)
    with open(os.path.join(top, "enabled_plugins"), "w") as f:
        f.write("[].\n")
    for f in ("rabbitmq.conf", "enabled_plugins"):
        os.chmod(os.path.join(top, f), 0o644)
    env = dict(os.environ, RABBITMQ_NODENAME=name, RABBITMQ_NODE_PORT=str(node_port),
               RABBITMQ_DIST_PORT=str(dist_port),
               RABBITMQ_CONFIG_FILE=os.path.join(top, "rabbitmq.conf"),
               RABBITMQ_MNESIA_BASE=os.path.join(top, "mnesia"),
               RABBITMQ_LOG_BASE=os.path.join(top, "log"),
               RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(top, "enabled_plugins"),
               RABBITMQ_PID_FILE=os.path.join(top, "pid"))
    subprocess.run(["rabbitmq-server", "-detached"], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=60)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if rabbitmqctl("-n", name, "ping", check=False).returncode == 0 and \
                port_accepts(wait_port or node_port):
            return top
        time.sleep(0.5)
    stop_node(name, top)
    raise RuntimeError("RabbitMQ node %s did not start within %d s" % (name, timeout))


def stop_node(name, top):
    rabbitmqctl("-n", name, "stop", check=False)
    shutil.rmtree(top, ignore_errors=True)


class HoldingRelay:
    """A TCP relay to the broker whose broker-to-client direction can be
    held: while held, what the broker sends (confirms, deliveries) waits in
    the relay, so a test can keep a publish unconfirmed for as long as it
    needs instead of racing the broker. Use as a context manager."""

    def __init__(self, target=(HOST, BROKER_PORT)):
        import threading
        self.target = target
        self.flowing = threading.Event()
        self.flowing.set()
        self.lst = socket.socket()
        self.lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lst.bind((HOST, 0))
        self.lst.listen(64)
        self.port = self.lst.getsockname()[1]
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import threading
        while True:
            try:
                c, _ = self.lst.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.target, timeout=10)
            except OSError:
                c.close()
                continue
            u.settimeout(None)
            self.socks += [c, u]
            threading.Thread(target=self._copy, args=(c, u, None), daemon=True).start()
            threading.Thread(target=self._copy, args=(u, c, self.flowing), daemon=True).start()

    @staticmethod
    def _copy(src, dst, gate):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if gate is not None:
                    gate.wait()
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def hold(self):
        self.flowing.clear()

    def release(self):
        self.flowing.set()

    def close(self):
        self.release()
        self.lst.close()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def admin_request(port, method, path, token=None, body=None, timeout=30, with_headers=False):
    """One request to a proxy's admin endpoint, with the token as a bearer
    when given and body (str or bytes) as JSON: (status, the answer parsed
    as JSON, or its bytes when it is not JSON[, its headers])."""
    import http.client
    import json
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    headers = {"Authorization": "Bearer " + token} if token else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    got = dict(r.getheaders())
    c.close()
    try:
        answer = json.loads(data)
    except ValueError:
        answer = data
    return (r.status, answer, got) if with_headers else (r.status, answer)


def fresh_vhost(name, user="guest"):
    """The vhost made anew on the broker, user allowed everything in it."""
    rabbitmqctl("delete_vhost", name, check=False)
    rabbitmqctl("add_vhost", name)
    rabbitmqctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
