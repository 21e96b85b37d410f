"""`omni-tts` / `python -m omni_tts`: one command with a subcommand per job.

Owns the list of subcommands and the dispatch: only the chosen subcommand's module is imported (so
`omni-tts synth` never imports the benchmark or the server), it adds its arguments to its subparser and
runs; every OmniTTSError, argument errors included, becomes one `error: ...` line on stderr with exit
status 2 (no traceback). Knows nothing about what a subcommand does.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from omni_tts.errors import OmniTTSError
from omni_tts.tools.args import EXIT_USER_ERROR, Parser, error_line


class Command(NamedTuple):
    module: str  # exposes add(parser) and run(args) -> exit status under these names
    help: str
    add: str = "add_arguments"
    run: str = "main"


COMMANDS: dict[str, Command] = {
    "synth": Command("omni_tts.tools.synth", "synthesize one text to a WAV file"),
    "speakers": Command("omni_tts.tools.checkpoints", "list a checkpoint's built-in speakers",
                        "add_speakers_arguments", "speakers"),
    "make-checkpoint": Command("omni_tts.tools.checkpoints", "write a RANDOM-weight checkpoint at a real size "
                               "(its audio is noise) for speed work", "add_make_arguments", "make"),
    "serve": Command("omni_tts.serving.headless", "serve the speech API, health and metrics without the page "
                     "(--ray: replicas on Ray Serve)"),
    "warm-cache": Command("omni_tts.tools.warm_cache", "export or import compiled artifacts for a fresh machine"),
    "bench": Command("omni_tts.tools.bench", "latency and throughput per compile mode and concurrency"),
    "ab": Command("omni_tts.tools.ab", "bench or codec-bench on several revisions, interleaved processes, one table"),
    "peers": Command("omni_tts.tools.peers", "other TTS systems beside this engine, each in its own process"),
    "microbench": Command("omni_tts.tools.microbench", "per-batch step costs per mode, greedy agreement"),
    "mixed-load": Command("omni_tts.tools.mixed_load", "modes side by side in one engine"),
    "soak": Command("omni_tts.tools.soak", "a long mixed run watching memory and every request's outcome"),
    "start-timing": Command("omni_tts.tools.start_timing", "the app's start-up as a visitor meets it"),
    "start-profile": Command("omni_tts.tools.start_profile", "where a fresh engine's first requests wait"),
    "kernel-sweep": Command("omni_tts.tools.kernel_sweep", "Triton launch configs for this GPU"),
    "openloop": Command("omni_tts.tools.openloop", "Poisson arrivals against a running server: TTFP, underrun, "
                        "the highest rate that meets a target (also `bench --http URL --rate R`)"),
    "scaleout": Command("omni_tts.tools.scaleout_bench", "one process against Ray Serve replicas, closed and "
                        "open loop"),
    "roofline": Command("omni_tts.tools.roofline", "per-part time, bytes read and share of the GPU's bandwidth"),
    "codec-bench": Command("omni_tts.tools.codec_bench", "code-to-wave alone per rows: carried and first chunks, "
                           "kernel profiles"),
    "memory": Command("omni_tts.tools.memory_table", "peak GPU memory per preset under memory caps"),
    "start-ready": Command("omni_tts.tools.start_ready", "the app's start-up: page, each mode ready, first audio"),
    "source-digest": Command("omni_tts.tools.provenance", "the package's source digest (or commits'), as result "
                             "JSONs record it"),
}


Run = Callable[[argparse.Namespace], int]


def _parser(chosen: str | None) -> tuple[argparse.ArgumentParser, Run | None]:
    """The command line; only `chosen`'s module is imported, to add its arguments."""
    ap = Parser(prog="omni-tts", description="Qwen3-TTS (12 Hz) inference: synthesis, serving, benchmarks")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    found = None
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        if name == chosen:
            try:
                module = importlib.import_module(cmd.module)
            except ModuleNotFoundError as e:
                if e.name is None or not cmd.module.startswith(e.name):
                    raise
                raise OmniTTSError(f"'{name}' is not available in this installation ({cmd.module} is missing)") \
                    from None
            getattr(module, cmd.add)(p)
            found = getattr(module, cmd.run)
    return ap, found


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    if chosen == "bench" and "--rate" in argv:  # vLLM's serving-benchmark form of the open loop
        argv[argv.index("bench")] = chosen = "openloop"
    try:
        ap, run = _parser(chosen if chosen in COMMANDS else None)
        args = ap.parse_args(argv)  # an unknown or missing command exits here, before `run` is needed
        return run(args)  # type: ignore[misc]
    except OmniTTSError as e:
        error_line(str(e))
        return EXIT_USER_ERROR
