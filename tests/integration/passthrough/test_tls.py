"""TLS on both legs, with a CA and certificates made by openssl here: pika
over TLS through the proxy to a plain broker and to a TLS broker (a second
RabbitMQ node of the test's own), client certificates required, a wrong CA
or an expired certificate refused with a clear log line, and a reload that
picks up a new certificate while open connections go on."""
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time

import pika
import pytest

import support
from conftest import PROXY_BIN as PROXY

NODE = "acemq-tls@localhost"
TLS_PORT = int(os.environ.get("ACEMQ_TLS_BROKER_PORT", "5681"))
PLAIN_PORT = int(os.environ.get("ACEMQ_TLS_BROKER_PLAIN_PORT", "5683"))
DIST = int(os.environ.get("ACEMQ_TLS_DIST_PORT", "25681"))


def sh(*args, cwd):
    subprocess.run(list(args), cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def make_cert(d, name, ca, cn, days=30, san="DNS:localhost,IP:127.0.0.1"):
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn, cwd=d)
    with open(os.path.join(d, name + ".ext"), "w") as f:
        f.write("subjectAltName=%s\n" % san)
    sh("openssl", "x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
       "-CAcreateserial", "-out", name + ".pem", "-days", str(days), "-extfile", name + ".ext",
       cwd=d)


@pytest.fixture(scope="module")
def pki():
    d = tempfile.mkdtemp(prefix="acemq-tls-")
    os.chmod(d, 0o755)
    for ca in ("ca", "other"):
        sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
           "-nodes", "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "30",
           "-subj", "/CN=acemq-test-" + ca, cwd=d)
    make_cert(d, "server", "ca", "localhost")
    make_cert(d, "server2", "ca", "localhost")
    make_cert(d, "client", "ca", "acemq-client", san="DNS:acemq-client")
    make_cert(d, "expired", "ca", "acemq-expired", days=0, san="DNS:acemq-expired")
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o644)  # the broker node reads them as its own user
    time.sleep(1.1)  # "expired" is now past its notAfter
    yield d
    shutil.rmtree(d, ignore_errors=True)


def p(pki, name):
    return os.path.join(pki, name)


def start_proxy(*extra, upstream=support.BROKER_PORT):
    port, tls_port = support.free_port(), support.free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="acemq-tls-", suffix=".log", delete=False)
    proc = subprocess.Popen([PROXY, "--listen", "127.0.0.1:%d" % port,
                             "--listen-tls", "127.0.0.1:%d" % tls_port,
                             "--upstream", "127.0.0.1:%d" % upstream, "--log-level", "info"]
                            + list(extra), stderr=log)
    deadline = time.time() + 10
    while not support.port_accepts(tls_port):
        assert proc.poll() is None and time.time() < deadline, open(log.name).read()
        time.sleep(0.05)
    return proc, port, tls_port, log.name


def stop_proxy(proc, log):
    proc.terminate()
    assert proc.wait(20) == 0, open(log).read()[-3000:]
    text = open(log).read()
    assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]


def client_ctx(pki, cert=None):
    ctx = ssl.create_default_context(cafile=p(pki, "ca.pem"))
    if cert:
        ctx.load_cert_chain(p(pki, cert + ".pem"), p(pki, cert + ".key"))
    return ctx


def tls_params(pki, port, cert=None):
    return pika.ConnectionParameters("127.0.0.1", port, ssl_options=pika.SSLOptions(
        client_ctx(pki, cert), "localhost"), socket_timeout=10, stack_timeout=20)


def round_trip(params, size=200000):
    """Publish and get back a message (larger than a TLS record)."""
    c = pika.BlockingConnection(params)
    ch = c.channel()
    q = support.unique_name("acemq-tls")
    ch.queue_declare(q, auto_delete=True)
    ch.confirm_delivery()
    body = os.urandom(size)
    ch.basic_publish("", q, body)
    for _ in range(100):
        m = ch.basic_get(q, auto_ack=True)
        if m[0]:
            break
        time.sleep(0.05)
    c.close()
    return m[2] == body


