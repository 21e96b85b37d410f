"""Open-loop load against a speech server, as vLLM's serving benchmark does it: Poisson arrivals at R requests/s
for a fixed time, each a streamed pcm `POST /v1/audio/speech`, whatever the server's pace.

Owns the arrival schedule, the async client (httpx), the per-request record (status, time to first audio,
end to end, every chunk's arrival), the report (p50/p95/p99 TTFP and E2E, RTF, audio s/s, errors by
status, audio underrun: `lateness` plays each stream in real time from its first chunk and says how late
the latest chunk came), and `--sweep`: a bisection over rates for the highest one whose p95 TTFP meets
the target with no underrun and no error. Knows nothing about the engine: any OpenAI-compatible speech
server can be measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_tts.tools.args import positive_arg
from omni_tts.tools.load import PROMPTS
from omni_tts.tools.provenance import provenance

BYTES_PER_SAMPLE = 2  # pcm: 16-bit little-endian mono
DEFAULT_SAMPLE_RATE = 24000


@dataclass
class Record:
    """One request; times in seconds from its send."""

    sent_at: float  # from the start of the run
    status: str = ""  # the HTTP status, or the name of the transport error
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, bytes) of each non-empty read
    end: float | None = None
    sample_rate: int = DEFAULT_SAMPLE_RATE

    @property
    def ok(self) -> bool:
        return self.status == "200" and bool(self.chunks) and self.end is not None

    @property
    def audio_s(self) -> float:
        return sum(n for _, n in self.chunks) / (BYTES_PER_SAMPLE * self.sample_rate)


def lateness(chunks: Sequence[tuple[float, int]], bytes_per_s: float) -> float:
    """How late the latest chunk came for a player that starts at the first chunk and plays in real time
    (seconds; <= 0: every chunk came before playback needed it). chunks: (arrival time, bytes) in order."""
    if not chunks:
        return 0.0
    start, played, worst = chunks[0][0], 0, float("-inf")
    for at, size in chunks:
        worst = max(worst, at - (start + played / bytes_per_s))
        played += size
    return worst


def arrivals(rate: float, duration_s: float, seed: int = 0) -> list[float]:
    """Poisson arrival times in [0, duration_s) at `rate` per second."""
    rng, out, t = np.random.default_rng(seed), [], 0.0
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t >= duration_s:
            return out
        out.append(t)


async def _one(client: Any, url: str, body: dict[str, Any], rec: Record, timeout_s: float) -> None:
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, timeout=timeout_s) as r:
            rec.status = str(r.status_code)
            rec.sample_rate = int(r.headers.get("x-sample-rate", DEFAULT_SAMPLE_RATE))
            if r.status_code != 200:
                await r.aread()
                return
            async for piece in r.aiter_raw():
                if piece:
                    rec.chunks.append((time.perf_counter() - t0, len(piece)))
        rec.end = time.perf_counter() - t0
    except Exception as e:  # httpx's transport errors, timeouts: counted by name
        rec.status = type(e).__name__


async def run(url: str, rate: float, duration_s: float, body: dict[str, Any], seed: int = 0,
              timeout_s: float = 120.0) -> tuple[list[Record], float]:
    """Send the schedule's requests at their times (none waits for another); -> records, wall seconds."""
    import httpx

    target = url.rstrip("/") + "/v1/audio/speech"
    schedule = arrivals(rate, duration_s, seed)
    records = [Record(at) for at in schedule]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits) as client:
        start = time.perf_counter()

        async def fire(i: int, rec: Record) -> None:
            await asyncio.sleep(max(0.0, start + rec.sent_at - time.perf_counter()))
            req = {**body, "input": PROMPTS[i % len(PROMPTS)], "seed": seed + i}
            await _one(client, target, req, rec, timeout_s)

        await asyncio.gather(*(fire(i, rec) for i, rec in enumerate(records)))
        wall = time.perf_counter() - start
    return records, wall


def report(records: Sequence[Record], wall_s: float, rate: float, duration_s: float,
           tolerance_s: float = 0.1) -> dict[str, Any]:
    """The run's figures: counts, statuses, percentiles (ms) over the requests that finished, underrun."""
    done = [r for r in records if r.ok]
    late = [lateness(r.chunks, BYTES_PER_SAMPLE * r.sample_rate) for r in done]
    audio = sum(r.audio_s for r in done)
    out: dict[str, Any] = {"rate": rate, "duration_s": duration_s, "sent": len(records), "done": len(done),
                           "statuses": dict(sorted(Counter(r.status for r in records).items())),
                           "wall_s": round(wall_s, 3), "audio_s_per_s": round(audio / wall_s, 3) if wall_s else 0.0,
                           "underrun_share": round(sum(x > tolerance_s for x in late) / len(done), 4) if done else None,
                           "max_lateness_ms": round(1000 * max(late), 1) if late else None}
    for name, values in (("ttfp_ms", [1000 * r.chunks[0][0] for r in done]), ("e2e_ms", [1000 * r.end for r in done])):
        for q in (50, 95, 99):
            out[f"{name}_p{q}"] = round(float(np.percentile(values, q)), 1) if values else None
    rtf = [r.end / r.audio_s for r in done if r.audio_s > 0]
    out["rtf_mean"] = round(float(np.mean(rtf)), 4) if rtf else None
    return out


