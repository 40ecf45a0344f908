"""``attnkit serve`` as a real process on 127.0.0.1 (ephemeral port): the playground driven in Debian's headless
Chromium through Selenium, and SIGTERM draining the work in flight."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# The README's screenshot is refreshed only when asked for (a test run leaves the working tree as it was):
# ATTNKIT_PLAYGROUND_SCREENSHOT=docs/figures/playground.png python -m pytest tests/serving/test_live.py
SCREENSHOT = os.environ.get("ATTNKIT_PLAYGROUND_SCREENSHOT")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 30) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


class Server:
    def __init__(self, model_dir: Path, *extra: str, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "attnkit",
                "serve",
                str(model_dir),
                "--port",
                str(self.port),
                "--quiet",
                "--threads",
                "1",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,  # its own process group: the server and its inference process, nothing else
        )
        for _ in range(300):  # bounded: 60 s
            if self.process.poll() is not None:
                raise AssertionError(f"attnkit serve exited: {self.process.communicate()}")
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError("attnkit serve did not become ready in 60 s")

    def stop(self, whole_group: bool = False) -> int:
        """SIGTERM to the server (or to its whole process group, as Ctrl-C or a service manager does); its exit
        status."""
        if self.process.poll() is None:
            if whole_group:
                os.killpg(self.process.pid, signal.SIGTERM)
            else:
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process.communicate()
        return self.process.returncode


@pytest.fixture
def classifier_server(classifier_dir):
    server = Server(classifier_dir)
    yield server
    server.stop()


def chrome():
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip(
            f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}): "
            "apt-get install -y chromium chromium-driver"
        )
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console: CSP violations are reported there
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1200,1500",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def csp_violations(driver) -> list[str]:
    """What the page's Content-Security-Policy blocked, from the browser's console (an empty list: the page ran
    under it as it is written)."""
    return [entry["message"] for entry in driver.get_log("browser") if "Content Security Policy" in entry["message"]]


def test_playground_in_chromium_shows_the_apis_numbers_and_every_map(classifier_server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    sentence = "The performance was outstanding and truly zzqx inspiring"
    _, info = 0, json.loads(urllib.request.urlopen(classifier_server.url + "/info", timeout=10).read())
    status, api = post(classifier_server.url + "/v1/classify", {"inputs": sentence})
    assert status == 200
    driver = chrome()
    try:
        driver.get(classifier_server.url + "/")
        wait = WebDriverWait(driver, 30)
        wait.until(ec.text_to_be_present_in_element((By.ID, "model-info"), "classifier"))
        assert "(fp32 on cpu)" in driver.find_element(By.ID, "model-info").text  # from /info's "inference"
        driver.find_element(By.ID, "text").send_keys(sentence)
        driver.find_element(By.ID, "run").click()
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "done")
        assert not driver.find_element(By.ID, "error").is_displayed()
        rows = driver.find_elements(By.CSS_SELECTOR, "#classes .bar-row")
        shown = {row.get_attribute("data-label"): float(row.get_attribute("data-prob")) for row in rows}
        assert shown == pytest.approx(api["results"][0]["probs"], abs=1e-6)
        for row in rows:  # the bar's width is the probability
            width = float(row.find_element(By.CSS_SELECTOR, ".bar").value_of_css_property("width")[:-2])
            track = float(row.find_element(By.CSS_SELECTOR, ".bar-track").value_of_css_property("width")[:-2])
            assert width / track == pytest.approx(shown[row.get_attribute("data-label")], abs=0.01)
        heads = driver.find_elements(By.CSS_SELECTOR, "#grid canvas.map:not(.mean)")
        assert len(heads) == info["n_layers"] * info["n_heads"]
        assert len(driver.find_elements(By.CSS_SELECTOR, "#grid canvas.map.mean")) == info["n_layers"]
        tokens = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#tokens .token")]
        assert tokens == api["results"][0]["tokens"] and "<unk>" in tokens
        assert driver.find_elements(By.CSS_SELECTOR, "#tokens .token.unk")[0].text == "<unk>"
        heads[-1].click()  # the full heatmap of the last layer's last head
        wait.until(ec.visibility_of_element_located((By.ID, "detail")))
        assert "layer 1, head 1" in driver.find_element(By.ID, "detail-title").text
        figure = Path(SCREENSHOT) if SCREENSHOT else tmp_path / "playground.png"
        figure.parent.mkdir(parents=True, exist_ok=True)
        tmp = figure.with_suffix(".tmp.png")
        assert driver.save_screenshot(str(tmp)) and tmp.stat().st_size > 0
        os.replace(tmp, figure)
        # A server error is shown readably: an empty text is a 422 with its message.
        driver.find_element(By.ID, "text").clear()
        driver.find_element(By.ID, "text").send_keys("   ")
        driver.find_element(By.ID, "run").click()
        wait.until(ec.visibility_of_element_located((By.ID, "error")))
        assert (
            "422" in driver.find_element(By.ID, "error").text
            and "inputs is empty" in driver.find_element(By.ID, "error").text
        )
        assert csp_violations(driver) == []
        # The policy is enforced: a script the page did not come with is refused, and the console says so.
        inline = "const s = document.createElement('script'); s.textContent = '1'; document.body.append(s)"
        driver.execute_script(inline)
        assert any("script-src 'self'" in message for message in csp_violations(driver))
    finally:
        driver.quit()


def test_probes_may_use_head_and_get_no_body_on_a_kept_alive_connection(classifier_server):
    """``HEAD /health`` and ``HEAD /ready`` (some load balancers probe with HEAD) answer as GET would, without a body:
    a GET on the same connection afterwards reads its own answer, not the bytes of one sent after a HEAD."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", classifier_server.port, timeout=10)
    try:
        for path in ("/health", "/ready"):
            connection.request("HEAD", path)
            head = connection.getresponse()
            assert (head.status, head.read()) == (200, b"")
            assert int(head.getheader("content-length") or 0) > 0  # the length GET's body would have
        connection.request("GET", "/health")
        answer = connection.getresponse()
        assert (answer.status, json.loads(answer.read())) == (200, {"status": "ok"})
    finally:
        connection.close()