def server_serial(port, pki):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with client_ctx(pki).wrap_socket(raw, server_hostname="localhost") as s:
            der = s.getpeercert(binary_form=True)
    out = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-serial"], input=der,
                         capture_output=True, check=True)
    return out.stdout.strip()


def test_pika_over_tls_to_a_plain_broker(rabbitmq, pki):
    proc, port, tls_port, log = start_proxy("--tls-cert", p(pki, "server.pem"),
                                            "--tls-key", p(pki, "server.key"))
    try:
        assert round_trip(tls_params(pki, tls_port))
        # the plain listener still serves
        assert round_trip(pika.ConnectionParameters("127.0.0.1", port), size=100)
        assert "listening on 127.0.0.1:%d (TLS)" % tls_port in open(log).read()
    finally:
        stop_proxy(proc, log)


def test_client_certificate_required(rabbitmq, pki):
    proc, port, tls_port, log = start_proxy("--tls-cert", p(pki, "server.pem"),
                                            "--tls-key", p(pki, "server.key"),
                                            "--tls-ca", p(pki, "ca.pem"),
                                            "--tls-verify-client", "required")
    try:
        assert round_trip(tls_params(pki, tls_port, cert="client"), size=100)
        with pytest.raises(Exception):
            round_trip(tls_params(pki, tls_port), size=100)
        with pytest.raises(Exception):
            round_trip(tls_params(pki, tls_port, cert="expired"), size=100)
        # the client hears the alert before the proxy writes its line
        assert support.wait_until(lambda: "certificate has expired" in open(log).read(), 10), \
            open(log).read()[-2000:]
        assert "TLS handshake with the client failed" in open(log).read()
    finally:
        stop_proxy(proc, log)


def test_reload_picks_up_a_new_certificate(rabbitmq, pki):
    work = tempfile.mkdtemp(prefix="acemq-tls-reload-")
    cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
    shutil.copy(p(pki, "server.pem"), cert)
    shutil.copy(p(pki, "server.key"), key)
    proc, port, tls_port, log = start_proxy("--tls-cert", cert, "--tls-key", key)
    try:
        first = server_serial(tls_port, pki)
        c = pika.BlockingConnection(tls_params(pki, tls_port))
        shutil.copy(p(pki, "server2.pem"), cert)
        shutil.copy(p(pki, "server2.key"), key)
        proc.send_signal(signal.SIGHUP)
        assert support.wait_until(lambda: server_serial(tls_port, pki) != first, 5)
        # the connection opened before goes on
        c.channel().queue_declare("", exclusive=True)
        c.close()
        # a bad file on reload keeps the certificate in force
        with open(key, "w") as f:
            f.write("not a key\n")
        second = server_serial(tls_port, pki)
        proc.send_signal(signal.SIGHUP)
        assert support.wait_until(lambda: "the certificates in force are kept" in open(log).read(),
                                  10), open(log).read()[-2000:]
        assert server_serial(tls_port, pki) == second
    finally:
        stop_proxy(proc, log)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def tls_broker(pki):
    """A RabbitMQ node of the test's own with a TLS listener."""
    conf = ("listeners.tcp.default = %d\nlisteners.ssl.default = %d\nloopback_users = none\n"
            "ssl_options.cacertfile = %s\nssl_options.certfile = %s\nssl_options.keyfile = %s\n"
            "ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n"
            % (PLAIN_PORT, TLS_PORT, p(pki, "ca.pem"), p(pki, "server.pem"),
               p(pki, "server.key")))
    top = support.start_node(NODE, conf, PLAIN_PORT, DIST, wait_port=TLS_PORT)
    yield TLS_PORT
    support.stop_node(NODE, top)