def meets(result: dict[str, Any], ttfp_slo_ms: float) -> bool:
    """Every request finished, p95 TTFP within the target, no underrun."""
    return (result["done"] == result["sent"] > 0 and result["ttfp_ms_p95"] is not None
            and result["ttfp_ms_p95"] <= ttfp_slo_ms and result["underrun_share"] == 0)


def sweep(measure: Any, low: float, high: float, steps: int, ttfp_slo_ms: float) -> tuple[float | None, list]:
    """Bisection over rates in [low, high] for the highest that `meets` the target; -> (rate or None, results)."""
    results = [measure(high)]
    if meets(results[-1], ttfp_slo_ms):
        return high, results
    results.append(measure(low))
    if not meets(results[-1], ttfp_slo_ms):
        return None, results
    good, bad = low, high
    for _ in range(steps):
        mid = round((good + bad) / 2, 3)
        results.append(measure(mid))
        good, bad = (mid, bad) if meets(results[-1], ttfp_slo_ms) else (good, mid)
    return good, results


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--http", required=True, metavar="URL", help="the server (POST URL/v1/audio/speech, streamed pcm)")
    p.add_argument("--rate", type=positive_arg, required=True,
                   help="requests per second (with --sweep: the highest tried)")
    p.add_argument("--duration", type=positive_arg, default=30.0, help="seconds of arrivals per rate (default 30)")
    p.add_argument("--max-new-tokens", type=int, default=76, help="per request (frames + 1; default 76)")
    p.add_argument("--voice", default=None)
    p.add_argument("--mode", default=None, help="the compile mode each request names (default: the server's)")
    p.add_argument("--seed", type=int, default=0, help="arrival schedule and sampling seeds")
    p.add_argument("--timeout", type=positive_arg, default=120.0, help="per request, seconds")
    p.add_argument("--tolerance-ms", type=float, default=100.0, help="a chunk later than playback needs by more is "
                   "an underrun (default 100)")
    p.add_argument("--sweep", action="store_true", help="bisect for the highest rate meeting "
                   "--ttfp-slo-ms, no underrun")
    p.add_argument("--min-rate", type=positive_arg, default=0.5, help="--sweep's lowest rate (default 0.5)")
    p.add_argument("--steps", type=int, default=4, help="--sweep's bisection steps (default 4)")
    p.add_argument("--ttfp-slo-ms", type=float, default=50.0, help="--sweep's p95 TTFP target (default 50)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the command, commit, rates and results here")
    return p


def main(args: argparse.Namespace) -> int:
    body = {"response_format": "pcm", "stream": True, "max_new_tokens": args.max_new_tokens}
    body.update({k: v for k, v in (("voice", args.voice), ("mode", args.mode)) if v})

    def measure(rate: float) -> dict[str, Any]:
        records, wall = asyncio.run(run(args.http, rate, args.duration, body, args.seed, args.timeout))
        result = report(records, wall, rate, args.duration, args.tolerance_ms / 1000)
        print(format_row(result), file=sys.stderr, flush=True)
        return result

    print(HEADER, file=sys.stderr)
    best = None
    if args.sweep:
        best, results = sweep(measure, args.min_rate, args.rate, args.steps, args.ttfp_slo_ms)
    else:
        results = [measure(args.rate)]
    print(HEADER)
    for r in sorted(results, key=lambda r: r["rate"]):
        print(format_row(r))
    if args.sweep:
        print(f"highest rate with p95 TTFP <= {args.ttfp_slo_ms:g} ms and no underrun: "
              f"{'none tried' if best is None else f'{best:g} req/s'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance(), "http": args.http, "body": body,
                       "rates": [r["rate"] for r in results], "results": results,
                       "sweep": {"best_rate": best, "ttfp_slo_ms": args.ttfp_slo_ms} if args.sweep else None},
                      f, indent=1)
    return 0


HEADER = (f"{'rate':>6} {'sent':>5} {'done':>5} {'TTFP p50/p95/p99 ms':>22} {'E2E p50/p95/p99 ms':>24} "
          f"{'RTF':>6} {'audio s/s':>9} {'underrun':>8}  statuses")


def format_row(r: dict[str, Any]) -> str:
    f = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    ttfp = "/".join(f(r[f"ttfp_ms_p{q}"]) for q in (50, 95, 99))
    e2e = "/".join(f(r[f"e2e_ms_p{q}"]) for q in (50, 95, 99))
    under = "-" if r["underrun_share"] is None else f"{100 * r['underrun_share']:.0f}%"
    rtf = "-" if r["rtf_mean"] is None else f"{r['rtf_mean']:.3f}"
    return (f"{r['rate']:>6g} {r['sent']:>5} {r['done']:>5} {ttfp:>22} {e2e:>24} {rtf:>6} "
            f"{r['audio_s_per_s']:>9.2f} {under:>8}  {r['statuses']}")


if __name__ == "__main__":
    sys.exit(main(add_arguments(argparse.ArgumentParser(prog="python -m omni_tts.tools.openloop",
                                                        description=__doc__.splitlines()[0])).parse_args()))
