"""The store's signer (tests/unit/sigv4-sign, the same code the proxy
signs with) held against botocore's for every request shape the S3 store
sends, with keys, prefixes and tokens that need encoding. No server."""
import hashlib
import os
import subprocess
import urllib.parse

import pytest

from front import botocore_signature, percent_encode

HERE = os.path.dirname(os.path.abspath(__file__))
PROXY = os.environ.get("ACEMQ_PROXY",
                       os.path.join(HERE, "..", "..", "..", "build", "src", "acemq-proxy"))
SIGN = os.environ.get("ACEMQ_SIGV4_SIGN", os.path.join(os.path.dirname(os.path.dirname(PROXY)),
                                                        "tests", "unit", "sigv4-sign"))
ACCESS, SECRET, REGION = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "eu-west-3"
DATE = "20260102T030405Z"
KEY = "claims/3713539f1a12549e6193471b33afb24c"
ODD = "odd prefix+é~(x)=&/3713539f1a12549e6193471b33afb24c"
TOKEN = "1/abc+DEF==/ghi jkl"
UPLOAD = "VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA--+/="
EMPTY = hashlib.sha256(b"").hexdigest()
BODY = hashlib.sha256(b"payload").hexdigest()

# (name, method, key or None, query [(name, value or None)], headers, payload hash)
SHAPES = [
    ("put", "PUT", KEY, [], {"content-type": "application/pdf"}, BODY),
    ("put odd key", "PUT", ODD, [], {"content-type": "text/plain; charset=utf-8"}, BODY),
    ("get with range", "GET", KEY, [], {"range": "bytes=2097152-4194303"}, EMPTY),
    ("get odd key", "GET", ODD, [], {"range": "bytes=0-0"}, EMPTY),
    ("head", "HEAD", KEY, [], {}, EMPTY),
    ("delete", "DELETE", ODD, [], {}, EMPTY),
    ("create multipart", "POST", KEY, [("uploads", None)], {"content-type": "application/pdf"},
     EMPTY),
    ("upload part", "PUT", ODD, [("partNumber", "12"), ("uploadId", UPLOAD)], {}, BODY),
    ("complete", "POST", KEY, [("uploadId", UPLOAD)], {"content-type": "application/xml"}, BODY),
    ("abort", "DELETE", ODD, [("uploadId", UPLOAD)], {}, EMPTY),
    ("list objects v2", "GET", None, [("list-type", "2"), ("prefix", "odd prefix+é~/"),
                                      ("max-keys", "1000"), ("continuation-token", TOKEN)],
     {}, EMPTY),
    ("list objects v2 start-after", "GET", None, [("prefix", "claims/"), ("list-type", "2"),
                                                  ("start-after", "claims/ffff"),
                                                  ("max-keys", "1000")], {}, EMPTY),
    ("list multipart uploads", "GET", None, [("uploads", None), ("prefix", "claims/"),
                                             ("max-uploads", "1000")], {}, EMPTY),
]


def sign(method, bucket, key, query, headers, payload):
    args = [SIGN, ACCESS, SECRET, REGION, DATE, method, bucket, key if key else "-", payload]
    for n, v in query:
        args += ["q0", n] if v is None else ["q", n, v]
    for n, v in headers.items():
        args += ["h", n, v]
    out = subprocess.run(args, check=True, capture_output=True).stdout.decode()
    path, qs, auth, canonical = out.split("\n", 3)
    return path, qs, auth, canonical.rstrip("\n")


@pytest.mark.parametrize("name,method,key,query,extra,payload", SHAPES,
                         ids=[s[0] for s in SHAPES])
def test_signature_matches_botocore(name, method, key, query, extra, payload):
    bucket, host = "acemq-claims", "s3.eu-west-3.amazonaws.com"
    headers = {"host": host, "x-amz-date": DATE, "x-amz-content-sha256": payload}
    headers.update(extra)
    path, qs, auth, canonical = sign(method, bucket, key, query, headers, payload)
    raw_path = "/" + bucket + ("/" + key if key else "")
    # The path as botocore's S3 serializer encodes a key, and the query as
    # sent parses back to the parameters.
    assert path == percent_encode(raw_path, safe="/~")
    sent = urllib.parse.parse_qsl(qs, keep_blank_values=True)
    assert sorted(sent) == sorted((n, v or "") for n, v in query)
    want, want_canonical = botocore_signature(method, host, raw_path,
                                              [(n, v or "") for n, v in query], headers, DATE,
                                              ACCESS, SECRET, REGION)
    assert canonical == want_canonical
    assert auth.endswith("Signature=" + want), (auth, want)
    assert "SignedHeaders=" + ";".join(sorted(headers)) in auth
