"""Long texts: the split at sentence, clause and space boundaries (English and Chinese punctuation), and
the engine serving them as one request on the tiny checkpoint: segments delivered in order with a fixed
pause between them, equal to the segments synthesized one by one, and a cancel that frees every slot."""

from __future__ import annotations

import re

import numpy as np
import pytest
from _fixtures import fixture_dir
from _serving import grown

from omni_tts.config import EngineConfig, SynthesisParams
from omni_tts.engine.long_text import PAUSE_S, LongTextHandle
from omni_tts.engine.request import RequestHandle
from omni_tts.errors import Cancelled, InputError
from omni_tts.models.segments import SEGMENT_BUDGET, split_text, weight

EN = ["The river ran past the old mill before dawn.", "Nobody in the village had heard the bell that night!",
      "Was it the wind, or something else entirely?"]
ZH = ["河水在黎明前流过了旧磨坊。", "那天晚上村里没有人听到钟声！", "是风，还是别的什么？"]


def mixed_text(chars: int) -> str:
    out, i = "", 0
    while len(out) < chars:
        out += EN[i % 3] + " " if i % 2 == 0 else ZH[i % 3]
        i += 1
    return out.strip()


def test_small_cases_split_where_a_reader_would_pause():
    assert split_text("One two. Three four five six seven eight nine. 你好。再见！Last, one here", 20) == [
        "One two.", "Three four five six", "seven eight nine.", "你好。再见！", "Last, one here"]
    assert split_text("alpha beta, gamma delta epsilon; zeta eta theta iota kappa lambda", 20) == [
        "alpha beta,", "gamma delta epsilon;", "zeta eta theta iota", "kappa lambda"]
    assert split_text("我们走吧，天快黑了；路还很远、很难走。好的！", 14) == [
        "我们走吧，", "天快黑了；", "路还很远、", "很难走。", "好的！"]
    assert split_text("天地玄黄宇宙洪荒日月盈昃辰宿列张", 12) == ["天地玄黄", "宇宙洪荒", "日月盈昃", "辰宿列张"]
    assert split_text("Short enough.") == ["Short enough."]


def test_a_3000_character_mixed_text_splits_at_sentence_ends_in_order():
    text = mixed_text(3000)
    segs = split_text(text)
    assert len(text) >= 3000 and len(segs) > 5
    assert all(weight(s) <= SEGMENT_BUDGET for s in segs)
    assert re.sub(r"\s", "", "".join(segs)) == re.sub(r"\s", "", text)  # in order, nothing lost or doubled
    sentences = re.findall(r".+?(?:[.!?](?:\s+|$)|[。！？]\s*)", text)  # with the spaces after them
    assert all(s.endswith((".", "!", "?", "。", "！", "？")) for s in segs)  # every cut is a sentence end
    expected, cur = [], ""
    for s in sentences:  # whole sentences packed greedily up to the budget
        if cur and weight((cur + s).strip()) > SEGMENT_BUDGET:
            expected.append(cur.strip())
            cur = ""
        cur += s
    assert segs == expected + [cur.strip()]


@pytest.fixture(scope="module")
def engine():
    from omni_tts.engine.engine import Engine

    eng = Engine.from_config(EngineConfig(model=str(fixture_dir("custom_voice")), device="cpu", max_num_seqs=4,
                                          mode="eager", initial_chunk_frames=1, chunk_frames=2))
    yield eng
    eng.shutdown()


def params(text: str, **kw) -> SynthesisParams:
    return SynthesisParams(text=text, speaker="ryan", language="auto", max_new_tokens=4, seed=11, **kw)


def test_a_long_text_is_its_segments_joined_with_a_pause(engine):
    text = mixed_text(3000)
    handle = engine.submit(params(text))
    assert isinstance(handle, LongTextHandle)
    streamed = [c for c in handle.stream(timeout=120)]
    result = handle.result(timeout=120)
    segs = split_text(text)
    assert handle.segments == segs
    alone = [engine.submit(params(s)).result(timeout=120) for s in segs]
    assert all(isinstance(engine.submit(params(s)), RequestHandle) for s in segs[:1])
    pause = np.zeros(round(PAUSE_S * engine.sample_rate), np.float32)
    expected = np.concatenate([x for i, r in enumerate(alone) for x in ([pause] if i else []) + [r.wav]])
    assert result.wav.shape == expected.shape
    np.testing.assert_allclose(result.wav, expected, atol=1e-5)  # no gap, no overlap, in order
    np.testing.assert_array_equal(result.codes, np.concatenate([r.codes for r in alone]))
    assert np.array_equal(np.concatenate([c.samples for c in streamed]), result.wav)
    assert [c.index for c in streamed] == list(range(len(streamed)))
    m = result.metrics
    assert m.status == "done" and m.frames == sum(len(r.codes) for r in alone) and m.audio_samples == len(expected)
    assert m.ttfp_ms is not None and m.e2e_ms >= m.ttfp_ms


