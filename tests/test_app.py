"""The Gradio app's layout and handlers, on the real engine over the tiny checkpoint on CPU.

Handlers are called directly (no server, no browser: tests/browser/ does that). No engine mocks.
Also: model selection (local HF cache scan, fast offline fallback) and the pure UI helpers.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import soundfile as sf

import app
from omni_tts.ui import support as ui
from omni_tts.config import EngineConfig, SynthesisParams

from _fixtures import FIXTURES  # noqa: E402
MAX_LEN = 20  # frames: keeps every synthesis well under a second on CPU
SETTINGS = ("CustomVoice", "ryan", "Auto", "", 0.9, 50, 1.0, 1.05, MAX_LEN)  # task .. max_len


@pytest.fixture(scope="module")
def engine():
    """The real engine on the tiny CustomVoice fixture, or on the embedded tiny checkpoint without it."""
    from omni_tts.models.checkpoint_maker import embedded_checkpoint_dir
    from omni_tts.engine.engine import Engine

    model = FIXTURES / "custom_voice"
    if not (model / "config.json").is_file():
        model = embedded_checkpoint_dir()
    eng = Engine.from_config(EngineConfig(model=str(model), device="cpu", max_num_seqs=2, max_seq_len=256,
                                          mode="eager"))
    yield eng
    eng.shutdown()


def _component(demo: gr.Blocks, elem_id: str):
    found = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id]
    assert found, f"no component with elem_id {elem_id}"
    return found[0]


def _switch_target(engine) -> str:
    """The mode the switch tests go to: OMNI_TTS_TEST_SWITCH_MODE, else the current one again (re-applied
    through the same path: on CPU, compiling 'default' with Inductor takes minutes, too slow here)."""
    return os.environ.get("OMNI_TTS_TEST_SWITCH_MODE") or engine.snapshot()["mode"]


def test_build_demo_fills_controls_from_the_checkpoint(engine):
    demo = app.build_demo(engine)
    assert isinstance(demo, gr.Blocks)
    banner = _component(demo, "banner").value
    assert "given with --model" in banner and str(engine.model.checkpoint.path) in banner
    assert ("noise, not speech" in banner) == engine.model.checkpoint.is_embedded_demo
    speakers = [c for c in demo.blocks.values() if isinstance(c, gr.Dropdown) and c.label == "Speaker"][0]
    assert {"ryan", "vivian"} <= {v for v, _ in speakers.choices}
    radio = _component(demo, "mode-radio")
    assert [v for v, _ in radio.choices] == list(ui.MODES)
    notes = _component(demo, "mode-notes").value
    for mode, why in engine.available_modes().items():  # CPU: the CUDA-graph modes say why not
        assert (why in notes) if why else (f"`{mode}`: available" in notes)
    assert "unavailable" in notes


def test_banner_of_the_embedded_demo_says_noise_and_how_to_load_a_real_model():
    from omni_tts.models.checkpoint_maker import embedded_checkpoint_dir
    from omni_tts.engine.engine import Engine

    eng = Engine.from_config(EngineConfig(model=str(embedded_checkpoint_dir()), device="cpu", max_num_seqs=1,
                                          max_seq_len=64, mode="eager"))
    try:
        banner = _component(app.build_demo(eng), "banner").value
    finally:
        eng.shutdown()
    assert "embedded tiny random demo checkpoint" in banner and "noise, not speech" in banner
    assert "--model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice" in banner


def test_synthesis_streams_audio_then_the_file_and_metrics(engine):
    session: dict = {}
    outs = list(app.synthesize(engine, session, "Hello there.", 3, *SETTINGS))
    chunks = [a for a, _, _ in outs[:-1]]
    assert chunks and all(isinstance(c, bytes) and c[:4] == b"RIFF" for c in chunks)
    audio, path, live = outs[-1]
    wav, sr = sf.read(path)
    assert sr == engine.model.sample_rate and wav.size > 0
    assert re.search(r"\| last #\d+ \(eager\) \| \d+ ms \| \d+ ms \| \d+\.\d{3} \| \d+\.\d\d s \|", live), live
    assert session["handle"].done and session["handle"].metrics.status == "done"


def test_zero_gpu_handler_makes_the_same_clip_in_one_call(engine):
    """The ZeroGPU handler (plain path, inside one GPU call) gives the engine's codes and audio."""
    greedy = ("CustomVoice", "ryan", "English", "", 0.0, 50, 1.0, 1.05, MAX_LEN)  # temperature 0: greedy
    (sr, pcm), path, live = app.synthesize_in_call(engine, {}, "Zero GPU check.", 5, *greedy)
    streamed = list(app.synthesize(engine, {}, "Zero GPU check.", 5, *greedy, streaming=False))[-1]
    assert sr == engine.model.sample_rate and pcm.dtype == np.int16 and pcm.size > 0
    other = streamed[0][1]  # the engine's whole clip as pcm16 (joined chunks: float32 rounding apart)
    assert pcm.shape == other.shape and np.abs(pcm.astype(int) - other.astype(int)).max() <= 1
    wav, _ = sf.read(path)
    assert wav.shape[0] == pcm.shape[0]
    assert re.search(r"\| last #0 \(eager\) \|", live), live


