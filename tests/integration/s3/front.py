"""A verifying front for s3rver: every request's SigV4 signature is
recomputed with botocore (an independent signer) and a mismatch is answered
403 without reaching s3rver; the rest is passed on. It also answers the two
calls s3rver 3.7 does not implement, AbortMultipartUpload and
ListMultipartUploads, from s3rver's own upload directories, and records the
shape of every request it verified."""
import hashlib
import http.client
import http.server
import os
import re
import shutil
import socketserver
import threading
import time
import urllib.parse
from xml.sax.saxutils import escape

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.utils import percent_encode

AUTH_RE = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, "
                     r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$")


def botocore_signature(method, host, raw_path, query_pairs, headers, amz_date, access, secret,
                       region):
    """botocore's signature and canonical request for a request whose path
    and query are given decoded; the path is encoded as botocore's S3
    serializer encodes keys."""
    url = "http://%s%s" % (host, percent_encode(raw_path, safe="/~"))
    req = AWSRequest(method=method, url=url, params=list(query_pairs), headers=dict(headers))
    req.context["timestamp"] = amz_date
    auth = S3SigV4Auth(Credentials(access, secret), "s3", region)
    canonical = auth.canonical_request(req)
    return auth.signature(auth.string_to_sign(req, canonical), req), canonical


def shape(method, query, headers):
    names = sorted(k for k, _ in query)
    s = method + ("?" + "&".join(names) if names else "")
    if "range" in headers:
        s += " +range"
    return s


class Front:
    def __init__(self, upstream_port, s3_dir, access="S3RVER", secret="S3RVER",
                 region="us-east-1"):
        self.upstream_port, self.s3_dir = upstream_port, s3_dir
        self.access, self.secret, self.region = access, secret, region
        self.verified, self.rejected, self.shapes = 0, [], set()
        self.fail_next = 0  # answer this many requests 503 (a flaky store)
        self.failed = 0
        self.connections = 0  # TCP connections accepted
        self.lock = threading.Lock()
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def setup(self):
                super().setup()
                with front.lock:
                    front.connections += 1

            def do_any(self):
                front.handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_any

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    # ---- verification ----

    def verify(self, h, body):
        """None when the signature is right, else why not."""
        auth = h.headers.get("Authorization", "")
        m = AUTH_RE.match(auth)
        if not m:
            return "no SigV4 Authorization header: %r" % auth
        access, day, region, signed, sig = m.groups()
        if access != self.access or region != self.region:
            return "credential scope %s/%s" % (access, region)
        amz_date = h.headers.get("x-amz-date", "")
        if amz_date[:8] != day:
            return "x-amz-date %s is not of the scope's day %s" % (amz_date, day)
        names = signed.split(";")
        for must in ("host", "x-amz-date", "x-amz-content-sha256"):
            if must not in names:
                return "%s is not signed" % must
        for present in ("range", "content-type"):
            if h.headers.get(present) is not None and present not in names and not (
                    present == "content-type" and h.command in ("GET", "HEAD", "DELETE")):
                return "%s is sent but not signed" % present
        want_hash = h.headers.get("x-amz-content-sha256", "")
        if want_hash != hashlib.sha256(body).hexdigest():
            return "x-amz-content-sha256 is not the body's hash"
        headers = {}
        for n in names:
            v = h.headers.get(n)
            if v is None:
                return "signed header %s is missing" % n
            headers[n] = v
        parts = urllib.parse.urlsplit(h.path)
        raw_path = urllib.parse.unquote(parts.path)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        expected, canonical = botocore_signature(h.command, headers["host"], raw_path, query,
                                                 headers, amz_date, self.access, self.secret,
                                                 self.region)
        if expected != sig:
            return "signature mismatch; botocore's canonical request:\n" + canonical
        with self.lock:
            self.verified += 1
            self.shapes.add(shape(h.command, query, h.headers))
        return None

    # ---- what s3rver lacks ----

    def uploads_dir(self, bucket):
        return os.path.join(self.s3_dir, bucket, "._S3rver_uploads")

    def open_uploads(self, bucket, prefix=""):
        d = self.uploads_dir(bucket)
        out = []
        if os.path.isdir(d):
            for uid in sorted(os.listdir(d)):
                try:
                    with open(os.path.join(d, uid, "key")) as f:
                        key = f.read()
                    when = os.stat(os.path.join(d, uid)).st_mtime
                except OSError:
                    continue
                if key.startswith(prefix):
                    out.append((key, uid, when))
        return out

    def list_uploads(self, h, bucket, query):
        prefix = dict(query).get("prefix", "")
        items = "".join(
            "<Upload><Key>%s</Key><UploadId>%s</UploadId><Initiated>%s</Initiated></Upload>"
            % (escape(k), escape(u), time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(w)))
            for k, u, w in self.open_uploads(bucket, prefix))
        body = ('<?xml version="1.0" encoding="UTF-8"?><ListMultipartUploadsResult>'
                "<Bucket>%s</Bucket><Prefix>%s</Prefix><IsTruncated>false</IsTruncated>%s"
                "</ListMultipartUploadsResult>" % (escape(bucket), escape(prefix), items))
        self.answer(h, 200, body.encode(), "application/xml")

    def abort_upload(self, h, bucket, upload_id):
        d = os.path.join(self.uploads_dir(bucket), os.path.basename(upload_id))
        if not os.path.isdir(d):
            self.answer(h, 404, b"<Error><Code>NoSuchUpload</Code></Error>", "application/xml")
            return
        shutil.rmtree(d, ignore_errors=True)
        self.answer(h, 204, b"")

    # ---- plumbing ----

    def answer(self, h, status, body, ctype=None, headers=()):
        h.send_response(status)
        if ctype:
            h.send_header("Content-Type", ctype)
        for k, v in headers:
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def handle(self, h):
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else b""
        with self.lock:
            flaky = self.fail_next > 0
            if flaky:
                self.fail_next -= 1
                self.failed += 1
        if flaky:
            self.answer(h, 503, b"<Error><Code>SlowDown</Code></Error>", "application/xml")
            return
        why = self.verify(h, body)
        if why:
            with self.lock:
                self.rejected.append("%s %s: %s" % (h.command, h.path, why))
            self.answer(h, 403, b"<Error><Code>SignatureDoesNotMatch</Code></Error>",
                        "application/xml")
            return
        parts = urllib.parse.urlsplit(h.path)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        segs = urllib.parse.unquote(parts.path).lstrip("/").split("/", 1)
        names = dict(query)
        if h.command == "GET" and len(segs) == 1 and "uploads" in names:
            return self.list_uploads(h, segs[0], query)
        if h.command == "DELETE" and len(segs) == 2 and "uploadId" in names:
            return self.abort_upload(h, segs[0], names["uploadId"])
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=60)
            headers = {k: v for k, v in h.headers.items() if k.lower() not in ("connection",)}
            c.request(h.command, h.path, body=body if n else None, headers=headers)
            r = c.getresponse()
            data = r.read()
            keep = [(k, v) for k, v in r.getheaders()
                    if k.lower() not in ("content-length", "connection", "transfer-encoding",
                                         "content-type")]
            ctype = r.getheader("Content-Type")
            c.close()
        except OSError:
            self.answer(h, 503, b"<Error><Code>ServiceUnavailable</Code></Error>",
                        "application/xml")
            return
        if h.command == "HEAD":
            # The object's length, not the (empty) body's.
            h.send_response(r.status)
            for k, v in keep:
                h.send_header(k, v)
            if ctype:
                h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", r.getheader("Content-Length") or "0")
            h.end_headers()
            return
        self.answer(h, r.status, data, ctype, keep)
