"""The command line's shared pieces: the parser whose errors are one line, and the flags every command that
loads a model or builds an engine takes, each defined once here.

    add_model_flag(parser)     --model
    add_device_flags(parser)   --device, --dtype
    add_engine_flags(parser)   --model, --device, --dtype, --preset, --set (and --mode where asked for);
                               engine_parent() is the same as a parent parser

`engine_config(args, **overrides)` turns them into an EngineConfig: the preset, then its --set pairs, then
--model / --device / --dtype / --mode, then what the command fixes itself (e.g. its modes). Used by
`omni-tts` (tools/cli.py) and app.py alike. Knows nothing about what a command does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from omni_tts.config import CompileMode, EngineConfig, load_preset, parse_sets, preset_names

EXIT_USER_ERROR = 2


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one `error: ...` line and exit status 2, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        error_line(f"{message} (see {self.prog} --help)")
        sys.exit(EXIT_USER_ERROR)


def error_line(message: str) -> None:
    """`error: message` on stderr in one write: a progress line from another thread never splits it."""
    sys.stderr.write(f"error: {message}\n")


def bool_arg(s: str) -> bool:
    v = s.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{s}'")


def positive_arg(s: str) -> float:
    """A finite number above zero (a rate, a duration)."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{s}'") from None
    if not 0 < v < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {s}")
    return v


def port_arg(s: str) -> int:
    """A TCP port to listen on: 1..65535 (a larger number would wrap around to another port)."""
    try:
        port = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port is a whole number, got '{s}'") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is from 1 to 65535, got {port}")
    return port


def add_model_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="checkpoint directory or Hugging Face Hub id (default: env "
                   "OMNI_TTS_MODEL, a Qwen3-TTS checkpoint in the HF cache, the Hub's 0.6B CustomVoice when online, "
                   "else the embedded demo, whose audio is noise)")


def add_device_flags(p: argparse.ArgumentParser, device: str = "auto (default: cuda when available), cpu",
                     dtype: str = "auto: bfloat16 on CUDA, float32 on a CPU") -> None:
    """--device and --dtype; `device` / `dtype`: their choices' help, saying what the command does without them."""
    p.add_argument("--device", default=None, help=f"{device}, cuda or cuda:N")
    p.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"],
                   help=f"default {dtype}")


def add_engine_flags(p: argparse.ArgumentParser, preset: str = "default", mode: bool = False) -> None:
    """--model, --device, --dtype, --preset (default `preset`) and --set; with `mode`, --mode too."""
    add_model_flag(p)
    add_device_flags(p)
    p.add_argument("--preset", default=preset, metavar="NAME|FILE",
                   help=f"engine preset: a shipped name ({', '.join(preset_names())}) or a YAML file; default {preset}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a preset key (repeatable), e.g. --set max_num_seqs=16 --set chunk_growth=false")
    if mode:
        p.add_argument("--mode", default=None, choices=["auto", *(m.value for m in CompileMode)],
                       help="requests' default compile mode (default: the preset's)")


def engine_parent(preset: str = "default", mode: bool = False) -> argparse.ArgumentParser:
    """add_engine_flags as a parent parser (`parents=[engine_parent()]`)."""
    p = argparse.ArgumentParser(add_help=False)
    add_engine_flags(p, preset, mode)
    return p


def engine_config(args: argparse.Namespace, **overrides: Any) -> EngineConfig:
    """The preset, its --set pairs, the model / device / dtype / mode flags, then `overrides` (None keeps
    what came before). Raises OmniTTSError naming a bad preset, key or value."""
    flags = {k: getattr(args, k, None) for k in ("model", "device", "dtype", "mode")}
    values = parse_sets(args.set)
    values.update({k: v for k, v in (flags | overrides).items() if v is not None})
    return load_preset(args.preset, **values)


def progress(tag: str = "", width: int = 6) -> Callable[[str], None]:
    """A progress line printer for stderr, each line stamped with `tag` and the seconds since this call."""
    t0 = time.perf_counter()
    tag = f"{tag} " if tag else ""

    def say(line: str) -> None:  # one write a line: a line from another thread never splits it
        sys.stderr.write(f"[{tag}{time.perf_counter() - t0:{width}.1f}s] {line}\n")
        sys.stderr.flush()

    return say


def write_json(path: str | Path, obj: Any) -> None:
    """`obj` as JSON at `path`, whole or not at all: written beside it, then renamed over it (a tool stopped
    mid-write leaves the last whole file)."""
    part = Path(f"{path}.part")
    part.write_text(json.dumps(obj, indent=1))
    os.replace(part, path)


def run_to_json(args: argparse.Namespace, run: Callable[[argparse.Namespace, Callable[[str], None]], Any]) -> Any:
    """A tool's run(args, progress lines on stderr), its result also written to --json when given."""
    res = run(args, progress())
    if args.json:
        write_json(args.json, res)
    return res
