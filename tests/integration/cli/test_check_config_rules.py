"""--check-config reads the rules directory as a reload does: a FIFO named
*.json used to hang it (and so the systemd unit's ExecStartPre), a
directory named x.json was "not valid JSON", and an escaped NUL cut a vhost
name short without a word."""
import os
import shutil
import subprocess
import tempfile

import pytest

PROXY = os.environ.get(
    "ACEMQ_PROXY",
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "build", "src", "acemq-proxy"))


@pytest.fixture
def rules_dir():
    d = tempfile.mkdtemp(prefix="acemq-check-rules-")
    with open(os.path.join(d, "ok.json"), "w") as f:
        f.write('{"vhost": "ok"}')
    yield d
    shutil.rmtree(d, ignore_errors=True)


def check(rules_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACEMQ_PROXY_")}
    # The timeout bounds a hang: a check that waits on the FIFO fails here.
    return subprocess.run([PROXY, "--check-config", "--rules", rules_dir], capture_output=True,
                          text=True, env=env, timeout=20)


def test_check_config_refuses_a_fifo_and_a_directory_at_once(rules_dir):
    assert check(rules_dir).returncode == 0
    os.mkfifo(os.path.join(rules_dir, "fifo.json"))
    os.mkdir(os.path.join(rules_dir, "x.json"))
    r = check(rules_dir)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{rules_dir}/fifo.json: (file): not a regular file (a FIFO)" in r.stderr
    assert f"{rules_dir}/x.json: (file): not a regular file (a directory)" in r.stderr
    assert "2 errors in the configuration" in r.stderr
    assert "configuration ok" not in r.stdout


def test_check_config_follows_a_symlink_to_a_regular_file(rules_dir):
    # How a Kubernetes ConfigMap mounts its files.
    os.mkdir(os.path.join(rules_dir, "..data"))
    with open(os.path.join(rules_dir, "..data", "linked.json"), "w") as f:
        f.write('{"vhost": "linked"}')
    os.symlink("..data/linked.json", os.path.join(rules_dir, "linked.json"))
    r = check(rules_dir)
    assert r.returncode == 0, r.stderr
    assert "configuration ok" in r.stdout


def test_check_config_refuses_a_nul_in_a_vhost_name(rules_dir):
    with open(os.path.join(rules_dir, "v.json"), "w") as f:
        f.write('{"vhost": "v\\u0000x"}')
    r = check(rules_dir)
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"{rules_dir}/v.json: vhost: the string holds an escaped NUL (\\u0000), which "
            "would cut it short") in r.stderr
