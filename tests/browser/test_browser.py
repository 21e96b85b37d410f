"""End-to-end: `python app.py` in a subprocess, driven by headless Debian chromium through selenium.

One visit, in order: the page and its examples table (a click fills the form), an empty text gives a
one-line error toast and no traceback, a clip plays and downloads, the TTFP and RTF plots draw its
point in its mode's colour, Stop says so and keeps the partial audio as a labelled download, a request
in a different mode (OMNI_TTS_BROWSER_MODE, default 'default', warmed in the background) draws a
point of the second colour, and the default mode changes from the panel. Then the tables' layout at
1400 and 1000 px (no header or figure broken inside a word, none cut), and a second visitor's page
appearing while the first visitor's long synthesis still runs (Stop then still clickable). Last, on a
second app over the Base checkpoint, a voice saved through POST /v1/audio/voices is among the page's
Saved voice choices when the page loads again. Screenshots of each tab go to out/screenshots/ (ignored
by git; copied by hand to docs/screenshots/ when they change). Skips only when
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

from omni_tts.limits import MAX_INPUT_CHARS as MAX_TEXT

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/qwen3_tts_tiny/custom_voice"
BASE_FIXTURE = ROOT / "tests/fixtures/qwen3_tts_tiny/base"
SHOTS = ROOT / "out" / "screenshots"  # ignored by git (/out/ in .gitignore)
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
OTHER_MODE = os.environ.get("OMNI_TTS_BROWSER_MODE", "default")  # on CPU its compile warms in the background
WARM_TIMEOUT_S = float(os.environ.get("OMNI_TTS_BROWSER_WARM_S", "600"))
assert OTHER_MODE in ("default", "reduce-overhead", "default+cudagraph"), "the switch needs a mode other than eager"
COLORS = {"eager": "#f97316", "default": "#2563eb", "reduce-overhead": "#9333ea", "default+cudagraph": "#16a34a"}
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1500", "--autoplay-policy=no-user-gesture-required"]

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _app(tmp, model: Path, modes: list[str]):
    """`python app.py` on `model` at a free port, its voice store under `tmp`; yields (url, log path).
    Small preset: 2 slots, short KV cache, every mode of `modes` resident (the non-eager ones warming in
    the background while the first steps run)."""
    preset = tmp / "browser.yaml"
    preset.write_text(f"mode: eager\nmodes: [{', '.join(modes)}]\ndevice: cpu\nmax_num_seqs: 2\nmax_seq_len: 2048\n"
                      "initial_chunk_frames: 1\nchunk_frames: 8\n")
    port, log = _free_port(), tmp / "server.log"
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


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The CustomVoice app with eager and OTHER_MODE: (url, log path)."""
    yield from _app(tmp_path_factory.mktemp("app"), FIXTURE, sorted({"eager", OTHER_MODE}))


@pytest.fixture(scope="module")
def base_server(tmp_path_factory):
    """The Base (voice-cloning) app, eager only, with its own empty voice store: (url, log path)."""
    yield from _app(tmp_path_factory.mktemp("base-app"), BASE_FIXTURE, ["eager"])


def _chromium():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={tempfile.mkdtemp(prefix='omni-tts-chromium-')}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    return driver


@pytest.fixture(scope="module")
def browser():
    driver = _chromium()
    yield driver
    driver.quit()


def _wait(driver, what: str, condition, timeout: float, log: Path):
    try:
        # an element the page replaced (a toast that closed itself) between finding and reading it: look again
        return WebDriverWait(driver, timeout, poll_frequency=0.25,
                             ignored_exceptions=(StaleElementReferenceException,)).until(lambda d: condition(d))
    except TimeoutException:
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / "failure.png"
        driver.save_screenshot(str(shot))
        panel = {css: _text(driver, css) for css in ("#live-metrics", "#mode-readiness", "#notice")}
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (screenshot {shot}); panel: {panel!r}; "
                    f"server log:\n{log.read_text()[-3000:]}")


def _clicked(element) -> bool:
    """Click `element`; False while another element still covers it (the page is laying itself out)."""
    try:
        element.click()
        return True
    except ElementClickInterceptedException:
        return False


# The tiny random checkpoint can end a request by itself (its EOS) at any frame, so a request meant to be
# stopped may be over before Stop lands; the tests start another then (the page says "Nothing to stop").
STOP_ATTEMPTS = 5


