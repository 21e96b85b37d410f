"""`omni-tts synth`: one text to a WAV file through the plain single-request path (reference loop).

Owns the synth flags, the voice-clone flags (reference audio -> voice prompt, saving/loading voice
prompts) and checking every input and every output path before any work (invalid UTF-8, a directory or
a non-.wav name for --out, an existing file without --force). Knows nothing about model internals: it
loads an omni_tts.models.qwen3_tts.TTSModel and runs omni_tts.engine.offline.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from omni_tts.errors import OmniTTSError
from omni_tts.tools.args import add_device_flags, add_model_flag, bool_arg
from omni_tts.tools.checkpoints import open_checkpoint

TEXT_FLAGS = ("text", "instruct", "speaker", "language", "ref_text")  # synth flags whose value is spoken or looked up


def add_arguments(s: argparse.ArgumentParser) -> None:
    add_model_flag(s)
    add_device_flags(s)
    s.add_argument("--task", choices=["custom_voice", "voice_design", "voice_clone"],
                   help="default: what the checkpoint does")
    s.add_argument("--text", required=True)
    s.add_argument("--speaker", help="built-in speaker (custom_voice; default: the checkpoint's first)")
    s.add_argument("--language", default="Auto")
    s.add_argument("--instruct", help="style instruction (custom_voice) or voice description (voice_design)")
    s.add_argument("--non-streaming-mode", type=bool_arg, default=None, metavar="{true,false}",
                   help="feed the whole text up front (official default: true, but false for voice_clone)")
    v = s.add_argument_group("voice clone (Base checkpoints)")
    v.add_argument("--ref-audio", metavar="FILE", help="reference clip to clone (1-30 s; any rate >= 8 kHz)")
    v.add_argument("--ref-text", help="transcript of the reference clip (needed unless --x-vector-only)")
    v.add_argument("--x-vector-only", action="store_true", help="clone from the speaker embedding alone")
    v.add_argument("--voice", metavar="FILE.safetensors", help="a voice prompt saved with --save-voice")
    v.add_argument("--save-voice", metavar="FILE.safetensors", help="also save the voice prompt for reuse")
    s.add_argument("--greedy", action="store_true", help="argmax everywhere instead of sampling")
    s.add_argument("--max-new-tokens", type=int, help="at most this many tokens (frames + 1; at most 8192)")
    s.add_argument("--seed", type=int)
    s.add_argument("--out", required=True, help="output WAV path (.wav)")
    s.add_argument("--codes-out", help="also save the [frames, 16] code matrix as .npy")
    s.add_argument("--force", action="store_true", help="overwrite --out, --codes-out and --save-voice files")


def _utf8(args: argparse.Namespace) -> None:
    """Text flags must be valid UTF-8: the OS hands undecodable bytes over as lone surrogates."""
    for name in TEXT_FLAGS:
        value = getattr(args, name, None)
        bad = next((i for i, ch in enumerate(value or "") if "\ud800" <= ch <= "\udfff"), None)
        if bad is not None:
            byte = f"byte 0x{ord(value[bad]) - 0xDC00:02x}" if ord(value[bad]) >= 0xDC80 else "a lone surrogate"
            raise OmniTTSError(f"--{name.replace('_', '-')} is not valid UTF-8 ({byte} at character {bad})")


def _output(flag: str, path: str | None, force: bool, suffix: str) -> None:
    """An output file that can be written without losing anything: checked before any work is done."""
    if path is None:
        return
    if not path.strip():
        raise OmniTTSError(f"{flag} is empty: give a file name ending in {suffix}")
    p = Path(path)
    if p.is_dir():
        raise OmniTTSError(f"{flag} {path}: is a directory; give a file name ending in {suffix}")
    if p.suffix.lower() != suffix:
        raise OmniTTSError(f"{flag} {path}: give a file name ending in {suffix}")
    if not p.parent.is_dir():
        raise OmniTTSError(f"{flag} {path}: the directory {p.parent} does not exist")
    if not os.access(p.parent, os.W_OK):
        raise OmniTTSError(f"{flag} {path}: cannot write in {p.parent}")
    if p.exists() and not force:
        raise OmniTTSError(f"{flag} {path}: the file exists; pass --force to overwrite it")


def _outputs(args: argparse.Namespace) -> None:
    """Each output flag's file (their suffixes differ, so no two can be the same file)."""
    for flag, path, suffix in (("--out", args.out, ".wav"), ("--codes-out", args.codes_out, ".npy"),
                               ("--save-voice", args.save_voice, ".safetensors")):
        _output(flag, path, args.force, suffix)


def _request(args: argparse.Namespace, task: str, voice=None):  # -> SynthesisParams
    from omni_tts.config import SynthesisParams

    return SynthesisParams(text=args.text, task=task, speaker=args.speaker, language=args.language,
                           instruct=args.instruct, non_streaming_mode=args.non_streaming_mode, greedy=args.greedy,
                           max_new_tokens=args.max_new_tokens, seed=args.seed, voice=voice)


