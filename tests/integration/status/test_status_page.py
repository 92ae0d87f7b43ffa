"""The admin endpoint's status page (GET /) in headless Chromium, driven
through chromedriver by Selenium: it loads with no network but the proxy's
own endpoint, asks for the token, shows a known connection and vhost, sorts
the connections, and its buttons cancel a delayed message, reload the
rules, pause and resume a vhost and close a connection, each checked through
the API or the client. A screenshot is taken."""
import os
import shutil
import tempfile
import urllib.parse

import pika
import pytest

import rulesproxy
import support

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

VHOST = "acemq-status"
TOKEN = "status-token-7"
RULES = ('{"vhost": "%s", "schedule": {"match": [{"exchange": ""}], "engine": true}}' % VHOST)
ENC = urllib.parse.quote(VHOST, safe="")


def request(port, method, path, token=TOKEN):
    return support.admin_request(port, method, path, token, with_headers=True)


@pytest.fixture(scope="module")
def proxy():
    support.ensure_rabbitmq(60)
    support.fresh_vhost(VHOST)
    top = tempfile.mkdtemp(prefix="acemq-status-")
    rules = os.path.join(top, "rules")
    os.makedirs(rules)
    with open(os.path.join(rules, "status.json"), "w") as f:
        f.write(RULES)
    admin = rulesproxy.free_port()
    p = rulesproxy.Proxy(rules, os.path.join(top, "data"), [
        "--admin", "127.0.0.1:%d" % admin, "--admin-token", TOKEN,
        "--engine-user", "guest", "--engine-password", "guest"])
    p.admin_port = admin
    assert support.wait_until(lambda: support.port_accepts(admin), 10), p.stderr()
    assert support.wait_until(
        lambda: request(admin, "GET", "/stats")[1]["engines"].get(VHOST, {}).get("ladder_ready") == 1,
        20), p.stderr()
    yield p
    rc = p.stop()
    text = p.stderr()
    assert rc == 0, text[-3000:]
    assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]
    support.rabbitmqctl("delete_vhost", VHOST, check=False)
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def browser():
    opts = Options()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        opts.add_argument(a)
    opts.binary_location = "/usr/bin/chromium"
    d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    d.set_page_load_timeout(30)
    yield d
    d.quit()


def test_page_is_one_self_contained_file_open_without_the_token(proxy):
    status, body, headers = request(proxy.admin_port, "GET", "/", token=None)
    assert status == 200 and headers["Content-Type"].startswith("text/html"), (status, headers)
    html = body.decode()
    assert html.startswith("<!doctype html>") and html.rstrip().endswith("</html>")
    for external in ("http://", "https://", "src=", "<link", "@import", "url("):
        assert external not in html, external
    assert "connect-src 'self'" in headers["Content-Security-Policy"]
    # The page is open; what it reads is not.
    assert request(proxy.admin_port, "GET", "/stats", token=None)[0] == 401
    assert request(proxy.admin_port, "GET", "/nope", token=None)[0] == 401
    assert request(proxy.admin_port, "GET", "/nope")[0] == 404