def _started(driver, points: int, log: Path) -> bool:
    """After Generate: True once the request shows running, False if it was over first (the eager plot then
    holds one more point than `points`)."""
    return _wait(driver, "the request running (or over)", lambda d: "running" if "running #" in _text(
        d, "#live-metrics") else "over" if _points(d, "ttfp-plot", "eager") > points else None, 60, log) == "running"


def _ended(driver, points: int, log: Path) -> None:
    """Wait for a request that ended by itself to be drawn (the eager plot holds points + 1)."""
    _wait(driver, "the request that ended by itself in the plots", lambda d: "running #" not in _text(
        d, "#live-metrics") and _points(d, "ttfp-plot", "eager") == points + 1, 30, log)


def _stop(driver, log: Path) -> bool:
    """Click Stop (once nothing covers it) -> True when it stopped a running request, False when the
    request had already ended by itself."""
    _wait(driver, "no earlier Stop toast", lambda d: _close_toasts(d) or not (
        _toast(d, "Stopping request") or _toast(d, "Nothing to stop")), 10, log)
    _wait(driver, "Stop clickable (no overlay over it)", lambda d: _clicked(d.find_element(By.CSS_SELECTOR,
          "#stop")), 10, log)
    said = _wait(driver, "the Stop toast", lambda d: "stopping" if _toast(d, "Stopping request") else
                 "ended" if _toast(d, "Nothing to stop") else None, 15, log)
    return said == "stopping"


# The input of the clone form's "Saved voice" dropdown (found by its label: the component has no elem_id).
SAVED_VOICE_INPUT = 'input[role="combobox"][aria-label="Saved voice"]'


def _text(driver, css: str) -> str:
    """An element's visible text with whitespace collapsed (code spans render on their own lines)."""
    els = driver.find_elements(By.CSS_SELECTOR, css)
    return " ".join(els[0].text.split()) if els else ""


def _points(driver, plot: str, mode: str) -> int:
    """Points of `mode` drawn in a plot with that mode's colour."""
    return driver.execute_script(
        f"return document.querySelectorAll('#{plot} circle.point[data-mode=\"{mode}\"][fill=\"{COLORS[mode]}\"]')"
        ".length")


def _toast(driver, words: str) -> bool:
    return any(words in e.text for e in driver.find_elements(By.CSS_SELECTOR, ".toast-body"))


def _close_toasts(driver) -> None:
    for close in driver.find_elements(By.CSS_SELECTOR, ".toast-close"):
        try:
            close.click()
        except Exception:  # a toast that closed by itself meanwhile
            pass


def _set_number(driver, css: str, value: str) -> None:
    box = driver.find_element(By.CSS_SELECTOR, css)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(value, Keys.TAB)


def _pick(driver, dropdown: str, value: str, log: Path) -> None:
    """Choose `value` in a gr.Dropdown (its options list opens on a click of the input)."""
    driver.find_element(By.CSS_SELECTOR, f"#{dropdown} input").click()
    option = _wait(driver, f"option {value} of #{dropdown}", lambda d: d.find_elements(
        By.CSS_SELECTOR, f'li[data-testid="dropdown-option"][aria-label="{value}"]'), 10, log)[0]
    option.click()


# Resolves after two animation frames: whatever the last DOM change laid out has been painted.
PAINTED_JS = ("const done = arguments[arguments.length - 1]; "
              "requestAnimationFrame(() => requestAnimationFrame(() => done(document.readyState)));")


def _settled(driver, log: Path) -> None:
    """Wait until no toast is left (closing those still open) and the page has painted."""
    _wait(driver, "the toasts closed", lambda d: _close_toasts(d) or not d.find_elements(
        By.CSS_SELECTOR, ".toast-body"), 15, log)
    _wait(driver, "the page painted", lambda d: d.execute_async_script(PAINTED_JS) == "complete", 15, log)


def _shot(driver, name: str, log: Path) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    _settled(driver, log)
    assert driver.save_screenshot(str(SHOTS / name)) and (SHOTS / name).stat().st_size > 10_000