def main(args: argparse.Namespace) -> int:
    import numpy as np
    import soundfile as sf

    from omni_tts.engine.testing import offline
    from omni_tts.models.loading import resolve_device, resolve_dtype
    from omni_tts.models.qwen3_tts import TTSModel

    _utf8(args)
    _outputs(args)
    _request(args, args.task or "custom_voice").validate()  # every field bounded before anything loads
    ref_wav = _reference_audio(args)  # before loading the model: bad audio fails fast
    ckpt = open_checkpoint(args.model)
    if ckpt.is_embedded_demo:
        print(f"note: {ckpt.describe()}", file=sys.stderr)
    device = resolve_device(args.device or "auto")
    model = TTSModel.from_checkpoint(ckpt, device=device, dtype=resolve_dtype(args.dtype or "auto", device))
    task = args.task or (model.tasks() or ["custom_voice"])[0]
    voice = _voice(args, model, task, ref_wav)
    wav, codes = offline.synthesize(model, _request(args, task, voice))
    try:
        sf.write(args.out, wav, model.sample_rate, subtype="FLOAT")
        if args.codes_out:
            with open(args.codes_out, "wb") as f:  # np.save(name) would add .npy to a name ending in .NPY
                np.save(f, codes.numpy())
    except (OSError, RuntimeError) as e:
        raise OmniTTSError(f"cannot write output ({str(e).splitlines()[0]})") from None
    if args.save_voice and voice is not None:  # only once the request has been served: no file for a refused one
        _save_voice(args.save_voice, voice)
    print(f"wrote {args.out}: {codes.shape[0]} frames, {len(wav) / model.sample_rate:.2f} s at "
          f"{model.sample_rate} Hz", file=sys.stderr)
    return 0


def _reference_audio(args: argparse.Namespace):  # -> FloatTensor[N] at 24 kHz, or None
    """Check the voice-clone flags' combination and load + validate --ref-audio (one-line errors)."""
    import soundfile as sf

    from omni_tts.models.audio import load_reference_audio

    clone_flags = [f for f, on in (("--ref-audio", args.ref_audio), ("--ref-text", args.ref_text),
                                   ("--x-vector-only", args.x_vector_only), ("--voice", args.voice),
                                   ("--save-voice", args.save_voice)) if on]
    if args.task not in (None, "voice_clone") and clone_flags:
        raise OmniTTSError(f"{clone_flags[0]} is for --task voice_clone (a Base checkpoint)")
    if args.voice and (args.ref_audio or args.ref_text or args.x_vector_only):
        raise OmniTTSError("give either --voice FILE or --ref-audio FILE (with --ref-text or --x-vector-only)")
    if not args.ref_audio:
        if args.ref_text or args.x_vector_only:
            raise OmniTTSError("--ref-text and --x-vector-only go with --ref-audio FILE")
        return None
    if not args.x_vector_only and not (args.ref_text and args.ref_text.strip()):
        raise OmniTTSError("voice clone from --ref-audio needs --ref-text (the clip's transcript), "
                           "or --x-vector-only")
    wav = load_reference_audio(args.ref_audio)
    info = sf.info(args.ref_audio)  # readable: load_reference_audio succeeded
    done = [f"{info.channels} channels mixed to mono"] if info.channels > 1 else []
    done += [f"{info.samplerate} Hz resampled to 24000 Hz"] if info.samplerate != 24000 else []
    if done:
        print(f"note: reference audio {args.ref_audio}: {'; '.join(done)}", file=sys.stderr)
    return wav


def _voice(args: argparse.Namespace, model, task: str, ref_wav):  # -> VoicePrompt | None
    """The request's voice prompt: loaded from --voice or made from the reference audio; saved if asked."""
    from omni_tts.models.speaker import VoicePrompt

    if task != "voice_clone":
        if args.voice or ref_wav is not None or args.save_voice:
            raise OmniTTSError(f"voice-clone flags need --task voice_clone; this checkpoint does {task}")
        return None
    if args.voice:
        voice = VoicePrompt.load(args.voice)
    elif ref_wav is not None:
        voice = model.voice_prompt(ref_wav, args.ref_text, args.x_vector_only)
    else:
        raise OmniTTSError("voice_clone needs --ref-audio FILE (with --ref-text, or --x-vector-only) "
                           "or --voice FILE.safetensors")
    return voice


def _save_voice(path: str, voice) -> None:  # voice: VoicePrompt
    try:
        voice.save(path)
    except (OSError, RuntimeError, ValueError) as e:
        raise OmniTTSError(f"cannot write {path} ({str(e).splitlines()[0]})") from None
