"""`omni-tts ab`: the same bench on several code trees, one process per (round, tree), interleaved.

    omni-tts ab --revs main my-branch [--rounds 2] [--json OUT] -- --model CK --preset bench --concurrency 32 64
    omni-tts ab --tool codec-bench --revs main my-branch -- --model CK --rows 1 8 32 64 --iters 10
    omni-tts ab --tool microbench --revs main my-branch -- --model CK --buckets 1 8 --skip-codec
    omni-tts ab --tool microbench --revs . --sets - kernel_configs=kc.json -- --model CK --buckets 32 64
    omni-tts ab --tool roofline --revs main my-branch -- --model CK --rows 64 --iters 5 --busy 32 64

Owns: unpacking each git revision's package into a folder of its own (`.` is the checkout as it is; a folder
holding an omni_tts package is used as it is, for machines the repository's history does not reach), running
`bench` (or `codec-bench`, `microbench` or `roofline`, `--tool`) with the arguments after `--` from each folder
in rounds whose order alternates (A B, then B A: a drift of the machine falls on both), or each tree once per
preset override (`--sets`: each item's KEY=VALUE pairs, split at commas outside brackets, given to the tool as
--set; '-' none), and one table: per mode and concurrency each process's audio s/s and median TTFP
(codec-bench: per rows each process's chunk ms, graphed where CUDA graphs ran; microbench: per mode and rows
each process's predictor frame and talker step ms; roofline: per part and rows each process's ms a call, per
concurrency its GPU busy % and the idle seconds of each pair of kernels around the gaps), and the median over
processes (the JSON is rewritten after every process, "complete" once all ran). Processes of one machine
differ by about as much as a lever does, so a lever's before and after are told apart by several interleaved
processes, not by one each.
Knows nothing about what the tools measure beyond their JSONs' rows.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from omni_tts.errors import OmniTTSError
from omni_tts.tools.args import run_to_json, write_json
from omni_tts.tools.provenance import ROOT, archive, provenance

WORKING_TREE = "."
# `python -m omni_tts` with the package of the folder given first: -m would put the working directory first
_FROM_FOLDER = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
                "runpy.run_module('omni_tts', run_name='__main__', alter_sys=True)")


def unpack(rev: str, into: Path) -> Path:
    """The folder whose omni_tts package `rev` names: the checkout itself for `.`, a folder holding an omni_tts
    package as it is, else `git archive` of the package at rev unpacked under `into`."""
    if rev == WORKING_TREE:
        return ROOT
    if (Path(rev) / "omni_tts" / "__init__.py").is_file():
        return Path(rev).resolve()
    try:
        tar = archive(rev)
    except (OSError, subprocess.SubprocessError) as e:
        why = (getattr(e, "stderr", b"") or b"").decode(errors="replace").strip() or e
        raise OmniTTSError(f"ab: no package at revision '{rev}' ({why})") from None
    folder = into / rev.replace("/", "_")
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))  # Python < 3.10.12
    return folder


def variants(revs: list[str], sets: list[str] | None) -> dict[str, tuple[str, list[str]]]:
    """What is compared, by its label in the runs and the table: each rev, or each (rev, item of `sets`) as
    "REV [ITEM]" ('-': the rev alone), with the tool's --set arguments of the item."""
    if not sets:
        return {rev: (rev, []) for rev in revs}
    if len(set(sets)) != len(sets):
        raise OmniTTSError("ab: each --sets item once")
    out = {}
    for item in sets:
        pairs = [] if item == "-" else _pairs(item)
        if any(not p.partition("=")[0] or "=" not in p for p in pairs):
            raise OmniTTSError(f"ab: --sets item '{item}' is not KEY=VALUE[,KEY=VALUE...] or '-'")
        for rev in revs:
            out[rev if item == "-" else f"{rev} [{item}]"] = (rev, [a for p in pairs for a in ("--set", p)])
    return out


def _pairs(item: str) -> list[str]:
    """An --sets item's KEY=VALUE pairs: split at commas outside brackets, so a list value stays whole."""
    return re.split(r",(?![^\[]*\])", item)