def test_a_first_visit(server, browser):
    """One visitor's path through the page: an example fills the form, bad input is one toast, a
    synthesis gives a wav, figures and plot points, Stop keeps the partial audio, a request in another
    mode warms it and is served, the panel switches the default mode, and the other tabs open."""
    url, log = server
    d = browser
    d.get(url)
    _wait(d, "the page", lambda d: d.find_elements(By.CSS_SELECTOR, "#generate"), 30, log)
    assert "Model:" in _text(d, "#banner") and "TTFP: time to first packet" in _text(d, "#metric-definitions")
    box = _example_fills_the_form(d, log)
    _bad_input_then_a_synthesis(d, box, log)
    eager_points = 1 + _stop_keeps_the_partial_audio(d, log)
    _a_request_in_another_mode(d, eager_points, log)
    _switch_the_default_mode(d, log)
    for tab, panel, name in (("Listening test", "tab-listening", "listening.png"),
                             ("Load test", "tab-load", "load.png")):
        d.find_element(By.XPATH, f"//button[@role='tab' and normalize-space()='{tab}']").click()
        _wait(d, f"the {tab} tab's panel shown", lambda d: d.find_element(By.ID, panel).is_displayed(), 10, log)
        _shot(d, name, log)


def _example_fills_the_form(d, log):
    """Click the first example; -> the text box it filled."""
    first = _wait(d, "the examples table", lambda d: d.find_elements(By.CSS_SELECTOR, "#examples tbody tr"), 10, log)
    _wait(d, "the first example clickable", lambda d: _clicked(first[0]), 10, log)  # it fills the form
    box = d.find_element(By.CSS_SELECTOR, "#text textarea")
    _wait(d, "the example's text in the form", lambda d: box.get_attribute("value").startswith("Hello! This is"),
          10, log)
    _wait(d, "the character counter", lambda d: re.fullmatch(rf"\d+ / {MAX_TEXT} characters", _text(
        d, "#char-counter")) and _text(d, "#char-counter") != f"33 / {MAX_TEXT} characters", 10, log)
    return box


def _bad_input_then_a_synthesis(d, box, log):
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    d.find_element(By.CSS_SELECTOR, "#generate").click()  # bad input: a one-line error toast, no traceback
    _wait(d, "the empty-text error toast", lambda d: _toast(d, "Text is empty"), 15, log)
    assert "Traceback" not in d.find_element(By.TAG_NAME, "body").text
    assert "Traceback" not in log.read_text()

    d.find_element(By.CSS_SELECTOR, "#sampling button.label-wrap").click()  # open the Sampling accordion
    _wait(d, "the max-length box", lambda d: d.find_elements(By.CSS_SELECTOR, "#max-len input[type=number]"), 10, log)
    _set_number(d, "#max-len input[type=number]", "24")
    box.send_keys("Hello from the browser test.")
    d.find_element(By.CSS_SELECTOR, "#generate").click()  # and the app still serves
    href = _wait(d, "the downloadable wav", lambda d: next((a.get_attribute("href") for a in d.find_elements(
        By.CSS_SELECTOR, "#download a") if ".wav" in (a.get_attribute("href") or "")), None), 60, log)
    with urllib.request.urlopen(href, timeout=10) as r:
        assert r.read(4) == b"RIFF", "the download is not a wav file"
    _wait(d, "queued/TTFP/playable/E2E/RTF of the finished request", lambda d: re.search(
        r"last #\d+ \(eager\) \d+ ms \d+ ms \d+ ms \d+ ms \d+\.\d{3} \d+\.\d\d s", _text(d, "#live-metrics")), 15,
        log)
    _wait(d, "the request's point in both plots, in eager's colour", lambda d: _points(d, "ttfp-plot", "eager") == 1
          and _points(d, "rtf-plot", "eager") == 1, 15, log)


def _stop_keeps_the_partial_audio(d, log) -> int:
    """Start long requests until Stop reaches one before it ends; -> how many requests that took."""
    _set_number(d, "#max-len input[type=number]", "180")
    for attempt in range(1, STOP_ATTEMPTS + 1):
        d.find_element(By.CSS_SELECTOR, "#generate").click()
        if _started(d, attempt, log) and _stop(d, log):
            break
        _ended(d, attempt, log)
    else:
        pytest.fail(f"every one of {STOP_ATTEMPTS} requests ended before Stop reached it")
    _wait(d, "the partial audio download", lambda d: "Stopped: partial audio" in _text(d, "#download")
          and "cancelled" in _text(d, "#live-metrics") and "Stopped:" in _text(d, "#notice"), 30, log)
    _wait(d, "the stopped request in the plots", lambda d: _points(d, "ttfp-plot", "eager") == 1 + attempt, 15, log)
    return attempt


