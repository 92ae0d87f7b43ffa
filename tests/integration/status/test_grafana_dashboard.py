"""contrib/grafana/acemq-proxy.json against the proxy's real /metrics:
every series a panel or a variable queries is one the proxy exports, with
the label values the queries name and the labels they group by. The proxy
runs with the example rules of every pattern, a connection to the rated
example vhost and that vhost paused, so that every family is there."""
import json
import os
import re
import shutil
import tempfile
import urllib.request

import pika
import pytest

import rulesproxy
import support

from prometheus_client.parser import text_string_to_metric_families

TOP = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DASHBOARD = os.path.join(TOP, "contrib", "grafana", "acemq-proxy.json")
SCRAPE_LABELS = {"instance", "job"}  # added by Prometheus, not in /metrics
SELECTOR = re.compile(r"(acemq_proxy_[a-zA-Z0-9_]+)\s*(\{[^}]*\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*"([^"]*)"')
BY = re.compile(r"\bby\s*\(([^)]*)\)")


@pytest.fixture(scope="module")
def metrics():
    support.ensure_rabbitmq(60)
    data = tempfile.mkdtemp(prefix="acemq-grafana-")
    admin = rulesproxy.free_port()
    p = rulesproxy.Proxy(os.path.join(TOP, "rules"), data, ["--admin", "127.0.0.1:%d" % admin])
    try:
        assert support.wait_until(lambda: support.port_accepts(admin), 10), p.stderr()
        # A connection to the rated example vhost (the broker has no such
        # vhost; the proxy's bucket has counted it) and a paused vhost:
        # their series have samples.
        try:
            pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", p.port, "metered", connection_attempts=1)).close()
        except pika.exceptions.AMQPError:
            pass
        assert support.admin_request(admin, "POST", "/vhosts/metered/pause")[0] == 200
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin, timeout=10) as r:
            text = r.read().decode()
    finally:
        assert p.stop() == 0, p.stderr()[-3000:]
        shutil.rmtree(data, ignore_errors=True)
    series = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            series.setdefault(s.name, []).append(s.labels)
    return series


def queries(dash):
    """Every PromQL expression of the dashboard, with where it is."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((p["title"], t["expr"]))
            walk(p.get("panels", []))
    walk(dash["panels"])
    for v in dash["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if v["type"] == "query":
            out.append(("variable " + v["name"], q))
    return out


def problems(expr, series):
    """What in expr the exported series do not have."""
    found = []
    names = []
    for name, braces in SELECTOR.findall(expr):
        names.append(name)
        if name not in series:
            found.append("no series %s" % name)
            continue
        for label, op, value in MATCHER.findall(braces or ""):
            if label in SCRAPE_LABELS:
                continue
            if not any(label in s for s in series[name]):
                found.append("%s has no label %s" % (name, label))
            elif op == "=" and not any(s.get(label) == value for s in series[name]):
                found.append("%s has no %s=%r" % (name, label, value))
    for group in BY.findall(expr):
        for label in (x.strip() for x in group.split(",") if x.strip()):
            if label in SCRAPE_LABELS:
                continue
            if not any(label in s for n in names if n in series for s in series[n]):
                found.append("no series of %s has the label %s it is grouped by" % (names, label))
    for label in re.findall(r"label_values\([^,]*,\s*([a-zA-Z_]+)\)", expr):
        if label not in SCRAPE_LABELS and not any(label in s for n in names if n in series
                                                  for s in series[n]):
            found.append("label_values over %s, which %s do not have" % (label, names))
    return found


def test_the_checker_finds_what_is_missing(metrics):
    assert problems("rate(acemq_proxy_no_such_thing_total[5m])", metrics)
    assert problems('acemq_proxy_schedule_total{event="never"}', metrics)
    assert problems("sum by (colour) (acemq_proxy_bytes_total)", metrics)
    assert not problems('sum by (vhost) (acemq_proxy_schedule_total{event="cancelled"})', metrics)


def test_every_series_the_dashboard_queries_is_exported(metrics):
    with open(DASHBOARD) as f:
        dash = json.load(f)
    qs = queries(dash)
    assert len(qs) >= 20
    bad = ["%s: %s: %s" % (where, expr, p) for where, expr in qs for p in problems(expr, metrics)]
    assert not bad, "\n".join(bad)
    # Every exported family is on the dashboard somewhere.
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in metrics}
    queried = {re.sub(r"_(bucket|sum|count)$", "", n) for _, e in qs for n, _ in SELECTOR.findall(e)}
    assert families - queried == set(), families - queried


def test_dashboard_is_well_formed():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    assert dash["uid"] == "acemq-proxy" and dash["title"]
    ids = []
    for p in dash["panels"]:
        ids.append(p["id"])
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    assert len(ids) == len(set(ids))
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "instance", "vhost"} <= names
