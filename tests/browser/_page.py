"""The browser test's page helpers: the app in a subprocess, Debian's chromium through selenium, and the
waits, clicks and readings the scenarios are written in (each wait fails with a screenshot, the panel's
text and the server log's tail). Importing it skips the importing test module when chromium or selenium
is missing and CI is unset (under CI=true that is a failure)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "out" / "screenshots"  # ignored by git (/out/ in .gitignore)
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")

if not IN_CI and not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} not found (apt-get install chromium chromium-driver); under CI=true this fails",
                allow_module_level=True)
if not IN_CI:
    pytest.importorskip("selenium", reason="selenium not installed (pip install -r requirements-dev.txt)")

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    ElementClickInterceptedException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

COLORS = {"eager": "#f97316", "default": "#2563eb", "reduce-overhead": "#9333ea", "default+cudagraph": "#16a34a"}
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1500", "--autoplay-policy=no-user-gesture-required"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_app(tmp, model: Path, modes: list[str]):
    """`python app.py` on `model` at a free port, its voice store under `tmp`; yields (url, log path).
    Small preset: 2 slots, short KV cache, every mode of `modes` resident (the non-eager ones warming in
    the background while the first steps run)."""
    preset = tmp / "browser.yaml"
    preset.write_text(f"mode: eager\nmodes: [{', '.join(modes)}]\ndevice: cpu\nmax_num_seqs: 2\nmax_seq_len: 2048\n"
                      "initial_chunk_frames: 1\nchunk_frames: 8\n")
    port, log = free_port(), tmp / "server.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1",
               OMNI_TTS_DATA_DIR=str(tmp / "data"))
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--host", "127.0.0.1",
                                 "--model", str(model), "--preset", str(preset)],
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


def chromium():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={tempfile.mkdtemp(prefix='omni-tts-chromium-')}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    return driver


def wait(driver, what: str, condition, timeout: float, log: Path):
    try:
        # an element the page replaced (a toast that closed itself) between finding and reading it: look again
        return WebDriverWait(driver, timeout, poll_frequency=0.25,
                             ignored_exceptions=(StaleElementReferenceException,)).until(lambda d: condition(d))
    except TimeoutException:
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / "failure.png"
        driver.save_screenshot(str(shot))
        panel = {css: text(driver, css) for css in ("#live-metrics", "#mode-readiness", "#notice")}
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (screenshot {shot}); panel: {panel!r}; "
                    f"server log:\n{log.read_text()[-3000:]}")


def clicked(element) -> bool:
    """Click `element`; False while another element still covers it (the page is laying itself out)."""
    try:
        element.click()
        return True
    except ElementClickInterceptedException:
        return False


# The tiny random checkpoint can end a request by itself (its EOS) at any frame, so a request meant to be
# stopped may be over before Stop lands; the tests start another then (the page says "Nothing to stop").
STOP_ATTEMPTS = 5


def started(driver, drawn: int, log: Path) -> bool:
    """After Generate: True once the request shows running, False if it was over first (the eager plot then
    holds one more point than `drawn`)."""
    return wait(driver, "the request running (or over)", lambda d: "running" if "running #" in text(
        d, "#live-metrics") else "over" if points(d, "ttfp-plot", "eager") > drawn else None, 60, log) == "running"


def ended(driver, drawn: int, log: Path) -> None:
    """Wait for a request that ended by itself to be drawn (the eager plot holds drawn + 1)."""
    wait(driver, "the request that ended by itself in the plots", lambda d: "running #" not in text(
        d, "#live-metrics") and points(d, "ttfp-plot", "eager") == drawn + 1, 30, log)


def stop(driver, log: Path) -> bool:
    """Click Stop (once nothing covers it) -> True when it stopped a running request, False when the
    request had already ended by itself."""
    wait(driver, "no earlier Stop toast", lambda d: close_toasts(d) or not (
        toast(d, "Stopping request") or toast(d, "Nothing to stop")), 10, log)
    wait(driver, "Stop clickable (no overlay over it)", lambda d: clicked(d.find_element(By.CSS_SELECTOR,
          "#stop")), 10, log)
    said = wait(driver, "the Stop toast", lambda d: "stopping" if toast(d, "Stopping request") else
                 "ended" if toast(d, "Nothing to stop") else None, 15, log)
    return said == "stopping"


# The input of the clone form's "Saved voice" dropdown (found by its label: the component has no elem_id).
SAVED_VOICE_INPUT = 'input[role="combobox"][aria-label="Saved voice"]'


def text(driver, css: str) -> str:
    """An element's visible text with whitespace collapsed (code spans render on their own lines)."""
    els = driver.find_elements(By.CSS_SELECTOR, css)
    return " ".join(els[0].text.split()) if els else ""


def points(driver, plot: str, mode: str) -> int:
    """Points of `mode` drawn in a plot with that mode's colour."""
    return driver.execute_script(
        f"return document.querySelectorAll('#{plot} circle.point[data-mode=\"{mode}\"][fill=\"{COLORS[mode]}\"]')"
        ".length")


def toast(driver, words: str) -> bool:
    return any(words in e.text for e in driver.find_elements(By.CSS_SELECTOR, ".toast-body"))


def close_toasts(driver) -> None:
    for close in driver.find_elements(By.CSS_SELECTOR, ".toast-close"):
        try:
            close.click()
        except Exception:  # a toast that closed by itself meanwhile
            pass


def set_number(driver, css: str, value: str) -> None:
    box = driver.find_element(By.CSS_SELECTOR, css)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(value, Keys.TAB)


def pick(driver, dropdown: str, value: str, log: Path) -> None:
    """Choose `value` in a gr.Dropdown (its options list opens on a click of the input)."""
    driver.find_element(By.CSS_SELECTOR, f"#{dropdown} input").click()
    option = wait(driver, f"option {value} of #{dropdown}", lambda d: d.find_elements(
        By.CSS_SELECTOR, f'li[data-testid="dropdown-option"][aria-label="{value}"]'), 10, log)[0]
    option.click()


# Resolves after two animation frames: whatever the last DOM change laid out has been painted.
PAINTED_JS = ("const done = arguments[arguments.length - 1]; "
              "requestAnimationFrame(() => requestAnimationFrame(() => done(document.readyState)));")


def settled(driver, log: Path) -> None:
    """Wait until no toast is left (closing those still open) and the page has painted."""
    wait(driver, "the toasts closed", lambda d: close_toasts(d) or not d.find_elements(
        By.CSS_SELECTOR, ".toast-body"), 15, log)
    wait(driver, "the page painted", lambda d: d.execute_async_script(PAINTED_JS) == "complete", 15, log)


def shot(driver, name: str, log: Path) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    settled(driver, log)
    assert driver.save_screenshot(str(SHOTS / name)) and (SHOTS / name).stat().st_size > 10_000