def test_tls_to_the_broker_and_on_both_legs(pki, tls_broker):
    proc, port, tls_port, log = start_proxy("--tls-cert", p(pki, "server.pem"),
                                            "--tls-key", p(pki, "server.key"),
                                            "--upstream-tls", "1",
                                            "--upstream-tls-ca", p(pki, "ca.pem"),
                                            upstream=tls_broker)
    try:
        assert round_trip(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=10))
        assert round_trip(tls_params(pki, tls_port))
    finally:
        stop_proxy(proc, log)


def broker_certificate_refused(tls_broker, *args):
    """A client through a proxy whose broker certificate does not verify:
    refused, and the log says why."""
    proc, port, tls_port, log = start_proxy("--upstream-tls", "1", *args,
                                            upstream=tls_broker)
    try:
        with pytest.raises(Exception):
            round_trip(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5,
                                                 connection_attempts=1), size=10)
        assert support.wait_until(lambda: "certificate verify failed" in open(log).read(), 5), \
            open(log).read()[-2000:]
    finally:
        stop_proxy(proc, log)


def test_broker_certificate_from_another_ca_is_refused(pki, tls_broker):
    broker_certificate_refused(tls_broker, "--upstream-tls-ca", p(pki, "other.pem"),
                               "--tls-cert", p(pki, "server.pem"), "--tls-key", p(pki, "server.key"))


def test_broker_name_must_match(pki, tls_broker):
    broker_certificate_refused(tls_broker, "--upstream-tls-ca", p(pki, "ca.pem"),
                               "--upstream-tls-name", "broker.example",
                               "--tls-cert", p(pki, "server.pem"), "--tls-key", p(pki, "server.key"))


def test_the_engine_speaks_tls_too(pki, tls_broker):
    """The proxy's own connection (the schedule ladder) to a TLS broker."""
    rules = tempfile.mkdtemp(prefix="acemq-tls-rules-")
    data = tempfile.mkdtemp(prefix="acemq-tls-data-")
    with open(os.path.join(rules, "root.json"), "w") as f:
        f.write('{"vhost": "/", "schedule": {"match": [{"exchange": "x"}]}}')
    admin = support.free_port()
    proc, port, tls_port, log = start_proxy("--upstream-tls", "1",
                                            "--upstream-tls-ca", p(pki, "ca.pem"),
                                            "--tls-cert", p(pki, "server.pem"),
                                            "--tls-key", p(pki, "server.key"),
                                            "--rules", rules, "--data-dir", data,
                                            "--admin", "127.0.0.1:%d" % admin,
                                            "--engine-user", "guest", "--engine-password", "guest",
                                            upstream=tls_broker)

    try:
        assert support.wait_until(lambda: support.engine_ladder_ready(admin), 15), \
            open(log).read()[-2000:]
    finally:
        stop_proxy(proc, log)
        shutil.rmtree(rules, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


def test_the_greetings_probe_speaks_tls_too(pki, tls_broker):
    """The proxy greets clients (a vhost has brokers of its own): the
    connection that asks the TLS broker for its server properties speaks
    TLS, so the very first client sees the broker's properties."""
    rules = tempfile.mkdtemp(prefix="acemq-tls-rules-")
    with open(os.path.join(rules, "v.json"), "w") as f:
        f.write('{"vhost": "acemq-tls-elsewhere", "upstream": ["127.0.0.1:%d"]}' % tls_broker)
    direct = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", PLAIN_PORT,
                                                               socket_timeout=10))
    expected = direct._impl.server_properties
    direct.close()
    proc, port, tls_port, log = start_proxy("--upstream-tls", "1",
                                            "--upstream-tls-ca", p(pki, "ca.pem"),
                                            "--tls-cert", p(pki, "server.pem"),
                                            "--tls-key", p(pki, "server.key"),
                                            "--rules", rules, upstream=tls_broker)
    try:
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port,
                                                              socket_timeout=10))
        seen = c._impl.server_properties
        c.close()
        assert seen["product"] == "RabbitMQ" and seen == expected, seen
    finally:
        stop_proxy(proc, log)
        shutil.rmtree(rules, ignore_errors=True)
