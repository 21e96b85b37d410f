"""The page's helpers that need no engine: the admin policy and bind address, the private temp folder
and data folder, messages and labels in the UI's words, notices, the scatter plot, the code comparison,
the readiness text and model selection (local HF cache scan, fast offline fallback).
"""

from __future__ import annotations

import os
import re
import socket
import stat
import threading
from pathlib import Path

import numpy as np

from omni_tts.ui import files, formatting, labels, plots
from omni_tts.ui import support as ui


def test_admin_policy_from_the_bind_address_and_env():
    assert not ui.AdminPolicy.from_env("127.0.0.1", False, {}).public
    assert ui.AdminPolicy.from_env("0.0.0.0", False, {}).public
    assert ui.AdminPolicy.from_env("127.0.0.1", True, {}).public
    assert ui.AdminPolicy.from_env("127.0.0.1", False, {"SPACE_ID": "u/x"}).public
    assert ui.AdminPolicy.from_env("0.0.0.0", False, {ui.ADMIN_ENV: "t"}).asks_token


def test_out_dir_is_private_bounded_and_removed(tmp_path):
    out = files.OutDir(max_files=3, max_bytes=10_000, parent=str(tmp_path))
    assert stat.S_IMODE(out.path.stat().st_mode) == 0o700 and out.path.name.startswith("omni-tts-")
    paths = []
    for i in range(5):
        p = out.new("clip", ".wav")
        p.write_bytes(b"x" * 100)
        os.utime(p, (i, i))
        paths.append(p)
    assert sum(p.exists() for p in paths) == 3 and not paths[0].exists()  # the oldest went first
    big = out.new("big", ".wav")
    big.write_bytes(b"x" * 9_950)
    out.prune()
    assert big.exists() and sum(p.exists() for p in paths) <= 1  # within the byte budget
    assert len({out.new("a", ".wav").name for _ in range(20)}) == 20  # names are not guessable or reused
    out.remove()
    assert not out.path.exists()


def test_data_dir_follows_the_platform_and_env():
    assert files.data_dir({"OMNI_TTS_DATA_DIR": "/d"}) == Path("/d")
    if os.name == "posix" and os.uname().sysname == "Linux":
        assert files.data_dir({"HOME": "/h"}) == Path("/h/.local/share/omni_tts")
        assert files.data_dir({"HOME": "/h", "XDG_DATA_HOME": "/x"}) == Path("/x/omni_tts")


def test_messages_in_the_uis_words():
    assert labels.in_ui_words("max_new_tokens must be >= 2 (got 1)") == "Max length must be >= 2 (got 1)"
    assert labels.in_ui_words("reference audio /tmp/gradio/ab/c.txt: not readable") == \
        "reference audio 'c.txt': not readable"
    assert labels.in_ui_words("text is empty", labels.OPENAI_FIELDS) == "input is empty"
    assert labels.speaker_label("uncle_fu").startswith("Uncle Fu — ") and labels.speaker_label("x_y") == "X Y"
    assert labels.language_label("beijing_dialect") == "Beijing Dialect"


def test_error_paths_examples_and_model_in_plain_words():
    assert labels.in_ui_words("Error opening '/tmp/gradio/ab/fake': Format not recognised.") == \
        "Error opening 'fake': Format not recognised."
    clone = labels.in_ui_words("voice clone: ref_text (the transcript) is required for ICL cloning; pass it")
    assert clone == "voice clone: Reference text (the transcript) is required for cloning with a transcript; pass it"
    rows = labels.examples(["custom_voice"], ["english", "german", "chinese"], ["vivian", "ryan", "sohee"])
    assert {r[1]: r[3] for r in rows} == {"english": "ryan", "german": "ryan", "chinese": "vivian"}
    assert labels.model_description("ck (custom_voice, 1b7)") == "ck (custom_voice, 1.7B)"


def test_capped_notice():
    assert formatting.capped_notice(10, 20, 21) == ""
    assert "Max length" in formatting.capped_notice(20, 20, 21)
    assert "length limit" in formatting.capped_notice(50, 50, 8192)


def test_plot_colours_every_point_by_mode_from_the_first_one():
    history = [{"request": 7, "ttfp_ms": 10.0, "mode": "eager"}, {"request": 8, "ttfp_ms": 30.0, "mode": "default"}]
    svg = plots.scatter_svg(history[:1], "ttfp_ms", "TTFP")
    assert svg.count('class="point"') == 1 and 'data-mode="eager" cx=' in svg
    assert f'fill="{formatting.MODE_COLORS["eager"]}" stroke="white"' in svg  # coloured on its own
    assert all(m in svg for m in formatting.MODES)  # the legend names every mode from the start
    ticks = re.findall(r'class="xtick">([^<]+)<', plots.scatter_svg(history, "ttfp_ms", "TTFP"))
    assert ticks and all(t.isdigit() for t in ticks) and "7" in ticks and "8" in ticks  # whole request numbers
    both = plots.scatter_svg(history, "ttfp_ms", "TTFP")
    assert 'data-mode="default" cx=' in both and f'fill="{formatting.MODE_COLORS["default"]}" stroke' in both


def test_compare_codes_names_the_first_differing_frame():
    a = np.zeros((10, 16), np.int64)
    b = a.copy()
    assert ui.compare_codes(a, b) == (True, None)
    b[6, 3] = 1
    assert ui.compare_codes(a, b) == (False, 6)
    assert ui.compare_codes(a, a[:8]) == (False, 8)
    assert "**differ** (first differing frame 6; 10 vs 10 frames)" in ui.verdict_text("eager", "default", a, b)


def test_bind_address_local_and_space():
    assert ui.bind_address(None, None, {}) == ("127.0.0.1", 7860)
    assert ui.bind_address(None, None, {"SPACE_ID": "u/x", "PORT": "7861"}) == ("0.0.0.0", 7861)
    assert ui.bind_address(None, None, {"GRADIO_SERVER_PORT": "9000"}) == ("0.0.0.0", 9000)
    assert ui.bind_address("127.0.0.1", 1234, {"SPACE_ID": "u/x"}) == ("127.0.0.1", 1234)


def test_select_model_prefers_a_cached_snapshot(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from omni_tts.models.selection import select_model

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


def test_select_model_offline_falls_back_to_the_embedded_demo(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from omni_tts.models.selection import select_model

    silent = socket.socket()  # accepts connections, never answers: the worst case for a probe
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.delenv("OMNI_TTS_MODEL", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    found: list[tuple[str, str]] = []
    probe = threading.Thread(target=lambda: found.append(select_model(None, hub_timeout_s=0.5)), daemon=True)
    probe.start()
    probe.join(timeout=60)  # a hang guard only: the probe's own timeout, not this bound, ends it
    silent.close()
    assert found, "select_model hung on a Hub that never answers"
    path, reason = found[0]
    assert (Path(path) / "config.json").is_file() and "embedded" in reason


def test_readiness_says_warm_up_gives_way_only_while_a_mode_warms():
    warming = formatting.readiness_markdown({"eager": "ready, default", "default": "warming 3/12"})
    assert "`default`: **warming 3/12**" in warming and "wait for a pause" in warming
    done = formatting.readiness_markdown({"eager": "ready, default", "default": "ready"})
    assert "wait for a pause" not in done