def test_playground_asks_for_the_api_key_and_sends_it(classifier_dir):
    """A server with a key (here from ATTNKIT_API_KEY): the page asks for it on the first 401, then works."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    server = Server(classifier_dir, env={"ATTNKIT_API_KEY": "open sesame"})
    try:
        status, refusal = post(server.url + "/v1/classify", {"inputs": "a fine film"})
        assert (status, refusal["error_type"]) == (401, "unauthorized")
        driver = chrome()
        try:
            driver.get(server.url + "/")
            wait = WebDriverWait(driver, 30)
            wait.until(ec.visibility_of_element_located((By.ID, "key")))
            driver.find_element(By.ID, "key").send_keys("open sesame")
            driver.find_element(By.ID, "key-use").click()
            wait.until(ec.text_to_be_present_in_element((By.ID, "model-info"), "classifier"))
            driver.find_element(By.ID, "text").send_keys("a fine film")
            driver.find_element(By.ID, "run").click()
            wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "done")
            assert not driver.find_element(By.ID, "error").is_displayed()
            assert len(driver.find_elements(By.CSS_SELECTOR, "#classes .bar-row")) == 2
            assert csp_violations(driver) == []
        finally:
            driver.quit()
    finally:
        server.stop()


@pytest.mark.parametrize("whole_group", [False, True], ids=["server", "process-group"])
def test_sigterm_finishes_the_work_in_flight_and_exits_cleanly(classifier_dir, whole_group):
    server = Server(classifier_dir, "--max-wait-ms", "200")  # requests wait 200 ms for a batch: some are in flight
    results: list[object] = []

    def client():
        try:
            results.append(post(server.url + "/v1/classify", {"inputs": ["a good film"] * 8})[0])
        except (urllib.error.URLError, ConnectionError) as err:  # arrived after the listening socket closed
            results.append(type(err).__name__)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.1)  # inside the 200 ms wait: accepted, not answered
    code = server.stop(whole_group)
    for t in threads:
        t.join(30)
    # uvicorn re-raises the signal once its graceful shutdown is over, so the exit status says "terminated by SIGTERM".
    assert code in (0, -signal.SIGTERM)
    assert results.count(200) >= 1 and all(r == 200 or isinstance(r, str) for r in results), results
    assert 500 not in results
    with pytest.raises(ProcessLookupError):  # the inference process ended with the server
        for _ in range(50):  # bounded: 5 s for the group to empty
            os.killpg(server.process.pid, 0)
            time.sleep(0.1)


def test_serve_refuses_a_directory_that_is_not_a_model(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "attnkit", "serve", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: ") and str(tmp_path) in result.stderr


def test_playground_for_a_translator_shows_the_n_best_list_and_cross_attention(translator_dir):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    server = Server(translator_dir)
    try:
        status, api = post(server.url + "/v1/translate", {"inputs": "a b c", "beam": 4, "alpha": 0.6, "n_best": 4})
        assert status == 200
        driver = chrome()
        try:
            driver.get(server.url + "/")
            wait = WebDriverWait(driver, 30)
            wait.until(ec.text_to_be_present_in_element((By.ID, "model-info"), "translator"))
            driver.find_element(By.ID, "text").send_keys("a b c")
            driver.find_element(By.ID, "run").click()
            wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "done")
            assert not driver.find_element(By.ID, "error").is_displayed()
            result = api["results"][0]
            assert driver.find_element(By.ID, "translation").text == result["translation"]
            rows = driver.find_elements(By.CSS_SELECTOR, "#nbest tbody tr")
            assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in rows] == [
                c["translation"] for c in result["n_best"]
            ]
            shown_scores = [float(r.find_elements(By.TAG_NAME, "td")[3].text) for r in rows]
            assert shown_scores == pytest.approx([c["normalized_score"] for c in result["n_best"]], abs=1e-4)
            assert driver.find_element(By.ID, "kind").get_attribute("value") == "cross"
            assert len(driver.find_elements(By.CSS_SELECTOR, "#grid canvas.map:not(.mean)")) == 2 * 2
        finally:
            driver.quit()
    finally:
        server.stop()
