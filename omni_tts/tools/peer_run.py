"""One system of `bench peers`, in a process of its own: start it, time its start-up, run the closed
loops, print one JSON line.

    python -m omni_tts.tools.peer_run SYSTEM --model DIR --device cuda [--frames 75] [--concurrency 1 8 32]
        [--num-prompts 32] [--speaker ryan] [--ref-audio WAV]
        (started by `omni-tts peers`, with its flags: `run_argv`)

Owns each system's adapter behind one call, `one(i) -> RequestMetrics`, timed alike in this process:
TTFP = request start -> first non-empty audio chunk in hand, E2E = start -> last chunk, audio = the
samples received. Systems: `omni-tts` (the Engine's public API, streaming), `vllm-omni` (its AsyncOmni,
stage 1 streaming DELTA chunks: what its speech server does), `faster-qwen3-tts` (its streaming
generator), `faster-qwen3-tts-batch` (its continuous-batching scheduler: voice clones only, whole clips),
`qwen-tts` (the official package, whole clip). faster-qwen3-tts and qwen-tts have no concurrent API and run
concurrency 1 only. With `--ref-audio` (a Base checkpoint) every system that can clones that clip's voice
from its x-vector alone instead of speaking as `--speaker`. Prints READY on stdout once the system can take
requests (the parent reads GPU memory then). Imports nothing of a peer at module level: each runs with its
own import path.
"""

from __future__ import annotations

import time

START = time.perf_counter()  # before any heavy import: start-up counts from the process start

import argparse  # noqa: E402
import asyncio  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Iterable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from omni_tts import RequestMetrics  # noqa: E402
from omni_tts.engine.testing import summarize  # noqa: E402
from omni_tts.tools.args import Parser, add_engine_flags, engine_config  # noqa: E402
from omni_tts.tools.load import PROMPTS, closed_loop  # noqa: E402

SINGLE_STREAM = {"faster-qwen3-tts", "qwen-tts"}  # no concurrent API: concurrency 1 only
CLONES = {"omni-tts", "faster-qwen3-tts", "faster-qwen3-tts-batch"}  # adapters that clone --ref-audio


class Tally:
    """One request's timings as its chunks arrive; an exact repeat of the previous chunk is counted in
    `dups` and not as audio."""

    def __init__(self, i: int, sample_rate: int = 24000) -> None:
        self.m = RequestMetrics(i, "", time.perf_counter(), sample_rate=sample_rate)
        self.samples, self.dups, self.prev = 0, 0, None

    def add(self, chunk: Any) -> None:
        a = np.asarray(chunk, dtype=np.float32).reshape(-1)
        if a.size == 0:
            return
        if self.prev is not None and a.size == self.prev.size and np.array_equal(a, self.prev):
            self.dups += 1
            return
        if self.m.first_audio_at is None:
            self.m.first_audio_at = time.perf_counter()
        self.samples, self.prev = self.samples + a.size, a

    def done(self) -> RequestMetrics:
        self.m.finished_at, self.m.status, self.m.audio_samples = time.perf_counter(), "done", self.samples
        self.m.dups = self.dups  # type: ignore[attr-defined]
        return self.m


def timed(i: int, chunks: Iterable[Any], sample_rate: int = 24000) -> RequestMetrics:
    """Drain `chunks` (array-likes of audio samples) into one request's timings."""
    t = Tally(i, sample_rate)
    for c in chunks:
        t.add(c)
    return t.done()


class Ours:
    """omni-tts through Engine.submit/stream: the preset (bench unless --preset), default+cudagraph on CUDA
    (eager on CPU)."""

    def __init__(self, a: argparse.Namespace) -> None:
        from omni_tts import Engine
        from omni_tts.config import CompileMode

        mode = CompileMode.auto(a.device.startswith("cuda")).value
        self.a = a
        self.engine = Engine.from_config(engine_config(a, mode=mode, modes=[mode], max_num_seqs=max(a.concurrency)))
        self.who: dict[str, Any] = dict(speaker=a.speaker)  # whose voice every request speaks in
        if a.ref_audio:
            self.who = dict(task="voice_clone", voice=self.engine.voice_prompt(a.ref_audio, x_vector_only=True))

    def one(self, i: int) -> RequestMetrics:
        from omni_tts.config import SynthesisParams

        p = SynthesisParams(text=PROMPTS[i % len(PROMPTS)], language="English", fixed_frames=self.a.frames,
                            seed=1234 + i, **self.who)
        t = Tally(i, self.engine.sample_rate)
        for c in self.engine.submit(p).stream():
            t.add(c.samples)
        return t.done()

    def close(self) -> None:
        self.engine.shutdown()


