"""Command line: `python -m omni_tts synth ...` (one request, reference loop) and `speakers`.

Owns argument parsing, choosing the checkpoint (--model, else the embedded default), and turning
every OmniTTSError into one `error: ...` line on stderr with exit status 2 (no traceback).
Knows nothing about model internals: it calls omni_tts.model.TTSModel.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from omni_tts.errors import OmniTTSError

EXIT_USER_ERROR = 2


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{s}'")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m omni_tts", description="Qwen3-TTS-12Hz inference (omni-tts)")
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("synth", help="synthesize one text to a WAV file")
    s.add_argument("--model", help="checkpoint directory or Hugging Face Hub id (default: embedded demo model)")
    s.add_argument("--task", choices=["custom_voice", "voice_design"],
                   help="default: what the checkpoint does")
    s.add_argument("--text", required=True)
    s.add_argument("--speaker", help="built-in speaker (custom_voice; default: the checkpoint's first)")
    s.add_argument("--language", default="Auto")
    s.add_argument("--instruct", help="style instruction (custom_voice) or voice description (voice_design)")
    s.add_argument("--non-streaming-mode", type=_bool, default=None, metavar="{true,false}",
                   help="feed the whole text up front (official default: true for these tasks)")
    s.add_argument("--greedy", action="store_true", help="argmax everywhere instead of sampling")
    s.add_argument("--max-new-tokens", type=int)
    s.add_argument("--seed", type=int)
    s.add_argument("--device", default="cpu", help="cpu or cuda")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    s.add_argument("--out", required=True, help="output WAV path")
    s.add_argument("--codes-out", help="also save the [frames, 16] code matrix as .npy")
    sp = sub.add_parser("speakers", help="list a checkpoint's built-in speakers")
    sp.add_argument("--model", help="checkpoint directory or Hub id (default: embedded demo model)")
    return ap


def _checkpoint(model: str | None):  # -> Checkpoint
    from omni_tts import checkpoint

    if model:
        return checkpoint.load_checkpoint(model)
    if hasattr(checkpoint, "default_checkpoint"):
        return checkpoint.default_checkpoint()
    raise OmniTTSError("no --model given and this build has no embedded default checkpoint; pass --model DIR")


def _device(name: str):
    import torch

    if name.startswith("cuda") and not torch.cuda.is_available():
        raise OmniTTSError("device cuda requested but CUDA is not available here; use --device cpu")
    if name != "cpu" and not name.startswith("cuda"):
        raise OmniTTSError(f"device must be cpu or cuda (got '{name}')")
    return torch.device(name)


def _synth(args: argparse.Namespace) -> int:
    import numpy as np
    import soundfile as sf
    import torch

    from omni_tts.config import SynthesisParams
    from omni_tts.model import TTSModel

    for path in filter(None, (args.out, args.codes_out)):
        if not Path(path).parent.is_dir():
            raise OmniTTSError(f"{path}: the directory does not exist")
    ckpt = _checkpoint(args.model)
    if ckpt.is_embedded_demo:
        print(f"note: {ckpt.describe()}", file=sys.stderr)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    model = TTSModel.from_checkpoint(ckpt, device=_device(args.device), dtype=dtype)
    task = args.task or (model.tasks() or ["custom_voice"])[0]
    params = SynthesisParams(text=args.text, task=task, speaker=args.speaker, language=args.language,
                             instruct=args.instruct, non_streaming_mode=args.non_streaming_mode, greedy=args.greedy,
                             max_new_tokens=args.max_new_tokens, seed=args.seed)
    wav, codes = model.synthesize(params)
    try:
        sf.write(args.out, wav, model.sample_rate, subtype="FLOAT")
        if args.codes_out:
            np.save(args.codes_out, codes.numpy())
    except (OSError, RuntimeError) as e:
        raise OmniTTSError(f"cannot write output ({str(e).splitlines()[0]})") from None
    print(f"wrote {args.out}: {codes.shape[0]} frames, {len(wav) / model.sample_rate:.2f} s at "
          f"{model.sample_rate} Hz", file=sys.stderr)
    return 0


def _speakers(args: argparse.Namespace) -> int:
    from omni_tts.text import PromptBuilder, TextTokenizer

    ckpt = _checkpoint(args.model)
    names = PromptBuilder(ckpt.config, TextTokenizer(ckpt.path)).speakers()
    if not names:
        print(f"no built-in speakers ({ckpt.tts_model_type} checkpoint)", file=sys.stderr)
    for n in names:
        print(n)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"synth": _synth, "speakers": _speakers}[args.command](args)
    except OmniTTSError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
