"""The Gradio app's page and handlers, on the real engine over the tiny checkpoint on CPU.

Handlers are called directly (no server, no browser: tests/test_api.py serves over HTTP and
tests/browser/ drives chromium). No engine mocks. Also: the voice library and the engine panel. The
helpers that need no engine are tests/test_ui_helpers.py's.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import numpy as np
import pytest
import soundfile as sf
from _fixtures import FIXTURES  # noqa: E402

import app
from omni_tts.config import EngineConfig
from omni_tts.ui import engine_actions, files, formatting, handlers
from omni_tts.ui import support as ui

MAX_LEN = 20  # frames: keeps every synthesis well under a second on CPU
# the tiny random checkpoint never ends a clip by itself: every clip stops at Max length and says so
pytestmark = pytest.mark.filterwarnings("ignore:The clip stopped at Max length")


def form(**kw):
    return ui.form(**{"text": "Hello there.", "speaker": "ryan", "language": "english", "max_len": MAX_LEN,
                      "seed": 3, **kw})


def visitor(key: str):
    return SimpleNamespace(session_hash=key)


@pytest.fixture(scope="module")
def engine():
    from omni_tts.engine.engine import Engine

    eng = Engine.from_config(EngineConfig(model=str(FIXTURES / "custom_voice"), device="cpu", max_num_seqs=2,
                                          max_seq_len=256, mode="eager", initial_chunk_frames=1, chunk_frames=4))
    yield eng
    eng.shutdown()


def _component(demo: gr.Blocks, elem_id: str):
    found = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id]
    assert found, f"no component with elem_id {elem_id}"
    return found[0]


def test_page_shows_the_checkpoint_in_users_words(engine):
    demo = app.build_demo(engine, streaming=False)
    banner = _component(demo, "banner").value
    assert "given with --model" in banner and "Streaming off" in banner and "E2E" in banner
    speakers = dict((v, k) for k, v in _component(demo, "speaker").choices)
    assert speakers["ryan"].startswith("Ryan — dynamic male voice") and speakers["vivian"].startswith("Vivian — ")
    langs = [k for k, _ in next(c for c in demo.blocks.values() if getattr(c, "label", "") == "Language").choices]
    assert "English" in langs and "Auto (detect)" in langs and all(x[0].isupper() for x in langs)
    assert [v for _, v in _component(demo, "mode-radio").choices] == list(formatting.MODES)
    readiness = _component(demo, "mode-readiness").value
    assert "`eager`: **ready, default**" in readiness and "`default+cudagraph`: **unavailable" in readiness
    assert "TTFP: time to first packet" in _component(demo, "metric-definitions").value
    assert _component(demo, "download").visible is False  # no empty download box before the first clip
    assert _component(demo, "max-len").maximum <= engine.config.max_seq_len
    examples = _component(demo, "examples")
    assert any("Hello! This is omni-tts" in str(row) for row in examples.samples)


def test_only_the_named_synthesize_endpoint_is_public(engine):
    api = app.build_demo(engine).get_api_info()
    assert list(api["named_endpoints"]) == ["/synthesize"] and not api.get("unnamed_endpoints")
    params = api["named_endpoints"]["/synthesize"]["parameters"]
    assert [p["parameter_name"] for p in params if not p["parameter_has_default"]] == ["text"]
    assert {"speaker", "language", "instruct", "mode", "seed", "max_new_tokens", "ref_audio"} <= \
        {p["parameter_name"] for p in params}


def test_api_and_page_share_the_request_bounds_and_the_clis_words(engine):
    from omni_tts import limits
    from omni_tts.ui import api

    demo = app.build_demo(engine)
    endpoint = demo.get_api_info()["named_endpoints"]["/synthesize"]
    described = endpoint["description"]
    for p in endpoint["parameters"]:  # every parameter is described, and the /v1 routes are named
        assert f"{p['parameter_name']}: {api.PARAMS[p['parameter_name']]}" in described
    assert "/v1/audio/speech" in described and "custom_voice, voice_design, voice_clone" in described
    temperature = next(b for b in demo.blocks.values() if getattr(b, "label", "") == "Temperature")
    high = limits.LIMITS["temperature"].high
    assert temperature.maximum == high  # the page's slider ends where SynthesisParams' bounds end
    for kw, words in ((dict(temperature=high + 1), "temperature must be"), (dict(task="Base"), "custom_voice, "
                      "voice_design, voice_clone"), (dict(max_new_tokens=1), "max_new_tokens must be >= 2")):
        with pytest.raises(gr.Error, match=re.escape(words)):
            api.synthesize_request(engine, engine.model_info(), "Hi.", **kw)
    path, metrics = api.synthesize_request(engine, engine.model_info(), "Hi.", temperature=high / 2,
                                           max_new_tokens=4, seed=1)
    assert metrics["frames"] == 3 and sf.read(path)[0].size > 0


def test_synthesis_streams_then_gives_file_history_and_figures(engine):
    outs = list(handlers.synthesize(engine, form(), [], streaming=True, request=visitor("a")))
    chunks = [o[0] for o in outs[:-1]]
    assert len(chunks) > 1 and all(isinstance(c, bytes) and c[:4] == b"RIFF" for c in chunks)
    _, whole, file, live, history, notice = outs[-1]
    wav, sr = sf.read(file["value"])
    assert sr == engine.sample_rate and wav.size > 0 and file["visible"] and file["label"] == "Download wav"
    assert len(history) == 1 and history[0]["status"] == "done" and history[0]["mode"] == "eager"
    assert re.search(r"\| last #\d+ \(eager\) \| \d+ ms \| \d+ ms \| \d+ ms \| \d+ ms \| \d\.\d{3} \| \d+\.\d\d s \|",
                     live), live
    assert history[0]["playable_ms"] == history[0]["ttfp_ms"]  # streaming: playable at the first chunk
    assert 0 <= history[0]["queue_ms"] <= history[0]["ttfp_ms"]
    off = list(handlers.synthesize(engine, form(), history, streaming=False))[-1]
    sr2, pcm = off[1]
    assert sr2 == engine.sample_rate and pcm.dtype == np.int16 and pcm.size > 0
    assert off[4][-1]["playable_ms"] == off[4][-1]["e2e_ms"]  # not streaming: playable when finished


def test_history_and_running_request_are_per_visitor(engine):
    mine = list(handlers.synthesize(engine, form(text="Mine."), [], request=visitor("me")))[-1][4]
    theirs = list(handlers.synthesize(engine, form(text="Theirs."), [], request=visitor("them")))[-1][4]
    mine = list(handlers.synthesize(engine, form(text="Mine again."), mine, request=visitor("me")))[-1][4]
    # each visitor counts their own requests from 1, whatever the engine served before
    assert [r["request"] for r in mine] == [1, 2] and [r["request"] for r in theirs] == [1]
    assert mine[0]["id"] < theirs[0]["id"] < mine[1]["id"]
    live, panel, readiness, ttfp, rtf, plotted = handlers.refresh_panel(engine, mine, -1, visitor("me"))
    assert "last #2 (eager)" in live and f"{mine[-1]['e2e_ms']:.0f} ms" in live
    assert "all visitors" in panel and "ready, default" in readiness
    assert ttfp.count('class="point"') == 2 and "#2 eager" in ttfp  # only this visitor's
    assert plotted == mine[-1]["request"]
    assert handlers.refresh_panel(engine, mine, plotted, visitor("me"))[3] is not ttfp  # unchanged: not re-sent
    assert handlers.stop(visitor("me")) == "nothing running"  # the other visitor's requests are not ours


def test_stop_keeps_the_partial_audio_and_records_the_request(engine):
    gen = handlers.synthesize(engine, form(text="A longer sentence to be stopped early. " * 3, max_len=200), [],
                              request=visitor("stopper"))
    next(gen)  # the first chunk is out
    assert handlers.stop(visitor("stopper")).startswith("stopped request")
    outs = list(gen)
    _, _, file, live, history, notice = outs[-1]
    assert history[-1]["status"] == "cancelled" and "Stopped" in notice and "cancelled" in live
    assert file["label"].startswith("Stopped: partial audio (") and Path(file["value"]).name.startswith("stopped")
    wav, _ = sf.read(file["value"])
    assert 0 < wav.size < 199 * 1920  # part of the clip: fewer samples than 199 frames would make


def test_a_clip_cut_at_max_length_says_so(engine):
    with pytest.warns(UserWarning, match="Max length"):
        out = list(handlers.synthesize(engine, form(max_len=3)))[-1]
    assert "stopped at Max length (3 frames" in out[5] and out[4][-1]["note"] == "capped"  # as many as asked


def test_speed_plays_the_stretched_clip_whole_and_says_so(engine):
    plain = list(handlers.synthesize(engine, form(seed=11), [], streaming=True))
    fast = list(handlers.synthesize(engine, form(seed=11, speed=2), [], streaming=True))
    made = sf.read(plain[-1][2]["value"])[0].size
    assert plain[-1][5].startswith("The clip stopped")  # speed 1: streamed as before, no speed notice
    assert not any(isinstance(o[0], bytes) for o in fast)  # nothing in the streamed player
    sr, pcm = fast[-1][1]
    assert sr == engine.sample_rate and abs(pcm.size - made / 2) <= 0.05 * made / 2, (pcm.size, made)
    assert sf.read(fast[-1][2]["value"])[0].size == pcm.size  # the download is the clip that plays
    notice = "Speed 2x: the clip plays when it is complete (speed needs the whole clip)"
    assert fast[0][5] == notice and fast[-1][5].startswith(notice)  # said while it runs, and at the end
    entry = fast[-1][4][-1]
    assert entry["status"] == "done" and not entry["streaming"] and entry["playable_ms"] == entry["e2e_ms"]


def test_a_stopped_request_at_another_speed_keeps_its_audio_unstretched(engine):
    gen = handlers.synthesize(engine, form(text="A longer sentence to be stopped early. " * 3, max_len=200, speed=0.5),
                              [], request=visitor("slow"))
    next(gen)  # the first chunk is made
    handlers.stop(visitor("slow"))
    _, whole, file, _, history, notice = list(gen)[-1]
    assert history[-1]["status"] == "cancelled" and notice.startswith("Stopped") and "Speed" not in notice
    samples_per_frame = engine.sample_rate * 2 // 25  # 12.5 frames a second
    assert whole[1].size == sf.read(file["value"])[0].size and whole[1].size % samples_per_frame == 0


@pytest.mark.parametrize("fields, message", [
    ({"text": ""}, "Text is empty"),
    ({"speaker": "nobody"}, "nobody"),
    ({"max_len": 0}, "Max length must be at least 1 frame"),
    ({"text": "x" * 5001}, "Text is too long (5001 characters; at most"),
    ({"seed": 1e300}, "Seed"),
    ({"top_k": float("nan")}, "Top-k must be a finite number"),
    ({"speed": 5}, "Speed must be from 0.25 to 4 (got 5)"),
    ({"speed": "fast"}, "Speed must be a number from 0.25 to 4"),
    ({"task": "voice_clone"}, "Reference audio is empty"),
    ({"task": "voice_design", "instruct": "a calm voice"}, "cannot do task"),
])
def test_bad_input_is_one_toast_in_the_uis_words_and_one_log_line(engine, caplog, fields, message):
    caplog.set_level(logging.WARNING, logger="omni_tts.app")
    with pytest.raises(gr.Error) as err:
        list(handlers.synthesize(engine, form(**fields)))
    text = err.value.message
    assert message in text and "\n" not in text and "max_new_tokens" not in text and "top_k" not in text
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is None
    assert list(handlers.synthesize(engine, form(text="Still serving.")))[-1][4][0]["status"] == "done"


def test_default_mode_switch_shows_the_engines_real_mode(engine):
    bad = next(m for m, why in engine.available_modes().items() if why)  # a CUDA mode on this CPU engine
    with pytest.warns(UserWarning, match="unavailable"):
        status, radio, readiness = engine_actions.apply_mode(engine, bad)
    assert "Not changed" in status and radio["value"] == engine.snapshot().mode == "eager"
    status, radio, _ = engine_actions.apply_mode(engine, "eager")
    assert "now run `eager`" in status and radio["value"] == "eager"
    public = ui.AdminPolicy(public=True)
    with pytest.warns(UserWarning, match="OMNI_TTS_ADMIN_TOKEN"):
        assert "Not changed" in engine_actions.apply_mode(engine, "eager", policy=public)[0]
    guarded = ui.AdminPolicy(token="s3cret", public=True)
    with pytest.warns(UserWarning, match="Admin token"):
        engine_actions.apply_mode(engine, "eager", "wrong", guarded)
    assert "Done" in engine_actions.apply_mode(engine, "eager", "s3cret", guarded)[0]


def test_listening_test_gives_clips_verdict_exports_and_abx(engine):
    out = engine_actions.listening_test(engine, form(), "Compare these modes.", 11, ["eager", "eager"])
    clips, verdict, table, exports, abx, x_path, _ = out[:4], *out[4:]
    assert Path(x_path).name.startswith("X-")  # a neutral name: it must not give the answer away
    assert [c["visible"] for c in clips] == [True, True, False, False]
    assert "**identical**" in verdict  # same mode, same seed, sampling on: must reproduce exactly
    assert list(table["mode"]) == ["eager", "eager"] and exports["visible"] and exports["value"][-1].endswith(".csv")
    csv_text = Path(exports["value"][-1]).read_text()
    assert "/" not in csv_text and "clip-eager" in csv_text  # file names only, no server paths
    assert all(len(str(v).split(".")[-1]) <= 3 for v in table["RTF"])  # rounded
    state, line, _ = engine_actions.abx_guess(abx, abx["x_is"])
    assert state["trials"] == 1 and state["correct"] == 1 and "1 / 1" in line
    again = engine_actions.listening_test(engine, form(), "Again.", 11, ["eager", "eager"], state)
    assert again[7]["trials"] == 1 and again[7]["x_is"] in "AB"  # the visitor's tally carries over


def test_load_test_reports_rounded_tables_and_needs_admin_on_a_public_server(engine):
    table, per, status = engine_actions.load_test(engine, form(), 2, "eager", "one\ntwo words", 0)
    assert list(table.columns) == list(formatting.LOAD_COLUMNS) and status.startswith("2/2")
    assert len(per) == 2 and set(per["status"]) == {"done"} and table["req/s"][0] > 0
    assert list(per["#"]) == [1, 2]  # numbered within the test
    with pytest.raises(gr.Error, match="public server"):
        engine_actions.load_test(engine, form(), 2, "eager", "one", 0, None, ui.AdminPolicy(public=True))


@pytest.fixture(scope="module")
def base_engine():
    from omni_tts.engine.engine import Engine

    eng = Engine.from_config(EngineConfig(model=str(FIXTURES / "base"), device="cpu", max_num_seqs=1,
                                          max_seq_len=256, mode="eager"))
    yield eng
    eng.shutdown()


def test_voice_clone_saved_voice_library_and_a_non_audio_reference(base_engine, tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_TTS_DATA_DIR", str(tmp_path / "data"))
    ref = tmp_path / "ref.wav"
    sf.write(ref, np.load(FIXTURES / "base" / "golden_ref_audio.npy"), 24000)
    clone = dict(task="voice_clone", speaker=None, language="auto", ref_audio=str(ref), ref_text="Hello reference.")
    assert sf.read(list(handlers.synthesize(base_engine, form(**clone)))[-1][2]["value"])[0].size > 0
    junk = tmp_path / "notes.txt"
    junk.write_text("not audio at all")
    with pytest.raises(gr.Error) as err:
        list(handlers.synthesize(base_engine, form(**{**clone, "ref_audio": str(junk)})))
    assert "'notes.txt'" in err.value.message and str(tmp_path) not in err.value.message
    dropdown, download = handlers.voice_save(base_engine, form(**clone, xvec_only=True), "My voice!")
    assert dropdown["value"] == "My_voice" and "My_voice" in dropdown["choices"]
    assert (tmp_path / "data" / "voices" / "My_voice.safetensors").is_file() and download["visible"]
    again = list(handlers.synthesize(base_engine, form(**{**clone, "ref_audio": None, "saved_voice": "My_voice"})))
    assert sf.read(again[-1][2]["value"])[0].size > 0
    with pytest.raises(gr.Error, match="Voice name is empty"):
        handlers.voice_save(base_engine, form(**clone), "../..")


def test_one_mode_listening_tab_says_how_to_add_a_second(engine):
    demo = app.build_demo(engine)
    notice = _component(demo, "listening-single-mode")
    assert notice.visible and "only `eager` runs here" in notice.value and "modes: [eager, default]" in notice.value
    assert "`reduce-overhead`: unavailable: needs a CUDA GPU" in notice.value
    assert "preset key" not in notice.value and _component(demo, "listening-controls").visible is False


def test_what_a_page_fires_by_itself_never_waits_in_the_queue(engine, tmp_path, monkeypatch):
    demo = app.build_demo(engine)
    timer = next(b for b in demo.blocks.values() if isinstance(b, gr.Timer))
    own = [fn for fn in demo.fns.values() if any(t[1] in ("load", "tick") for t in fn.targets)]
    assert {t[1] for fn in own for t in fn.targets} == {"load", "tick"}
    assert all(fn.queue is False and fn.show_progress == "hidden" for fn in own)  # never behind a synthesis
    assert any(timer in fn.outputs for fn in own)  # each tick decides whether the timer goes on
    monkeypatch.setenv("OMNI_TTS_DATA_DIR", str(tmp_path))
    files.voice_path("fresh").parent.mkdir(parents=True, exist_ok=True)
    files.voice_path("fresh").write_bytes(b"")
    assert "fresh" in handlers.saved_voice_choices("")["choices"]  # a page load reads the store again


def test_the_panel_timer_stops_once_everything_settled(engine):
    assert handlers.settled(engine, visitor("idle"))
    gen = handlers.synthesize(engine, form(text="Running. " * 4, max_len=100), [], request=visitor("busy"))
    next(gen)
    assert not handlers.settled(engine, visitor("busy")) and not handlers.settled(engine, visitor("idle"))
    list(gen)
    assert handlers.settled(engine, visitor("busy"))


def test_engine_panel_shows_both_graph_pools_on_a_gpu(engine):
    """The engine figures name the engine's graph pool and Inductor's graph-tree pool (reduce-overhead's
    private one) side by side (CPU engine; its snapshot given a GPU's memory figures)."""
    snap = dataclasses.replace(engine.snapshot(), memory={
        "allocated_gib": 3.0, "reserved_gib": 4.0, "peak_gib": 3.5, "graph_pool_gib": 1.25, "graph_pool_share": 0.31,
        "tree_pool_gib": 0.5, "codec_graph_pool_gib": 2.5})
    text = formatting.engine_markdown(snap)
    assert "CUDA-graph pool 1.25 GiB" in text and "Inductor graph-tree pool 0.50 GiB" in text
    assert "codec chunk graphs 2.50 GiB" in text
    assert "runs on" in formatting.engine_markdown(engine.snapshot())  # no GPU figures on a CPU
