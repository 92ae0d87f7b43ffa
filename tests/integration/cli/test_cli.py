"""The command line, configuration precedence and shutdown of the real binary."""
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time

import pika

PROXY = os.environ.get(
    "ACEMQ_PROXY",
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "build", "src", "acemq-proxy"))
import support  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("ACEMQ_PROXY_")}
    e.update(env or {})
    return subprocess.run([PROXY, *args], capture_output=True, text=True, env=e, timeout=30)


def wait_port(port, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if support.port_accepts(port):
                return
            raise OSError("not listening yet")
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"port {port} never accepted")


def test_version_and_help():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("acemq-proxy ")
    r = run("--help")
    assert r.returncode == 0
    for opt in ("--listen", "--upstream", "--rules", "--data-dir", "--admin",
                "--workers", "--log-level", "--check-config"):
        assert opt in r.stdout


def test_check_config_ok():
    r = run("--check-config", "--listen", "[::1]:5999", "--listen", "127.0.0.1:5998")
    assert r.returncode == 0, r.stderr
    assert "configuration ok" in r.stdout


def test_check_config_reports_every_error_with_where():
    with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
        f.write("# a comment\nworkers = lots\nupstream = nowhere\nbogus = 1\n")
    try:
        r = run("-c", f.name, "--check-config", "--log-level", "shouting",
                env={"ACEMQ_PROXY_BUFFER_LIMIT": "1"})
    finally:
        os.unlink(f.name)
    assert r.returncode == 1
    err = r.stderr
    assert f"{f.name}:2: workers: 'lots' is not a number" in err
    assert f"{f.name}:3: upstream: 'nowhere' is not HOST:PORT" in err
    assert f"{f.name}:4: bogus: unknown setting" in err
    assert "ACEMQ_PROXY_BUFFER_LIMIT: buffer_limit: 1 is out of range" in err
    assert "command line --log-level: log_level: 'shouting'" in err
    assert "5 errors" in err


def test_check_config_runs_the_admin_rule():
    """--check-config refuses what the start refuses: an admin endpoint off
    loopback without a token. Loopback is what the host resolves to, not
    how it is spelt."""
    port = free_port()
    r = run("--check-config", "--admin", f"0.0.0.0:{port}")
    assert r.returncode == 1, r.stdout
    assert "configuration ok" not in r.stdout
    assert f"admin 0.0.0.0:{port}: not a loopback address" in r.stderr
    assert "no admin_token is set" in r.stderr and "1 error" in r.stderr
    # The start refuses it in the same words.
    r = run("--admin", f"0.0.0.0:{port}", "--listen", f"127.0.0.1:{free_port()}")
    assert r.returncode == 1 and "no admin_token is set" in r.stderr
    assert "not starting" in r.stderr
    # A name that only begins like a loopback address is resolved.
    r = run("--check-config", "--admin", f"127.0.0.1.invalid:{port}")
    assert r.returncode == 1 and "127.0.0.1.invalid does not resolve" in r.stderr, r.stderr
    # With a token, or on loopback (by name too), it checks.
    for args in (["--admin", f"0.0.0.0:{port}", "--admin-token", "t"],
                 ["--admin", f"localhost:{port}"], ["--admin", f"[::1]:{port}"],
                 ["--admin", f"127.0.0.2:{port}"]):
        r = run("--check-config", *args)
        assert r.returncode == 0, (args, r.stderr)
        assert "configuration ok" in r.stdout


def test_check_config_runs_the_start_checks():
    """The checks the start makes beyond the settings are made by
    --check-config too: TLS files, addresses that do not resolve."""
    r = run("--check-config", "--listen-tls", f"127.0.0.1:{free_port()}")
    assert r.returncode == 1 and "TLS: listen_tls needs tls_cert and tls_key" in r.stderr
    r = run("--check-config", "--listen", f"no-such-host.invalid:{free_port()}")
    assert r.returncode == 1 and "cannot resolve" in r.stderr, r.stderr
    r = run("--check-config", "--upstream-tls", "1", "--upstream-proxy-protocol", "1")
    assert r.returncode == 1 and "together are not supported" in r.stderr


