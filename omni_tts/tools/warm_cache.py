"""`omni-tts warm-cache`: export this machine's compile artifacts for a fresh container, or import them.

`--export DIR` builds the engine the app would build (the same preset, model and overrides), warms every
resident mode, and writes torch's portable compile artifacts, the kernel probes' outcomes and a manifest
of the machine (GPU, torch, CUDA, Triton) into DIR. `--import DIR` loads them into the cache folders,
refusing artifacts made for another machine. The app imports `OMNI_TTS_ARTIFACTS` (or
<cache>/artifacts) at start by itself (omni_tts.engine.compile_cache). Knows nothing about the UI.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from omni_tts.errors import OmniTTSError
from omni_tts.tools.args import add_engine_flags, engine_config, error_line, progress

WARM_TIMEOUT_S = 3600.0  # a first reduce-overhead compile on a GPU takes minutes; this bounds a stuck one


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommand's options (the CLI owns the parser and calls main with its result)."""
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--export", metavar="DIR", help="warm every resident mode, then write the artifacts here")
    what.add_argument("--import", dest="import_dir", metavar="DIR",
                      help="load artifacts written by --export on a machine like this one")
    add_engine_flags(parser)  # --export's engine, as the app builds it
    parser.add_argument("--timeout", type=float, default=WARM_TIMEOUT_S, help="seconds to wait for each mode")


def main(args: argparse.Namespace) -> int:
    """Run the export or the import; every failure is one `error: ...` line and exit status 2."""
    from omni_tts.engine.testing import compile_cache

    say = progress("warm-cache")
    try:
        if args.import_dir:
            compile_cache.use_cache_dirs()
            manifest = compile_cache.import_artifacts(args.import_dir)
            say(f"imported {_describe(manifest)} into {compile_cache.cache_root()}")
            return 0
        return _export(args, say)
    except OmniTTSError as e:
        error_line(str(e))
        return 2


def _export(args: argparse.Namespace, say: Any) -> int:
    from omni_tts import Engine
    from omni_tts.engine.testing import compile_cache

    config = engine_config(args)  # a bad preset or key fails before anything loads
    compile_cache.use_cache_dirs()
    engine = Engine.from_config(config, progress=say, wait=False, warm=True)
    try:
        resident = [m for m, v in engine.modes().items() if v.state not in ("unavailable", "failed")]
        for mode in resident:
            if not engine.wait_ready(mode, args.timeout):
                raise OmniTTSError(f"mode {mode} was not warm after {args.timeout:.0f} s; nothing exported")
            say(f"{mode} warm")
        failed = {m: v.reason for m, v in engine.modes().items() if v.state == "failed"}
        if failed:
            raise OmniTTSError(f"warm-up failed ({failed}); nothing exported")
        manifest = compile_cache.export_artifacts(args.export)
    finally:
        engine.shutdown()
    say(f"exported {_describe(manifest)} for modes {', '.join(resident)} to {args.export}")
    return 0


def _describe(manifest: dict[str, Any]) -> str:
    torch_part = (f"{manifest.get('torch_artifacts_bytes', 0)} bytes of torch compile artifacts"
                  if manifest.get("torch_artifacts") else "no torch compile artifacts")
    return (f"{torch_part} and {manifest.get('kernel_probes', 0)} kernel-probe outcomes "
            f"({manifest.get('gpu')}, torch {manifest.get('torch')}, CUDA {manifest.get('cuda')}, "
            f"Triton {manifest.get('triton')})")


if __name__ == "__main__":
    _p = argparse.ArgumentParser(prog="python -m omni_tts.tools.warm_cache", description=__doc__.splitlines()[0])
    add_arguments(_p)
    sys.exit(main(_p.parse_args()))
