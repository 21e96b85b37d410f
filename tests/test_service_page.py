"""The Gradio side of a request living as long as its client, on the real engine over the tiny checkpoint:
a gradio_client whose process dies (real sockets: app.serve, the page mounted on the service's app), the
page's handler closed by Gradio when its tab goes, a closed tab's unload, a full mode's "busy" toast, and
saved voices that are never overwritten."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import gradio as gr
import pytest
import torch
from _fixtures import free_port
from _serving import LONG, WAIT_S, Ended, tiny_config, until

import app
from omni_tts import voices
from omni_tts.engine.engine import Engine
from omni_tts.errors import InputError
from omni_tts.models.speaker import VoicePrompt
from omni_tts.ui import handlers
from omni_tts.ui import support as ui

NATURAL_FRAMES = LONG["max_new_tokens"] - 1


def form(**kw):
    return ui.form(**{"text": LONG["input"], "speaker": "ryan", "language": "english",
                      "max_len": LONG["max_new_tokens"], "seed": 3, **kw})


@pytest.fixture(scope="module")
def page():
    """(url, engine, ended): the page and the APIs served by app.serve; one slot, one waiting place."""
    engine = Engine.from_config(tiny_config(max_num_seqs=1, max_waiting=1))
    ended = Ended(engine)
    demo = app.build_demo(engine, streaming=True)
    server, url = app.serve(engine, demo, "127.0.0.1", free_port(), block=False)
    yield url, engine, ended
    engine.shutdown()
    server.stop()
    demo.close()


def _idle(engine) -> bool:
    snap = engine.snapshot()
    return snap.active == 0 and snap.waiting == 0


def test_a_gradio_client_that_dies_frees_its_request(page):
    url, engine, ended = page
    until(lambda: _idle(engine), what="an idle engine")
    known = set(ended.by_id)
    # the client's own heartbeat thread may not have connected when it dies; a session's heartbeat is how
    # Gradio learns it left, so the script holds one open (as a page does) before it says it submitted
    script = textwrap.dedent(f"""
        import time, httpx
        from gradio_client import Client
        client = Client({url!r}, verbose=False)
        job = client.submit({LONG['input']!r}, max_new_tokens={LONG['max_new_tokens']}, seed=3, api_name="/synthesize")
        beat = httpx.stream("GET", client.heartbeat_url.format(session_hash=client.session_hash), timeout=None)
        lines = beat.__enter__().iter_lines()  # kept: a dropped line iterator closes its connection at once
        assert next(lines).startswith("data:")
        print("submitted", flush=True)
        time.sleep({WAIT_S})
    """)
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "submitted"
        until(lambda: engine.snapshot().active == 1, what="its request in the slot")
    finally:
        client.kill()  # its sockets close with it, as a closed laptop's would
        client.wait(WAIT_S)
    m = ended.wait_new(known)[0]
    assert m.outcome == "cancelled (client gone)" and m.frames < NATURAL_FRAMES


def test_the_pages_handler_closed_by_gradio_cancels_its_request(page):
    """Gradio closes a streaming handler whose client left (and its non-streaming one: it yields per chunk)."""
    _, engine, ended = page
    for streaming in (True, False):
        until(lambda: _idle(engine), what="an idle engine")
        gen = handlers.synthesize(engine, form(), [], streaming=streaming, request=SimpleNamespace(session_hash="t"))
        next(gen)  # the first chunk is out
        rid = handlers._current("t")[0].id
        gen.close()
        m = ended.wait([rid])[0]
        assert m.outcome == "cancelled (client gone)" and m.frames < NATURAL_FRAMES


def test_a_closed_tab_cancels_its_visitors_requests_only(page):
    _, engine, ended = page
    until(lambda: _idle(engine), what="an idle engine")
    mine = handlers.synthesize(engine, form(), [], request=SimpleNamespace(session_hash="mine"))
    next(mine)
    rid = handlers._current("mine")[0].id
    handlers.left(SimpleNamespace(session_hash="other"))  # someone else's tab
    assert not handlers._current("mine")[0].cancel_requested.is_set()
    handlers.left(SimpleNamespace(session_hash="mine"))  # Gradio's unload when the heartbeat ends
    *_, last = mine
    m = ended.wait([rid])[0]
    assert m.outcome == "cancelled (client gone)" and m.frames < NATURAL_FRAMES
    assert "Stopped" in last[5]


def test_a_full_mode_is_a_busy_toast_on_the_page(page):
    _, engine, ended = page
    until(lambda: _idle(engine), what="an idle engine")
    params = ui.make_params(engine, form(), engine.model_info())
    held = [engine.submit(params)]
    until(lambda: engine.snapshot().active == 1, what="the first request in the slot")
    held.append(engine.submit(params))  # the one waiting place
    with pytest.raises(gr.Error) as err:
        list(handlers.synthesize(engine, form(max_len=6), [], request=SimpleNamespace(session_hash="late")))
    assert "busy" in err.value.message and "try again" in err.value.message and "\n" not in err.value.message
    for h in held:
        h.cancel()
    assert [m.outcome for m in ended.wait([h.id for h in held])] == ["cancelled", "cancelled"]


def test_saved_voice_names_that_collide_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_TTS_DATA_DIR", str(tmp_path))
    first = VoicePrompt(ref_codes=None, x_vector=torch.ones(4), x_vector_only=True)
    voices.save("My voice!", first)
    for clash in ("My voice!", "my voice?", "MY_VOICE"):
        with pytest.raises(InputError, match="taken by a saved voice"):
            voices.save(clash, VoicePrompt(ref_codes=None, x_vector=torch.zeros(4), x_vector_only=True))
    assert voices.saved_voices() == ["My_voice"] and torch.equal(voices.load("My_voice").x_vector, first.x_vector)
    assert voices.save("My voice 2", first)["name"] == "My_voice_2"