def test_stop_cancels_the_running_request(engine):
    session: dict = {}
    gen = app.synthesize(engine, session, "A longer sentence to be stopped early. " * 3, 1,
                         *SETTINGS[:-1], 200)
    next(gen)  # first chunk is out
    assert app.stop(session).startswith("stopped request")
    list(gen)
    assert session["handle"].metrics.status == "cancelled"
    assert session["handle"].metrics.frames < 200


@pytest.mark.parametrize("text, settings, message", [
    ("", SETTINGS, "text is empty"),
    ("hi", ("CustomVoice", "nobody", *SETTINGS[2:]), "nobody"),
    ("hi", ("VoiceDesign", None, "Auto", "", *SETTINGS[4:]), "instruct"),
])
def test_bad_input_is_one_line_gr_error_and_the_next_request_works(engine, text, settings, message):
    with pytest.raises(gr.Error) as err:
        list(app.synthesize(engine, {}, text, 0, *settings))
    assert message in err.value.message and "\n" not in err.value.message
    outs = list(app.synthesize(engine, {}, "Still serving.", 0, *SETTINGS))
    assert Path(outs[-1][1]).is_file()


def test_mode_switch_updates_the_panel_and_reports_cost(engine):
    original, target = engine.snapshot()["mode"], _switch_target(engine)
    try:
        outs = list(app.apply_mode(engine, target))
        status, panel = outs[-1]
        assert f"now `{target}`" in status and re.search(r"took \d+\.\d s", status)
        assert f"mode** `{target}`" in panel
        # no Triton layers off CUDA: the reference modules in eager, Inductor's kernels in the compiled modes
        want = "reference modules" if target == "eager" else "Inductor kernels"
        assert f"layer kernels: {want}" in panel
        # on CPU the codec runs exact float32, eager ops, no graphs; a clip adds to its decode counts
        line = panel.split("**code-to-wave:** ")[1]
        assert line.startswith("`float32` · fused activations off · first-chunk graphs off · ")
        calls = engine.snapshot()["decode_calls"]
        engine.synthesize(SynthesisParams(text="Hi.", speaker=engine.model.speakers()[0], max_new_tokens=3))
        line = ui.engine_markdown(engine.snapshot()).split("**code-to-wave:** ")[1]
        got = re.search(r"(\d+) chunks in (\d+) batched calls, \d+\.\d ms per call", line)
        assert got and int(got[2]) > calls and int(got[1]) >= int(got[2])
        assert target in engine.snapshot()["capture"]  # the engine recorded what the switch cost
        live, panel2, ttfp_plot, rtf_plot, plotted = app.refresh_panel(engine, {})
        assert f"`{target}`" in panel2 and len(ttfp_plot["value"]) >= 1 and plotted[1] == 1
        plotted = app.refresh_panel(engine, {}, plotted)[4]  # the same plot goes out twice, then not again
        assert "value" not in app.refresh_panel(engine, {}, plotted)[2]
    finally:
        list(app.apply_mode(engine, original))
    assert engine.snapshot()["mode"] == original


def test_unavailable_mode_warns_and_leaves_the_engine_alone(engine):
    bad = [m for m, why in engine.available_modes().items() if why]
    if not bad:
        pytest.skip("every mode is available on this host")
    before = engine.snapshot()["mode"]
    with pytest.warns(UserWarning, match="unavailable"):
        status, _ = list(app.apply_mode(engine, bad[0]))[-1]
    assert "unavailable" in status and engine.snapshot()["mode"] == before


def test_listening_test_gives_clips_verdict_exports_and_abx(engine):
    original = engine.snapshot()["mode"]
    modes = [original, _switch_target(engine)]
    out = app.listening_test(engine, "Compare these modes.", 11, modes, *SETTINGS[:4], 1.2, 5, 0.9, 1.05, MAX_LEN)
    clips, verdict, table, files, abx, x_path, _ = out[:4], *out[4:]
    assert [c["visible"] for c in clips] == [True, True, False, False]
    for c in clips[:2]:
        assert sf.read(c["value"])[0].size > 0
    assert re.search(r"code matrices \*\*(identical|differ)\*\*", verdict), verdict
    if modes[0] == modes[1]:  # same mode, same seed, sampling on: must reproduce exactly
        assert "**identical**" in verdict, verdict
    assert list(table["mode"]) == modes and len(files) == 3 and files[-1].endswith(".csv")
    assert engine.snapshot()["mode"] == original  # restored
    state, line, _ = app.abx_guess(abx, abx["x_is"])
    assert state["trials"] == 1 and state["correct"] == 1 and "1 / 1" in line
    wrong = "A" if state["x_is"] == "B" else "B"
    state, line, _ = app.abx_guess(state, wrong)
    assert state["trials"] == 2 and state["correct"] == 1
    again = app.listening_test(engine, "Again.", 11, modes, *SETTINGS, tally=state)
    assert again[7]["trials"] == 2 and again[7]["x_is"] in "AB"  # the session tally survives a new run