def test_bad_config_refuses_to_start():
    r = run("--upstream", "x")
    assert r.returncode == 1
    assert "not starting" in r.stderr


def test_precedence_cli_over_env_over_file():
    """Each source names a different listen port; the one that wins is the
    one the proxy really listens on."""
    p_file, p_env, p_cli = free_port(), free_port(), free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
        f.write(f"listen = 127.0.0.1:{p_file}\nlog_level = debug\n")
    try:
        for args, env, want in (
            (["-c", f.name], {}, p_file),
            (["-c", f.name], {"ACEMQ_PROXY_LISTEN": f"127.0.0.1:{p_env}"}, p_env),
            (["-c", f.name, "--listen", f"127.0.0.1:{p_cli}"],
             {"ACEMQ_PROXY_LISTEN": f"127.0.0.1:{p_env}"}, p_cli),
        ):
            e = {k: v for k, v in os.environ.items() if not k.startswith("ACEMQ_PROXY_")}
            e.update(env)
            proc = subprocess.Popen([PROXY, *args], env=e, stderr=subprocess.PIPE, text=True)
            try:
                wait_port(want)
                c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", want))
                assert c.is_open
                c.close()
            finally:
                proc.send_signal(signal.SIGTERM)
                _, err = proc.communicate(timeout=20)
            assert f"listening on 127.0.0.1:{want}" in err
    finally:
        os.unlink(f.name)


def test_ipv6_listen():
    port = free_port()
    proc = subprocess.Popen([PROXY, "--listen", f"[::1]:{port}"], stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 10
        while True:
            try:
                s = socket.create_connection(("::1", port), timeout=1)
                break
            except OSError:
                assert time.time() < deadline
                time.sleep(0.05)
        s.sendall(b"AMQP\x00\x00\x09\x01")
        # connection.start from the broker arrives through the proxy
        head = s.recv(7)
        assert head[0] == 1 and struct.unpack(">H", head[1:3])[0] == 0
        s.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_sigterm_drains_then_closes_with_320():
    port = free_port()
    proc = subprocess.Popen([PROXY, "--listen", f"127.0.0.1:{port}",
                             "--drain-timeout-ms", "1500"], stderr=subprocess.PIPE, text=True)
    try:
        wait_port(port)
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = c.channel()
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        # No new connections once draining.
        time.sleep(0.3)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            refused = False
        except OSError:
            refused = True
        assert refused
        # The open connection keeps working during the drain...
        ch.queue_declare("", exclusive=True)
        # ...and is closed with 320 when the drain time is up.
        reason = None
        try:
            while time.time() - t0 < 10:
                c.process_data_events(time_limit=0.2)
        except pika.exceptions.ConnectionClosedByBroker as e:
            reason = (e.reply_code, e.reply_text)
        elapsed = time.time() - t0
        assert reason is not None and reason[0] == 320, reason
        assert 1.2 < elapsed < 6, elapsed
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


MAN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "acemq-proxy.8")


def test_man_page_names_every_setting_and_signal():
    """acemq-proxy(8) keeps up with the settings table: every setting --help
    lists has its entry, and the signals the proxy handles are there."""
    helptext = run("--help").stdout
    names = [line.split()[0] for line in helptext.split("settings:")[1].splitlines()
             if line.startswith("  ") and line.split()]
    assert len(names) >= 20
    with open(MAN) as f:
        man = f.read()
    entries = {line[len(".B "):].strip() for line in man.splitlines() if line.startswith(".B ")}
    missing = [n for n in names if n not in entries]
    assert not missing, "settings missing from acemq-proxy.8: %s" % missing
    for sig in ("SIGTERM", "SIGINT", "SIGHUP"):
        assert sig in man