class Faster:
    """faster-qwen3-tts: its CUDA-graph generator, streaming in chunks of `chunk` frames."""

    def __init__(self, a: argparse.Namespace, chunk: int = 8) -> None:
        from faster_qwen3_tts import FasterQwen3TTS  # type: ignore[import-not-found]

        self.a, self.chunk = a, chunk
        self.m = FasterQwen3TTS.from_pretrained(a.model, device=a.device, dtype=_auto_dtype(a.device))

    def one(self, i: int) -> RequestMetrics:
        kw = dict(text=PROMPTS[i % len(PROMPTS)], language="English", max_new_tokens=self.a.frames + 1,
                  min_new_tokens=self.a.frames + 1, chunk_size=self.chunk)
        if self.a.ref_audio:
            gen = self.m.generate_voice_clone_streaming(ref_audio=self.a.ref_audio, xvec_only=True, **kw)
        else:
            gen = self.m.generate_custom_voice_streaming(speaker=self.a.speaker, **kw)
        return timed(i, (w for w, _sr, _ in gen))


class FasterBatch:
    """faster-qwen3-tts-batch: its BatchScheduler (continuous batching: a finished row's slot takes the next
    request) over BatchedFasterQwen3TTS, graphs captured for the largest concurrency; x-vector voice clones of
    `--ref-audio`, each request's whole clip at once."""

    def __init__(self, a: argparse.Namespace) -> None:
        from faster_qwen3_tts_batch import BatchedFasterQwen3TTS, BatchScheduler  # type: ignore[import-not-found]

        if not a.ref_audio:
            raise ValueError("faster-qwen3-tts-batch batches voice clones only: give --ref-audio (a Base checkpoint)")
        self.a, n = a, max(a.concurrency)
        model = BatchedFasterQwen3TTS.from_pretrained(a.model, max_batch_size=n, device=a.device,
                                                      dtype=_auto_dtype(a.device))
        model.warmup()
        gen = dict(max_new_tokens=a.frames + 1, min_new_tokens=a.frames + 1, xvec_only=True)
        self.sched = BatchScheduler(model, max_batch_size=n, gen_kwargs=gen, continuous=True)

    async def start(self) -> FasterBatch:
        await self.sched.start()
        return self

    async def one(self, i: int) -> RequestMetrics:
        t = Tally(i)
        audio, sr = await self.sched.infer(text=PROMPTS[i % len(PROMPTS)], language="English",
                                           ref_audio=self.a.ref_audio, seed=1234 + i)
        t.m.sample_rate = int(sr)
        t.add(audio)
        return t.done()

    def close(self) -> None:
        asyncio.get_event_loop().run_until_complete(self.sched.stop())  # its GPU thread, joined before exit


class Official:
    """The official qwen-tts package: transformers generate, the whole clip at once."""

    def __init__(self, a: argparse.Namespace) -> None:
        from qwen_tts import Qwen3TTSModel  # type: ignore[import-not-found]

        self.a = a
        self.m = Qwen3TTSModel.from_pretrained(a.model, device_map=a.device, dtype=_auto_dtype(a.device),
                                               attn_implementation="sdpa")

    def one(self, i: int) -> RequestMetrics:
        def gen() -> Iterable[Any]:
            wavs, _sr = self.m.generate_custom_voice(text=PROMPTS[i % len(PROMPTS)], speaker=self.a.speaker,
                                                     language="English", max_new_tokens=self.a.frames + 1)
            yield wavs[0]
        return timed(i, gen())