def order(revs: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, rev) in run order: the revs in turn, reversed every other round."""
    return [(r, rev) for r in range(rounds) for rev in (revs if r % 2 == 0 else revs[::-1])]


def bench_once(folder: Path, bench_args: list[str], out: Path, timeout: float, tool: str = "bench",
               extra: list[str] | None = None) -> dict[str, Any]:
    """One `tool` process importing the package in `folder` (ahead of the working directory, where relative
    paths in its arguments still resolve): its JSON, with "error" where the process failed or timed out
    (bench rewrites its JSON after every row, so a stopped process keeps the rows it finished)."""
    cmd = [sys.executable, "-c", _FROM_FOLDER, str(folder), tool, *bench_args, *(extra or []), "--json", str(out)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        p = None
    got = json.loads(out.read_text()) if out.is_file() else {}
    if p is None or p.returncode != 0:
        got["error"] = "timed out" if p is None else (p.stderr.strip().splitlines() or ["no output"])[-1]
    return got


class _Rows(NamedTuple):
    """bench's or microbench's rows: per mode and `key`, each figure per process and its median."""
    key: str  # the row's key in the summary (concurrency, rows)
    title: str  # its column's title
    figures: tuple[tuple[str, str, str], ...]  # (name, its median's name, column title)
    fmt: str


_BENCH = _Rows("concurrency", "c", (("audio_s_per_s", "median_audio_s_per_s", "audio s/s"),
                                    ("med_ttfp_ms", "median_ttfp_ms", "TTFP ms")), ".1f")
_MICRO = _Rows("rows", "rows", (("cp_ms", "median_cp_ms", "predictor frame ms"),
                                ("talker_ms", "median_talker_ms", "talker step ms")), ".3f")


def _bench_cells(bench: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, float]]]:
    for mode, by_c in bench.get("results", {}).items():
        yield from ((mode, c, res) for c, res in by_c.items() if "audio_s_per_s" in res)


def _micro_cells(bench: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, float]]]:
    for mode, got in bench.get("modes", {}).items():
        yield from ((mode, b, step) for b, step in got.get("per_bucket", {}).items() if "cp_ms" in step)


def _by_mode(runs: list[dict[str, Any]], revs: list[str], cells_of: Callable[..., Iterator], spec: _Rows
             ) -> list[dict[str, Any]]:
    """Per rev, mode and spec.key: each process's figures and their medians."""
    key = spec.key
    rows = []
    for rev in revs:
        cells: dict[tuple[str, int], list[dict[str, float]]] = {}
        for run in (r for r in runs if r["rev"] == rev):
            for mode, k, res in cells_of(run["bench"]):
                cells.setdefault((mode, int(k)), []).append(res)
        for (mode, k), got in cells.items():
            row: dict[str, Any] = {"rev": rev, "mode": mode, key: k}
            for name, median, _ in spec.figures:
                row[name] = [g[name] for g in got]
                row[median] = statistics.median(row[name])
            rows.append(row)
    return sorted(rows, key=lambda r: (r["mode"], r[key], revs.index(r["rev"])))


def _mode_table(rows: list[dict[str, Any]], spec: _Rows) -> str:
    heads = " | ".join(f"{t} per process | median" for _, _, t in spec.figures)
    out = [f"| mode | {spec.title} | rev | {heads} |", "|---" * (3 + 2 * len(spec.figures)) + "|"]
    for r in rows:
        cells = [r["mode"], r[spec.key], r["rev"]]
        for name, median, _ in spec.figures:
            cells += [", ".join(format(v, spec.fmt) for v in r[name]), format(r[median], spec.fmt)]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


def summary(runs: list[dict[str, Any]], revs: list[str]) -> list[dict[str, Any]]:
    """bench's: per rev, mode and concurrency, each process's audio s/s and median TTFP, and their medians."""
    return _by_mode(runs, revs, _bench_cells, _BENCH)


def table(rows: list[dict[str, Any]]) -> str:
    return _mode_table(rows, _BENCH)


def micro_summary(runs: list[dict[str, Any]], revs: list[str]) -> list[dict[str, Any]]:
    """microbench's: per rev, mode and rows, each process's predictor frame and talker step ms and their medians."""
    return _by_mode(runs, revs, _micro_cells, _MICRO)


def micro_table(rows: list[dict[str, Any]]) -> str:
    return _mode_table(rows, _MICRO)


def codec_summary(runs: list[dict[str, Any]], revs: list[str]) -> list[dict[str, Any]]:
    """codec-bench's: per rev and rows, each process's carried chunk ms (graphed where CUDA graphs ran, else
    eager) and their median."""
    rows = []
    for rev in revs:
        cells: dict[int, list[float]] = {}
        for run in (r for r in runs if r["rev"] == rev):
            for row in run["bench"].get("rows", []):
                cells.setdefault(row["rows"], []).append(row.get("carried_graph_ms", row["carried_chunk_ms"]))
        rows += [{"rev": rev, "rows": b, "chunk_ms": ms, "median_chunk_ms": statistics.median(ms)}
                 for b, ms in cells.items()]
    return sorted(rows, key=lambda r: (r["rows"], revs.index(r["rev"])))


def codec_table(rows: list[dict[str, Any]]) -> str:
    out = ["| rows | rev | chunk ms per process | median |", "|---|---|---|---|"]
    for r in rows:
        ms = ", ".join(f"{v:.3f}" for v in r["chunk_ms"])
        out.append(f"| {r['rows']} | {r['rev']} | {ms} | {r['median_chunk_ms']:.3f} |")
    return "\n".join(out)


