"""s3rver (npm's S3 server, installed under tests/integration/s3/node by
docker/setup-debian) on a loopback port with one bucket and a temporary
directory: the S3 store's counterpart for the s3 and fleet suites."""
import os
import shutil
import signal
import subprocess
import tempfile

import support

HERE = os.path.dirname(os.path.abspath(__file__))
S3RVER = os.path.join(HERE, "..", "s3", "node", "node_modules", ".bin", "s3rver")
BUCKET = "acemq-claims"
ACCESS = SECRET = "S3RVER"  # s3rver's own key pair: it checks signatures too


class S3rver:
    """npm's s3rver with one bucket; stop() and start() keep its data."""

    def __init__(self, tls=None):
        self.tls = tls  # (key, cert): s3rver speaks HTTPS
        self.dir = tempfile.mkdtemp(prefix="acemq-s3-")
        self.port = support.free_port()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="acemq-s3rver-", suffix=".log",
                                               delete=False)
        self.proc = None
        self.start()

    def start(self):
        # s3rver's continuation tokens use a cipher OpenSSL 3 keeps in its
        # legacy provider.
        env = dict(os.environ, NODE_OPTIONS="--openssl-legacy-provider")
        self.proc = subprocess.Popen(
            [S3RVER, "-d", self.dir, "-a", "127.0.0.1", "-p", str(self.port), "--silent",
             "--no-vhost-buckets", "--configure-bucket", BUCKET]
            + (["--key", self.tls[0], "--cert", self.tls[1]] if self.tls else []),
            stdout=self.log, stderr=self.log, env=env)
        if not support.wait_until(lambda: support.port_accepts(self.port), 20):
            raise AssertionError("s3rver did not start: " + open(self.log.name).read())

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def object_path(self, key):
        """Where s3rver keeps an object's bytes."""
        parts = key.split("/")
        return os.path.join(self.dir, BUCKET, *parts[:-1], parts[-1] + "._S3rver_object")

    def objects(self, prefix=""):
        """Keys of the bucket under prefix, from s3rver's directory."""
        out = []
        top = os.path.join(self.dir, BUCKET)
        for root, _, files in os.walk(top):
            for f in files:
                if f.endswith("._S3rver_object"):
                    rel = os.path.relpath(os.path.join(root, f[:-len("._S3rver_object")]), top)
                    if rel.startswith(prefix):
                        out.append(rel)
        return sorted(out)

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.log.close()
        os.unlink(self.log.name)