def test_load_test_reports_the_seed_table(engine):
    table, per, status = app.load_test(engine, 2, engine.snapshot()["mode"], "one\ntwo words", 0, *SETTINGS)
    assert list(table.columns) == ["mode", "N", "med TTFP ms", "med E2E ms", "mean RTF", "req/s", "audio s/s"]
    assert len(per) == 2 and set(per["status"]) == {"done"} and table["req/s"][0] > 0
    assert status.startswith("2/2")


@pytest.fixture(scope="module")
def base_engine():
    if not (FIXTURES / "base" / "config.json").is_file():
        pytest.skip(f"tiny Base checkpoint fixture not found at {FIXTURES}/base")
    from omni_tts.engine.engine import Engine

    eng = Engine.from_config(EngineConfig(model=str(FIXTURES / "base"), device="cpu", max_num_seqs=1,
                                          max_seq_len=256, mode="eager"))
    yield eng
    eng.shutdown()


def test_voice_clone_from_reference_audio_and_a_saved_voice(base_engine):
    demo = app.build_demo(base_engine)
    task = [c for c in demo.blocks.values() if isinstance(c, gr.Radio) and c.label == "Task"][0]
    assert [v for v, _ in task.choices] == ["Base (voice clone)"]
    ref = (24000, np.load(FIXTURES / "base" / "golden_ref_audio.npy"))
    clone = ("Base (voice clone)", None, "auto", "", 0.9, 50, 1.0, 1.05, MAX_LEN)
    outs = list(app.synthesize(base_engine, {}, "Clone this voice.", 1, *clone, ref, "Hello reference.", False))
    assert sf.read(outs[-1][1])[0].size > 0
    with pytest.raises(gr.Error, match="too short"):
        list(app.synthesize(base_engine, {}, "Clone.", 1, *clone, (24000, ref[1][:1000]), "x", False))
    voice = app.voice_save(base_engine, ref, "", True)  # x-vector only: no transcript needed
    outs = list(app.synthesize(base_engine, {}, "From the saved voice.", 1, *clone, None, "", False, voice))
    assert sf.read(outs[-1][1])[0].size > 0


def test_compare_codes_names_the_first_differing_frame():
    a = np.zeros((10, 16), np.int64)
    b = a.copy()
    assert ui.compare_codes(a, b) == (True, None)
    b[6, 3] = 1
    assert ui.compare_codes(a, b) == (False, 6)
    assert ui.compare_codes(a, a[:8]) == (False, 8)
    assert "**differ** (first differing frame 6; 10 vs 10 frames)" in ui.verdict_text("eager", "default", a, b)
    assert "**identical** (10 frames)" in ui.verdict_text("eager", "default", a, a.copy())


def test_bind_address_local_and_space():
    assert ui.bind_address(None, None, {}) == ("127.0.0.1", 7860)
    assert ui.bind_address(None, None, {"SPACE_ID": "u/x", "PORT": "7861"}) == ("0.0.0.0", 7861)
    assert ui.bind_address(None, None, {"GRADIO_SERVER_PORT": "9000"}) == ("0.0.0.0", 9000)
    assert ui.bind_address("127.0.0.1", 1234, {"SPACE_ID": "u/x"}) == ("127.0.0.1", 1234)


def test_select_model_prefers_a_cached_snapshot(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from omni_tts.models.checkpoint import select_model

    for repo in ("Qwen3-TTS-12Hz-1.7B-Base", "Qwen3-TTS-12Hz-0.6B-CustomVoice"):
        snap = tmp_path / f"models--Qwen--{repo}" / "snapshots" / "abc"
        (snap / "speech_tokenizer").mkdir(parents=True)
        (snap / "config.json").write_text("{}")
        (snap / "speech_tokenizer" / "config.json").write_text("{}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("OMNI_TTS_MODEL", raising=False)
    path, reason = select_model(None)
    assert "0.6B-CustomVoice" in path and "cache" in reason
    monkeypatch.setenv("OMNI_TTS_MODEL", "/some/dir")
    assert select_model(None)[0] == "/some/dir"
    assert select_model("x/y")[0] == "x/y"


def test_select_model_offline_falls_back_fast(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from omni_tts.models.checkpoint import select_model

    silent = socket.socket()  # accepts connections, never answers: the worst case for a probe
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.delenv("OMNI_TTS_MODEL", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    t0 = time.perf_counter()
    try:
        path, reason = select_model(None, hub_timeout_s=1.0)
    finally:
        silent.close()
    assert time.perf_counter() - t0 < 3.0
    assert (Path(path) / "config.json").is_file() and "embedded" in reason