def _roofline_figures(bench: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """roofline's figures by name: each part's ms a call per rows; per busy concurrency the GPU busy % and
    the idle seconds of each pair of kernels around gaps that the profile lists (a pair missing from a
    process's list idled less there than its last listed pair)."""
    for row in bench.get("rows", []):
        yield f"{row['part']} ms, {row['rows']} rows", row["ms_per_call"]
    for b in bench.get("busy", []):
        c = b["concurrency"]
        yield f"GPU busy %, c = {c}", 100 * b["gpu_busy_share"]
        for pair in b.get("gap_borders", []):
            yield f"idle s, c = {c}: {pair['before']} -> {pair['after']}", pair["s"]


def roofline_summary(runs: list[dict[str, Any]], revs: list[str]) -> list[dict[str, Any]]:
    """roofline's: per figure and rev, each process's value and their median (figures in the order run)."""
    cells: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        for name, value in _roofline_figures(run["bench"]):
            cells.setdefault((name, run["rev"]), []).append(value)
    names = list(dict.fromkeys(name for name, _ in cells))
    return [{"figure": name, "rev": rev, "values": cells[name, rev], "median": statistics.median(cells[name, rev])}
            for name in names for rev in revs if (name, rev) in cells]


def roofline_table(rows: list[dict[str, Any]]) -> str:
    out = ["| figure | rev | per process | median |", "|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['figure']} | {r['rev']} | {', '.join(f'{v:.3f}' for v in r['values'])} | {r['median']:.3f} |")
    return "\n".join(out)


def _roofline_line(row: dict[str, Any]) -> str:
    return f"  {row['figure']}: {row['values'][0]:.3f}"


def _bench_line(row: dict[str, Any]) -> str:
    return (f"  {row['mode']} c={row['concurrency']}: {row['audio_s_per_s'][0]:.1f} audio s/s, "
            f"TTFP {row['med_ttfp_ms'][0]:.1f} ms")


def _codec_line(row: dict[str, Any]) -> str:
    return f"  rows {row['rows']}: {row['chunk_ms'][0]:.3f} ms a chunk"


def _micro_line(row: dict[str, Any]) -> str:
    return (f"  {row['mode']} rows {row['rows']}: predictor frame {row['cp_ms'][0]:.3f} ms, "
            f"talker step {row['talker_ms'][0]:.3f} ms")


# per tool: its summary rows, their table, and one process's line per row
TOOLS: dict[str, tuple[Callable[..., list[dict[str, Any]]], Callable[..., str], Callable[..., str]]] = {
    "bench": (summary, table, _bench_line),
    "codec-bench": (codec_summary, codec_table, _codec_line),
    "microbench": (micro_summary, micro_table, _micro_line),
    "roofline": (roofline_summary, roofline_table, _roofline_line),
}


def run(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    if "--json" in bench_args:
        raise OmniTTSError("ab: give --json to ab, not to the tool (ab writes one JSON per process)")
    if len(set(args.revs)) != len(args.revs):
        raise OmniTTSError("ab: each revision once")
    compared = variants(args.revs, args.sets)
    labels = list(compared)
    with tempfile.TemporaryDirectory(prefix="omni-tts-ab-") as tmp:
        trees = {rev: unpack(rev, Path(tmp)) for rev in args.revs}  # every rev checked before any run
        head = {**provenance(), "tool": args.tool, "revs": args.revs, "sets": args.sets, "rounds": args.rounds,
                "bench_args": bench_args}
        runs: list[dict[str, Any]] = []
        for i, (r, label) in enumerate(order(labels, args.rounds)):
            say(f"round {r + 1}: {label}")
            rev, extra = compared[label]
            limit = args.first_timeout if i == 0 and args.first_timeout else args.timeout
            got = bench_once(trees[rev], bench_args, Path(tmp) / f"bench_{i}.json", limit, args.tool, extra)
            if "error" in got:
                say(f"  {label}: {got['error']}")
            runs.append({"round": r, "rev": label, "tree": rev, "set": extra[1::2], "bench": got})
            if args.json:  # a stopped comparison keeps the processes it finished
                write_json(args.json, {**head, "runs": runs, "complete": False})
            say_run(runs[-1], args.tool, say)
    summarise, tabulate, _ = TOOLS[args.tool]
    rows = summarise(runs, labels)
    print(tabulate(rows))
    return {**head, "runs": runs, "summary": rows, "complete": True}


def say_run(run: dict[str, Any], tool: str, say: Callable[[str], None]) -> None:
    """One line per row of a finished process."""
    summarise, _, line = TOOLS[tool]
    for row in summarise([run], [run["rev"]]):
        say(line(row))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--revs", nargs="+", required=True,
                    help=f"git revisions to compare ('{WORKING_TREE}': the checkout as it is; a folder holding an "
                         "omni_tts package: that package)")
    ap.add_argument("--tool", choices=tuple(TOOLS), default="bench",
                    help="what each process runs (default bench)")
    ap.add_argument("--sets", nargs="+", metavar="KEY=VALUE[,...]",
                    help="run each revision once per item, the tool given --set for each of its KEY=VALUE pairs "
                         "('-': none), e.g. --sets - kernel_configs=kc.json")
    ap.add_argument("--rounds", type=int, default=2, help="processes per revision, in alternating order")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per bench process")
    ap.add_argument("--first-timeout", type=float,
                    help="seconds for the first process instead (on a fresh machine it compiles every kernel cold)")
    ap.add_argument("--json", help="all runs' bench JSONs and the summary")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: the tool's own arguments")


def main(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise OmniTTSError("ab: --rounds must be at least 1")
    res = run_to_json(args, run)
    return 0 if all("error" not in r["bench"] for r in res["runs"]) else 1