class VllmOmni:
    """vLLM-Omni's Qwen3-TTS pipeline (talker + code predictor stage, AudioStage stage) through AsyncOmni,
    its stock deploy config, prompts built the way its speech server builds them."""

    def __init__(self, a: argparse.Namespace) -> None:
        from transformers import AutoTokenizer
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm_omni.entrypoints.async_omni import AsyncOmni
        from vllm_omni.model_executor.models.qwen3_tts.prompt_embeds_builder import Qwen3TTSPromptEmbedsBuilder

        self.a, self.builder = a, Qwen3TTSPromptEmbedsBuilder
        self.omni = AsyncOmni(model=a.model, stage_init_timeout=900)
        self.params = copy.deepcopy(list(self.omni.default_sampling_params_list))
        for sp in self.params:  # stream every stage, as its server does for a streaming request
            if isinstance(sp, SamplingParams):
                sp.output_kind = RequestOutputKind.DELTA
        # it returns one frame fewer than the talker tokens it generates: ask one more for `frames` frames
        self.params[0].max_tokens = self.params[0].min_tokens = a.frames + a.vo_extra_tokens
        self.tok = AutoTokenizer.from_pretrained(a.model, trust_remote_code=True, padding_side="left")
        self.talker_cfg = json.loads((Path(a.model) / "config.json").read_text()).get("talker_config", {})

    def prompt(self, i: int) -> dict[str, Any]:
        info = {"task_type": ["CustomVoice"], "text": [PROMPTS[i % len(PROMPTS)]], "language": ["English"],
                "speaker": [self.a.speaker], "instruct": [""],
                "max_new_tokens": [self.a.frames + self.a.vo_extra_tokens]}
        n = self.builder.estimate_prompt_len_from_additional_information(
            info, task_type="CustomVoice", tokenize_prompt=lambda t: self.tok(t, padding=False)["input_ids"],
            codec_language_id=self.talker_cfg.get("codec_language_id"),
            spk_is_dialect=self.talker_cfg.get("spk_is_dialect"))
        return {"prompt_token_ids": [0] * n, "additional_information": info}

    async def one(self, i: int) -> RequestMetrics:
        t, seen = Tally(i), 0
        async for res in self.omni.generate(self.prompt(i), request_id=f"peer-{i}", sampling_params_list=self.params):
            audio, sr, seen = _new_audio(res, seen)
            t.m.sample_rate = sr or t.m.sample_rate
            for c in audio:
                t.add(c.float().cpu().numpy() if hasattr(c, "float") else c)
        return t.done()

    def close(self) -> None:
        self.omni.shutdown()


def _auto_dtype(device: str) -> Any:
    """The dtype our engine picks on `device` (bf16 on CUDA, fp32 elsewhere), so every system runs alike."""
    import torch

    from omni_tts.models.loading import resolve_dtype

    return resolve_dtype("auto", torch.device(device))


def _new_audio(res: Any, seen: int) -> tuple[list[Any], int | None, int]:
    """The audio chunks in one vLLM-Omni output that were not in an earlier one, the sample rate, and how
    many list entries are now seen: a list grows cumulatively, a tensor is one step's chunk."""
    mm = getattr(res, "multimodal_output", None)
    ro = getattr(res, "request_output", None)
    if not mm and ro is not None:
        mm = getattr(ro, "multimodal_output", None)
    if not mm:
        for out in getattr(res if hasattr(res, "outputs") else ro, "outputs", None) or []:
            mm = getattr(out, "multimodal_output", None)
            if mm:
                break
    key = next((k for k in ("audio", "model_outputs") if mm and k in mm), None)
    if key is None:
        return [], None, seen
    sr = mm.get("sr")
    sr = sr[-1] if isinstance(sr, list) and sr else sr
    sr = int(sr.item() if hasattr(sr, "item") else sr) if sr is not None else None
    val = mm[key]
    if isinstance(val, list):
        return val[seen:], sr, len(val)
    return ([] if val is None else [val]), sr, seen + 1


def run_async(loop: asyncio.AbstractEventLoop, one: Callable[[int], Any], c: int, n: int
              ) -> tuple[list[RequestMetrics], float]:
    """The same closed loop as tools/load.py with `c` asyncio clients."""
    async def main() -> tuple[list[RequestMetrics], float]:
        nxt, records = iter(range(n)), []

        async def client() -> None:
            for i in nxt:
                records.append(await one(i))
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(c)))
        return records, time.perf_counter() - t0
    return loop.run_until_complete(main())


