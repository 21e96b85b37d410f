"""`omni-tts speakers` (a checkpoint's built-in speakers) and `omni-tts make-checkpoint` (random weights in
the released layout, via omni_tts.models.checkpoint_maker), and how every command opens the checkpoint
--model names. Knows nothing about model internals.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omni_tts.errors import OmniTTSError
from omni_tts.tools.args import add_device_flags, add_model_flag

MAKER_TYPES = ("custom_voice", "voice_design", "base")  # checkpoint types make-checkpoint writes


def open_checkpoint(model: str | None):  # -> Checkpoint
    """--model, else OMNI_TTS_MODEL, the HF cache, the Hub, or the embedded demo (said on stderr)."""
    from omni_tts.models import selection

    ckpt = selection.open_checkpoint(model, progress=lambda s: print(s, file=sys.stderr))
    if not model and not ckpt.is_embedded_demo:  # the embedded demo gets its own note from the caller
        print(f"model: {ckpt.describe()} ({ckpt.notes[-1]})", file=sys.stderr)
    return ckpt


def add_speakers_arguments(p: argparse.ArgumentParser) -> None:
    add_model_flag(p)


def speakers(args: argparse.Namespace) -> int:
    from omni_tts.models.text import PromptBuilder, TextTokenizer

    ckpt = open_checkpoint(args.model)
    names = PromptBuilder(ckpt.config, TextTokenizer(ckpt.path)).speakers()
    if not names:
        print(f"no built-in speakers ({ckpt.tts_model_type} checkpoint)", file=sys.stderr)
    for n in names:
        print(n)
    return 0


def add_make_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (f"{p.description}. The weights are drawn on --device (default cpu) in --dtype "
                     "(default float32), so a seed gives the same bytes everywhere.")
    p.add_argument("--size", required=True, help="tiny, 0.6B or 1.7B")
    p.add_argument("--out", required=True, help="directory to create (must not exist, or be empty)")
    p.add_argument("--type", default="custom_voice", help="custom_voice (default), voice_design or base (voice clone)")
    p.add_argument("--seed", type=int, default=0)
    add_device_flags(p, device="cpu (default)", dtype="float32")


def make(args: argparse.Namespace) -> int:
    from omni_tts.limits import LIMITS, check_number
    from omni_tts.models.checkpoint_maker import SIZES, make_checkpoint
    from omni_tts.models.loading import resolve_device, resolve_dtype

    check_number("--seed", args.seed, LIMITS["seed"])
    if args.size not in SIZES:
        raise OmniTTSError(f"unknown --size '{args.size}'; valid: {', '.join(SIZES)}")
    if args.type not in MAKER_TYPES:
        raise OmniTTSError(f"unknown --type '{args.type}'; valid: {', '.join(MAKER_TYPES)}")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OmniTTSError(f"{out}: exists and is not an empty directory; choose a new --out")
    device = resolve_device(args.device or "cpu")
    dtype = args.dtype or "float32"
    if dtype == "auto":
        dtype = str(resolve_dtype(dtype, device)).removeprefix("torch.")
    try:
        make_checkpoint(out, args.size, args.type, seed=args.seed, device=str(device), dtype=dtype)
    except OSError as e:
        raise OmniTTSError(f"cannot write {out} ({str(e).splitlines()[0]})") from None
    print(f"wrote a {args.size} {args.type} checkpoint to {out}: RANDOM weights (seed {args.seed}), "
          f"its audio is noise, not speech")
    return 0
