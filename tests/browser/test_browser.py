"""End-to-end: `python app.py` in a subprocess, driven by headless Debian chromium through selenium.

Checks that empty text gives a one-line error toast, types a text, clicks Generate, waits for playable
audio and the downloadable wav, waits for TTFP/RTF in the engine panel, switches the compile mode and
waits for the panel to report it, generates once more, and saves docs/screenshot.png. Skips only when
/usr/bin/chromium is missing and CI is unset; under CI=true anything missing is a failure. Never
downloads a browser or a driver (selenium drives Debian's /usr/bin/chromedriver, passed explicitly).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/qwen3_tts_tiny/custom_voice"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
SWITCH_TO = os.environ.get("OMNI_TTS_BROWSER_MODE", "eager")  # CPU: 'default' compiles for minutes
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1500", "--autoplay-policy=no-user-gesture-required"]

if not IN_CI and not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} not found (apt-get install chromium chromium-driver); under CI=true this fails",
                allow_module_level=True)
if not IN_CI:
    pytest.importorskip("selenium", reason="selenium not installed (pip install -r requirements-dev.txt)")

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`python app.py` on a free port; yields (url, log path). Small preset: 2 slots, short KV cache."""
    tmp = tmp_path_factory.mktemp("app")
    preset = tmp / "browser.yaml"
    preset.write_text("mode: eager\ndevice: cpu\nmax_num_seqs: 2\nmax_seq_len: 256\ninitial_chunk_frames: 1\n"
                      "chunk_frames: 8\n")
    if FIXTURE.is_dir():
        model = str(FIXTURE)
    else:
        sys.path.insert(0, str(ROOT))
        from omni_tts.models.checkpoint_maker import embedded_checkpoint_dir

        model = str(embedded_checkpoint_dir())
    port, log = _free_port(), tmp / "server.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--host", "127.0.0.1",
                                 "--model", model, "--preset", str(preset)],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"app.py exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"app.py did not serve {url} within 120 s:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield url, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={tempfile.mkdtemp(prefix='omni-tts-chromium-')}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _wait(driver, what: str, condition, timeout: float, log: Path):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.25).until(lambda d: condition(d))
    except TimeoutException:
        shot = Path(tempfile.gettempdir()) / "omni-tts-browser-failure.png"
        driver.save_screenshot(str(shot))
        panel = {css: _text(driver, css) for css in ("#live-metrics", "#mode-status", "#engine-figures")}
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (screenshot {shot}); panel: {panel!r}; "
                    f"server log:\n{log.read_text()[-3000:]}")


def _text(driver, css: str) -> str:
    """An element's visible text with whitespace collapsed (code spans render on their own lines)."""
    els = driver.find_elements(By.CSS_SELECTOR, css)
    return " ".join(els[0].text.split()) if els else ""


def test_generate_listen_switch_mode_and_screenshot(server, browser):
    url, log = server
    d = browser
    d.get(url)
    _wait(d, "the page", lambda d: d.find_elements(By.CSS_SELECTOR, "#generate"), 30, log)
    assert "Model:" in _text(d, "#banner")
    d.find_element(By.CSS_SELECTOR, "#sampling button.label-wrap").click()  # open the Sampling accordion
    max_len = _wait(d, "the max-length box", lambda d: d.find_elements(
        By.CSS_SELECTOR, "#max-len input[type=number]"), 10, log)[0]
    max_len.send_keys(Keys.CONTROL, "a")
    max_len.send_keys("24", Keys.TAB)
    box = d.find_element(By.CSS_SELECTOR, "#text textarea")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    d.find_element(By.CSS_SELECTOR, "#generate").click()  # bad input: a one-line error toast, no traceback
    _wait(d, "the empty-text error toast", lambda d: any("text is empty" in e.text for e in d.find_elements(
        By.CSS_SELECTOR, ".toast-body")), 15, log)
    assert "Traceback" not in d.find_element(By.TAG_NAME, "body").text
    box.send_keys("Hello from the browser test.")
    d.find_element(By.CSS_SELECTOR, "#generate").click()  # and the app still serves

    href = _wait(d, "the downloadable wav", lambda d: next((a.get_attribute("href") for a in d.find_elements(
        By.CSS_SELECTOR, "#download a") if ".wav" in (a.get_attribute("href") or "")), None), 60, log)
    with urllib.request.urlopen(href, timeout=10) as r:
        assert r.read(4) == b"RIFF", "the download is not a wav file"
    _wait(d, "a playable audio element", lambda d: d.execute_script(
        "const a = document.querySelector('#output-audio audio');"
        "return !!a && !!a.src && a.readyState > 0 && a.duration > 0;"), 30, log)
    _wait(d, "TTFP/E2E/RTF of the finished request in the panel", lambda d: re.search(
        r"last #\d+ \(\S+\) \d+ ms \d+ ms \d+\.\d{3} \d+\.\d\d s", _text(d, "#live-metrics")), 15, log)

    assert "now" not in _text(d, "#mode-status")
    d.find_element(By.CSS_SELECTOR, f'#mode-radio label[data-testid="{SWITCH_TO}-radio-label"]').click()
    d.find_element(By.CSS_SELECTOR, "#apply-mode").click()
    _wait(d, f"the panel to report mode {SWITCH_TO}", lambda d: f"now {SWITCH_TO}" in _text(d, "#mode-status")
          and f"mode {SWITCH_TO}" in _text(d, "#engine-figures"), 90, log)
    assert re.search(r"took \d+\.\d s", _text(d, "#mode-status"))
    d.find_element(By.CSS_SELECTOR, "#generate").click()  # one more request, in the switched engine
    _wait(d, "the second request in the panel", lambda d: "last #2 " in _text(d, "#live-metrics"), 60, log)
    for close in d.find_elements(By.CSS_SELECTOR, ".toast-close"):  # a clean screenshot for the docs
        close.click()
    time.sleep(2.5)  # two more panel refreshes, so the plots show both requests
    shot = ROOT / "docs" / "screenshot.png"
    shot.parent.mkdir(exist_ok=True)
    assert d.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