def measure(system: str, a: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> None:
    """Start `system`, then per concurrency: a warm-up round (excluded), then the measured closed loop."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    if a.ref_audio and system not in CLONES:
        raise ValueError(f"{system}: voice cloning (--ref-audio) is not wired into its adapter")
    make = {"omni-tts": Ours, "faster-qwen3-tts": Faster, "qwen-tts": Official}.get(system)
    sut = loop.run_until_complete(_async_start(system, a)) if system in ASYNC else make(a)  # type: ignore[misc]
    startup = time.perf_counter() - START
    print("READY", flush=True)
    run = (lambda c, n: run_async(loop, sut.one, c, n)) if system in ASYNC else \
        (lambda c, n: closed_loop(c, n, sut.one))
    conc = [1] if system in SINGLE_STREAM else a.concurrency
    n = min(a.num_prompts, a.single_stream_prompts) if system in SINGLE_STREAM else a.num_prompts
    t0 = time.perf_counter()
    run(1, 1)  # first request: graph captures, autotuning
    first_s = time.perf_counter() - t0
    rows: dict[str, Any] = {}
    for c in conc:
        run(c, c)  # warm-up at this batch size
        records, wall = run(c, max(n, c))
        row = summarize(records, wall)
        row["frames_med"] = float(np.median([r.audio_s for r in records])) * a.frame_rate if records else 0.0
        row["dup_chunks"] = sum(getattr(r, "dups", 0) for r in records)
        rows[str(c)] = row
        emit({"system": system, "partial": True, "startup_s": startup, "first_request_s": first_s, "rows": rows})
    emit({"system": system, "startup_s": startup, "first_request_s": first_s, "rows": rows,
          "note": "single stream (no concurrent API)" if system in SINGLE_STREAM else ""})
    if hasattr(sut, "close"):
        sut.close()


ASYNC = {"vllm-omni", "faster-qwen3-tts-batch"}  # asyncio clients; built inside the running loop


async def _async_start(system: str, a: argparse.Namespace) -> Any:
    if system == "vllm-omni":
        return VllmOmni(a)  # AsyncOmni binds its queues to the running loop
    return await FasterBatch(a).start()  # its scheduler delivers results to the running loop


FORWARDED = ("model", "device", "dtype", "preset", "frames", "num_prompts", "single_stream_prompts", "speaker",
             "ref_audio", "vo_extra_tokens")


def add_run_flags(ap: argparse.ArgumentParser) -> None:
    """The flags of one system's run, shared by `omni-tts peers` and this process (which `run_argv` starts)."""
    add_engine_flags(ap, preset="bench")
    ap.add_argument("--frames", type=int, default=75)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--single-stream-prompts", type=int, default=4,
                    help="requests for the systems without a concurrent API (concurrency 1 only)")
    ap.add_argument("--speaker", default="ryan")
    ap.add_argument("--ref-audio", help="a reference clip (a Base checkpoint): systems clone its voice (x-vector "
                                        "only) instead of speaking as --speaker; faster-qwen3-tts-batch needs it")
    ap.add_argument("--vo-extra-tokens", type=int, default=1,
                    help="vLLM-Omni: talker tokens asked beyond --frames (it returns one frame fewer)")


def run_argv(system: str, a: argparse.Namespace) -> list[str]:
    """The command line of `system`'s process: this module with the run flags of `a` (device resolved)."""
    argv = [sys.executable, "-m", "omni_tts.tools.peer_run", system, "--concurrency", *map(str, a.concurrency)]
    for key in FORWARDED:
        if getattr(a, key) is not None:
            argv += [f"--{key.replace('_', '-')}", str(getattr(a, key))]
    return argv + [x for pair in a.set for x in ("--set", pair)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="python -m omni_tts.tools.peer_run", description=__doc__.splitlines()[0])
    ap.add_argument("system", choices=["omni-tts", "vllm-omni", "faster-qwen3-tts", "faster-qwen3-tts-batch",
                                       "qwen-tts"])
    add_run_flags(ap)
    ap.add_argument("--frame-rate", type=float, default=12.5, help="codec frames per audio second")
    a = ap.parse_args(argv)
    emit = lambda d: print("RESULT " + json.dumps(d), flush=True)  # noqa: E731
    try:
        measure(a.system, a, emit)
    except ImportError as e:
        emit({"system": a.system, "error": f"not installed ({e.name or e})"})
    except Exception as e:  # a failing system is a result
        emit({"system": a.system, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
