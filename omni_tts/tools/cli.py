"""Command line: `python -m omni_tts synth ...` (one request, reference loop), `speakers`, and
`make-checkpoint` (random weights in the released layout, via omni_tts.models.checkpoint_maker).

Owns argument parsing, choosing the checkpoint (--model, else the embedded default), the voice-clone
flags (reference audio -> voice prompt, saving/loading voice prompts), checking every input and every
output path before any work (invalid UTF-8, a directory or a non-.wav name for --out, an existing file
without --force), and turning every OmniTTSError, argument errors included, into one `error: ...` line
on stderr with exit status 2 (no traceback).
Knows nothing about model internals: it loads an omni_tts.models.qwen3_tts.TTSModel and runs the
plain single-request path (omni_tts.engine.offline).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from omni_tts.errors import OmniTTSError

EXIT_USER_ERROR = 2
MAKER_TYPES = ("custom_voice", "voice_design")  # checkpoint types make-checkpoint writes
TEXT_FLAGS = ("text", "instruct", "speaker", "language", "ref_text")  # synth flags whose value is spoken or looked up


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one `error: ...` line and exit status 2, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{s}'")


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m omni_tts", description="Qwen3-TTS-12Hz inference (omni-tts)")
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("synth", help="synthesize one text to a WAV file")
    s.add_argument("--model", help="checkpoint directory or Hugging Face Hub id (default: embedded demo model)")
    s.add_argument("--task", choices=["custom_voice", "voice_design", "voice_clone"],
                   help="default: what the checkpoint does")
    s.add_argument("--text", required=True)
    s.add_argument("--speaker", help="built-in speaker (custom_voice; default: the checkpoint's first)")
    s.add_argument("--language", default="Auto")
    s.add_argument("--instruct", help="style instruction (custom_voice) or voice description (voice_design)")
    s.add_argument("--non-streaming-mode", type=_bool, default=None, metavar="{true,false}",
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
    s.add_argument("--device", default="cpu", help="cpu or cuda")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    s.add_argument("--out", required=True, help="output WAV path (.wav)")
    s.add_argument("--codes-out", help="also save the [frames, 16] code matrix as .npy")
    s.add_argument("--force", action="store_true", help="overwrite --out, --codes-out and --save-voice files")
    sp = sub.add_parser("speakers", help="list a checkpoint's built-in speakers")
    sp.add_argument("--model", help="checkpoint directory or Hub id (default: embedded demo model)")
    mk = sub.add_parser("make-checkpoint", help="write a RANDOM-weight checkpoint (its audio is noise) for speed work")
    mk.add_argument("--size", required=True, help="tiny, 0.6B or 1.7B")
    mk.add_argument("--out", required=True, help="directory to create (must not exist, or be empty)")
    mk.add_argument("--type", default="custom_voice", help="custom_voice (default) or voice_design")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--device", default="cpu", help="where the random weights are drawn: cpu or cuda")
    mk.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    return ap


def _checkpoint(model: str | None):  # -> Checkpoint
    """--model, else OMNI_TTS_MODEL, the HF cache, the Hub, or the embedded demo (said on stderr)."""
    from omni_tts.models.selection import open_checkpoint

    ckpt = open_checkpoint(model, progress=lambda s: print(s, file=sys.stderr))
    if not model and not ckpt.is_embedded_demo:  # the embedded demo gets its own note below
        print(f"model: {ckpt.describe()} ({ckpt.notes[-1]})", file=sys.stderr)
    return ckpt


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
    if not path:
        return
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


def _synth(args: argparse.Namespace) -> int:
    import numpy as np
    import soundfile as sf

    from omni_tts.engine import offline
    from omni_tts.models.loading import resolve_device, resolve_dtype
    from omni_tts.models.qwen3_tts import TTSModel

    _utf8(args)
    _outputs(args)
    _request(args, args.task or "custom_voice").validate()  # every field bounded before anything loads
    ref_wav = _reference_audio(args)  # before loading the model: bad audio fails fast
    ckpt = _checkpoint(args.model)
    if ckpt.is_embedded_demo:
        print(f"note: {ckpt.describe()}", file=sys.stderr)
    device = resolve_device(args.device)
    model = TTSModel.from_checkpoint(ckpt, device=device, dtype=resolve_dtype(args.dtype, device))
    task = args.task or (model.tasks() or ["custom_voice"])[0]
    voice = _voice(args, model, task, ref_wav)
    wav, codes = offline.synthesize(model, _request(args, task, voice))
    try:
        sf.write(args.out, wav, model.sample_rate, subtype="FLOAT")
        if args.codes_out:
            np.save(args.codes_out, codes.numpy())
    except (OSError, RuntimeError) as e:
        raise OmniTTSError(f"cannot write output ({str(e).splitlines()[0]})") from None
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
    if args.save_voice:
        try:
            voice.save(args.save_voice)
        except (OSError, RuntimeError, ValueError) as e:
            raise OmniTTSError(f"cannot write {args.save_voice} ({str(e).splitlines()[0]})") from None
    return voice


def _speakers(args: argparse.Namespace) -> int:
    from omni_tts.models.text import PromptBuilder, TextTokenizer

    ckpt = _checkpoint(args.model)
    names = PromptBuilder(ckpt.config, TextTokenizer(ckpt.path)).speakers()
    if not names:
        print(f"no built-in speakers ({ckpt.tts_model_type} checkpoint)", file=sys.stderr)
    for n in names:
        print(n)
    return 0


def _make_checkpoint(args: argparse.Namespace) -> int:
    from omni_tts.config import LIMITS, check_number
    from omni_tts.models.checkpoint_maker import SIZES, make_checkpoint
    from omni_tts.models.loading import resolve_device

    check_number("--seed", args.seed, LIMITS["seed"])
    if args.size not in SIZES:
        raise OmniTTSError(f"unknown --size '{args.size}'; valid: {', '.join(SIZES)}")
    if args.type not in MAKER_TYPES:
        raise OmniTTSError(f"unknown --type '{args.type}'; valid: {', '.join(MAKER_TYPES)}")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OmniTTSError(f"{out}: exists and is not an empty directory; choose a new --out")
    device = resolve_device(args.device)
    try:
        make_checkpoint(out, args.size, args.type, seed=args.seed, device=str(device), dtype=args.dtype)
    except OSError as e:
        raise OmniTTSError(f"cannot write {out} ({str(e).splitlines()[0]})") from None
    print(f"wrote a {args.size} {args.type} checkpoint to {out}: RANDOM weights (seed {args.seed}), "
          f"its audio is noise, not speech")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        commands = {"synth": _synth, "speakers": _speakers, "make-checkpoint": _make_checkpoint}
        return commands[args.command](args)
    except OmniTTSError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