def test_page_shows_the_proxy_and_its_buttons_act(proxy, browser):
    client = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", proxy.port, VHOST))
    try:
        ch = client.channel()
        q = support.unique_name("status")
        ch.queue_declare(q, durable=True)
        ch.confirm_delivery()
        for i in range(2):
            ch.basic_publish("", q, b"later", pika.BasicProperties(
                message_id="s-%d" % i, headers={"x-delay": 120000}))
        rows = [r for r in request(proxy.admin_port, "GET", "/connections")[1]["rows"]
                if r["vhost"] == VHOST]
        assert len(rows) == 1, rows
        conn = rows[0]
        listed = request(proxy.admin_port, "GET", "/schedule/%s" % ENC)[1]["pending"]
        assert [e["message_id"] for e in listed] == ["s-0", "s-1"]
        generation = request(proxy.admin_port, "GET", "/rules")[1]["generation"]

        browser.get("http://127.0.0.1:%d/" % proxy.admin_port)
        wait = WebDriverWait(browser, 20)
        # Without the token the page says what it needs.
        wait.until(lambda d: "asks for a token" in d.find_element(By.ID, "message").text)
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.ID, "use-token").click()
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded"))
        wait.until(lambda d: conn["address"] in d.find_element(By.ID, "connections").text)
        text = browser.find_element(By.TAG_NAME, "body").text
        assert VHOST in browser.find_element(By.ID, "vhosts").text
        assert "schedule" in browser.find_element(By.ID, "vhosts").text
        assert "127.0.0.1:5672" in browser.find_element(By.ID, "brokers").text
        assert "2 pending" in browser.find_element(By.ID, "schedule").text
        assert "s-0" in text and "s-1" in text
        version = browser.find_element(By.ID, "version").text
        assert version and version == request(proxy.admin_port, "GET", "/stats")[1]["version"]

        shots = os.environ.get("ACEMQ_IT_ARTIFACTS") or tempfile.mkdtemp(prefix="acemq-status-shot-")
        shot = os.path.join(shots, "status-page.png")
        assert browser.save_screenshot(shot)
        with open(shot, "rb") as f:
            png = f.read()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000, len(png)
        print("status page screenshot:", shot)

        # The connections sort by a column, both ways.
        header = browser.find_element(By.CSS_SELECTOR, "#connections th[data-key='vhost']")
        header.click()
        wait.until(lambda d: d.find_element(
            By.CSS_SELECTOR, "#connections th[data-key='vhost']").get_attribute("class") == "asc")
        browser.find_element(By.CSS_SELECTOR, "#connections th[data-key='vhost']").click()
        wait.until(lambda d: d.find_element(
            By.CSS_SELECTOR, "#connections th[data-key='vhost']").get_attribute("class") == "desc")

        # Cancel s-0 with its button: gone from the list, counted cancelled.
        target = listed[0]["id"]
        browser.find_element(By.CSS_SELECTOR, "button.cancel[data-id='%s']" % target).click()
        wait.until(lambda d: "cancelled" in d.find_element(By.ID, "message").text)
        after = request(proxy.admin_port, "GET", "/schedule/%s" % ENC)[1]
        assert [e["id"] for e in after["pending"]] == [listed[1]["id"]]
        assert after["cancelled"] == 1
        wait.until(lambda d: "1 pending" in d.find_element(By.ID, "schedule").text)

        # Reload through its button: a new generation of the rules.
        browser.find_element(By.ID, "reload").click()
        wait.until(lambda d: "rules reloaded" in d.find_element(By.ID, "message").text)
        assert request(proxy.admin_port, "GET", "/rules")[1]["generation"] == generation + 1

        # Pause the vhost's publishers and resume them with its buttons.
        row = "//table[@id='vhosts']//tr[td[1][text()='%s']]" % VHOST
        wait.until(lambda d: d.find_elements(By.XPATH, row + "//button[contains(@class, 'pause')]"))
        browser.find_element(By.XPATH, row + "//button[contains(@class, 'pause')]").click()
        wait.until(lambda d: "paused " + VHOST in d.find_element(By.ID, "message").text)
        assert request(proxy.admin_port, "GET", "/stats")[1]["paused_vhosts"] == [VHOST]
        wait.until(lambda d: "paused" in d.find_element(By.XPATH, row).text)
        browser.find_element(By.XPATH, row + "//button[contains(@class, 'resume')]").click()
        wait.until(lambda d: "resumed " + VHOST in d.find_element(By.ID, "message").text)
        assert request(proxy.admin_port, "GET", "/stats")[1]["paused_vhosts"] == []

        # Close the client with its row's button: it hears 320.
        browser.find_element(By.XPATH, "//table[@id='connections']//tr[td[1][text()='%d']]"
                             "//button[contains(@class, 'close')]" % conn["id"]).click()
        wait.until(lambda d: "closed connection %d" % conn["id"] in
                   d.find_element(By.ID, "message").text)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
            for _ in range(100):
                client.process_data_events(0.05)
        assert e.value.reply_code == 320
    finally:
        if client.is_open:
            client.close()