def _a_request_in_another_mode(d, eager_points: int, log):
    _set_number(d, "#max-len input[type=number]", "24")
    _pick(d, "request-mode", OTHER_MODE, log)  # the same form, a different mode for this request
    d.find_element(By.CSS_SELECTOR, "#generate").click()
    _wait(d, f"a {OTHER_MODE} point in both plots (its mode warms first)", lambda d: _points(
        d, "ttfp-plot", OTHER_MODE) == 1 and _points(d, "rtf-plot", OTHER_MODE) == 1, WARM_TIMEOUT_S, log)
    assert f"({OTHER_MODE})" in _text(d, "#live-metrics") and _points(d, "ttfp-plot", "eager") == eager_points
    # it served once warm for top-k sampling; the rest of its warm-up may still run between requests
    assert re.search(rf"{re.escape(OTHER_MODE)} ?: (ready\b|warming \d+/\d+ \(serving meanwhile\))",
                     _text(d, "#mode-readiness"))
    _shot(d, "synthesis.png", log)


def _switch_the_default_mode(d, log):
    d.find_element(By.CSS_SELECTOR, "#engine-mode button.label-wrap").click()  # the panel's default mode
    radio = f'#mode-radio label[data-testid="{OTHER_MODE}-radio-label"]'
    _wait(d, "the opened default-mode panel", lambda d: d.find_elements(By.CSS_SELECTOR, radio), 10, log)[0].click()
    d.find_element(By.CSS_SELECTOR, "#apply-mode").click()
    _wait(d, f"the engine to report default mode {OTHER_MODE}", lambda d: f"now run {OTHER_MODE}" in _text(
        d, "#mode-status") and f"default mode {OTHER_MODE}" in _text(d, "#engine-figures"), 30, log)


# A text node that takes more than one line box has been broken inside a word or a number (the tables'
# cells are single words or figures, or nowrap phrases); a cell whose content is wider than the cell is cut.
BROKEN_CELLS_JS = """
const broken = [];
for (const cell of document.querySelectorAll(arguments[0])) {
  if (!cell.offsetParent) continue;
  const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walk.nextNode(); node; node = walk.nextNode()) {
    if (!node.textContent.trim()) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const rects = [...range.getClientRects()].filter(r => r.width > 0);
    const lines = new Set(rects.map(r => Math.round(r.top / 4)));
    if (lines.size > 1) broken.push(cell.innerText.trim() + ' (' + lines.size + ' lines)');
  }
  if (cell.scrollWidth > cell.clientWidth + 1) broken.push(cell.innerText.trim() + ' (cut)');
}
return broken;
"""
TABLE_CELLS = ", ".join(f"{table} {cell}" for table in ("#live-metrics", "#load-summary", "#load-per-request")
                        for cell in ("th", "td"))


def test_b_tables_keep_headers_and_numbers_whole_at_1400_and_1000_px(server, browser):
    url, log = server
    d = browser
    d.set_window_size(1400, 1500)
    d.find_element(By.XPATH, "//button[@role='tab' and normalize-space()='Load test']").click()
    run = _wait(d, "the load test's button", lambda d: [b for b in d.find_elements(By.TAG_NAME, "button")
                                                          if b.text == "Run load test"], 10, log)[0]
    run.click()
    _wait(d, "both load-test tables filled", lambda d: "2/2 requests done" in d.page_source and len(re.findall(
        r"\beager done\b", _text(d, "#load-per-request"))) == 2, 120, log)
    for width in (1400, 1000):
        d.set_window_size(width, 1500)
        _wait(d, f"the page laid out at {width} px", lambda d: d.execute_script("return window.innerWidth") <= width,
              10, log)
        headers = d.execute_script(f"return document.querySelectorAll('{TABLE_CELLS}').length")
        assert headers >= 3 * 7, "the tables are not on the page"
        assert d.execute_script(BROKEN_CELLS_JS, TABLE_CELLS) == [], f"cells broken mid-word at {width} px"
        _shot(d, f"load-{width}.png", log)
    d.set_window_size(1400, 1500)
    # the check itself: headers squeezed into narrow columns are seen broken (as the old layout broke them)
    squeeze = ("#load-summary th, #load-summary th * {white-space: normal !important; word-break: break-all "
               "!important; width: 14px !important; min-width: 0 !important; max-width: 14px !important} "
               "#load-summary table {table-layout: fixed !important; width: 100px !important; min-width: 0 !important}")
    d.execute_script("const s = document.createElement('style'); s.id = 'squeeze'; s.textContent = arguments[0]; "
                     "document.head.appendChild(s)", squeeze)
    assert d.execute_script(BROKEN_CELLS_JS, "#load-summary th"), "the check must see headers squeezed to break"
    d.execute_script("document.getElementById('squeeze').remove()")