def test_a_refused_long_text_is_refused_at_submit(engine):
    with pytest.raises(InputError, match="unknown speaker"):
        engine.submit(SynthesisParams(text=mixed_text(1000), speaker="nobody"))
    with pytest.raises(InputError, match="text is too long"):
        engine.submit(SynthesisParams(text="x" * 5001, speaker="ryan"))


def test_cancelling_a_long_text_cancels_every_segment(engine):
    handle = engine.submit(params(mixed_text(3000)))
    first = next(iter(handle.stream(timeout=60)))
    assert first.samples.size > 0
    handle.cancel()
    with pytest.raises(Cancelled):
        handle.result(timeout=60)
    assert handle.metrics.status == "cancelled"
    for h in handle._handles:  # every segment it submitted ended, none is left holding a slot
        assert h._finished.wait(60)
    assert len(handle._handles) < len(handle.segments)  # the rest were never submitted


def test_a_long_text_is_counted_once_as_its_clients_request(engine):
    """The counters, the recent requests and the latency histograms hold the client's request, not its
    segments: a finished long text is one 'done' with the whole clip's latencies, a cancelled one one
    'cancelled', however many segments ran."""
    from omni_tts.serving.metrics import EngineMetrics

    prom = EngineMetrics(engine)
    before = dict(engine.stats.outcomes)
    handle = engine.submit(params(mixed_text(1200)))
    result = handle.result(timeout=120)
    assert len(handle.segments) > 2
    assert grown(before, engine.stats.outcomes) == {("eager", "done"): 1}
    assert engine.stats.recent_requests(1)[0] is result.metrics
    assert prom.registry.get_sample_value("omni_tts_ttfp_seconds_count", {"mode": "eager"}) == 1
    assert prom.registry.get_sample_value("omni_tts_e2e_seconds_sum", {"mode": "eager"}) == \
        pytest.approx(result.metrics.e2e_ms / 1000)

    before = dict(engine.stats.outcomes)
    handle = engine.submit(params(mixed_text(3000)))
    next(iter(handle.stream(timeout=60)))
    handle.cancel("client gone")
    with pytest.raises(Cancelled):
        handle.result(timeout=60)
    assert all(h._finished.wait(60) for h in handle._handles) and len(handle._handles) > 1
    assert grown(before, engine.stats.outcomes) == {("eager", "cancelled (client gone)"): 1}


def test_the_speech_route_streams_a_long_text_as_one_clip(engine):
    import httpx
    from _serving import serve_app

    from omni_tts.serving.app import build_app

    text = mixed_text(1200)
    whole = engine.submit(params(text)).result(timeout=120).wav
    with serve_app(build_app(engine)) as url:
        body = {"input": text, "voice": "ryan", "response_format": "pcm", "max_new_tokens": 4, "seed": 11}
        with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=120) as r:
            assert r.status_code == 200
            pcm = np.frombuffer(b"".join(r.iter_bytes()), "<i2")
    expected = (np.clip(whole, -1, 1) * 32767).astype(np.int16)
    assert pcm.shape == expected.shape and np.abs(pcm.astype(int) - expected).max() <= 1


def test_the_servers_deadline_holds_for_the_whole_long_text_and_its_codes_match_its_audio():
    """request_timeout_s counts from the request's acceptance for every segment (each segment here takes a
    fraction of it, the whole text several times it): the long text ends past the deadline with that error,
    and the frames it reports are those of the audio it delivered."""
    from omni_tts.engine.engine import Engine
    from omni_tts.errors import DeadlineExceeded

    eng = Engine.from_config(EngineConfig(model=str(fixture_dir("custom_voice")), device="cpu", max_num_seqs=4,
                                          mode="eager", initial_chunk_frames=1, chunk_frames=2,
                                          request_timeout_s=2.0))
    try:
        handle = eng.submit(SynthesisParams(text=mixed_text(4900), speaker="ryan", fixed_frames=20, seed=11))
        with pytest.raises(DeadlineExceeded):
            handle.result(timeout=120)
        m, got = handle.metrics, handle.partial()
        assert m.outcome == "error (deadline exceeded)" and len(handle.segments) > 20
        assert all(h.metrics.accepted_at == m.accepted_at for h in handle._handles)
        pauses, pause = got.wav.size - m.frames * 1920, round(PAUSE_S * eng.sample_rate)
        assert len(got.codes) == m.frames and pauses >= 0 and pauses % pause == 0
    finally:
        eng.shutdown()