def test_c_a_second_visitor_loads_while_a_synthesis_runs(server, browser):
    url, log = server
    d = browser
    d.find_element(By.XPATH, "//button[@role='tab' and normalize-space()='Synthesis']").click()
    box = d.find_element(By.CSS_SELECTOR, "#text textarea")  # a text over the limit, as a script sets it
    d.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input', "
                     "{bubbles: true}))", box, "y" * (MAX_TEXT + 5))
    _wait(d, "the counter saying the text is too long", lambda d: _text(d, "#char-counter").startswith(
        f"{MAX_TEXT + 5} / {MAX_TEXT} characters: too long"), 10, log)
    d.find_element(By.CSS_SELECTOR, "#generate").click()  # Generate says so too, never silently nothing
    _wait(d, "the too-long toast", lambda d: _toast(d, "Text is too long"), 15, log)
    _close_toasts(d)
    _set_number(d, "#max-len input[type=number]", "1800")  # minutes of audio: runs until stopped
    # eager: a request in a warming mode waits out a warm step's compile, which on a CPU can outlast the
    # wait for the Stop below, before its cancel takes effect at the next frame
    _pick(d, "request-mode", "eager", log)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("A long text for a long synthesis. " * 8)
    for _ in range(STOP_ATTEMPTS):
        points = _points(d, "ttfp-plot", "eager")
        d.find_element(By.CSS_SELECTOR, "#generate").click()
        if _started(d, points, log) and _second_visitor_while_running(d, url, log) and _stop(d, log):
            break
        _ended(d, points, log)
    else:
        pytest.fail(f"every one of {STOP_ATTEMPTS} long requests ended before the second page or Stop")
    _wait(d, "the stopped request", lambda d: "cancelled" in _text(d, "#live-metrics"), 30, log)


def _second_visitor_while_running(d, url: str, log: Path) -> bool:
    """A second browser loads the page while `d`'s request runs; it shows none of `d`'s requests. -> whether
    `d`'s request was still running when the page was up."""
    second = _chromium()
    try:
        second.get(url)
        _wait(second, "the second visitor's page", lambda s: s.find_elements(By.CSS_SELECTOR, "#generate")
              and s.find_elements(By.CSS_SELECTOR, "#examples tbody tr"), 60, log)
        running = "running #" in _text(d, "#live-metrics")
        assert "last – " in _text(second, "#live-metrics") or "#" not in _text(second, "#live-metrics")
        return running
    finally:
        second.quit()


def test_d_a_voice_saved_by_api_is_listed_on_the_page(base_server, browser):
    from test_voices_api import upload  # one multipart upload (a real reference clip) serves both suites

    url, log = base_server
    r = upload(url.rstrip("/"), "Browser Voice", x_vector_only="true")
    assert r.status_code == 200, r.text
    name = r.json()["name"]
    d = browser
    d.get(url)  # the page reads the voice store again on load
    _wait(d, "the Base checkpoint's page", lambda d: d.execute_script("return document.readyState") == "complete"
          and d.find_elements(By.CSS_SELECTOR, SAVED_VOICE_INPUT), 30, log)
    box = d.find_element(By.CSS_SELECTOR, SAVED_VOICE_INPUT)
    _wait(d, "the Saved voice dropdown clickable", lambda d: _clicked(box), 10, log)
    listed = _wait(d, f"{name!r} among the Saved voice choices", lambda d: [o.get_attribute("aria-label") for o in
                   d.find_elements(By.CSS_SELECTOR, 'li[data-testid="dropdown-option"]') if
                   o.get_attribute("aria-label") == name], 15, log)
    assert listed == [name]
    _shot(d, "saved-voice.png", log)
