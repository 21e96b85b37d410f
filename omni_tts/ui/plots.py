"""The engine panel's plots as inline SVG: one point per request, coloured by its mode, with a legend.

Owns: the drawing of a visitor's TTFP and RTF history (whole-number request axis, padded value axis,
every mode's colour fixed up front so the first point of a mode is as visible as the rest, a hover
title per point). Drawn on the server as a string, so what the browser shows is exactly what the
tests read. Pure Python: knows nothing about Gradio or the engine.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping
from typing import Any

from omni_tts.ui.formatting import MODE_COLORS, MODES

W, H = 440, 190
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 28, 58  # plot-area margins (the legend sits below the x axis)


def _nice_step(span: float, ticks: int = 4) -> float:
    """A 1 / 2 / 5 x 10^k step giving about `ticks` intervals over `span`."""
    raw = max(span, 1e-9) / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _fmt(v: float, step: float) -> str:
    return f"{v:.0f}" if step >= 1 else f"{v:.{max(0, -math.floor(math.log10(step)))}f}"


def scatter_svg(history: Iterable[Mapping[str, Any]], key: str, title: str, unit: str = "") -> str:
    """An SVG scatter of `key` against the request number, one colour per mode, legend of every mode."""
    rows = [r for r in history if r.get(key) is not None]
    xs = [int(r["request"]) for r in rows]
    x0 = (min(xs) - 1) if xs else 0
    x1 = max(x0 + 10, (max(xs) + 1) if xs else 10)
    top = max((float(r[key]) for r in rows), default=1.0) * 1.15 or 1.0
    ystep = _nice_step(top)
    ymax = math.ceil(top / ystep) * ystep
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return TOP + ph - y / ymax * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="100%" role="img" '
           f'aria-label="{html.escape(title)}" font-family="sans-serif" font-size="11">',
           f'<text x="{W / 2}" y="16" text-anchor="middle" font-size="13" font-weight="600">'
           f'{html.escape(title)}</text>']
    xstep = max(1, int(_nice_step(x1 - x0, 10)))
    for x in range(x0 + (-x0) % xstep, x1 + 1, xstep):  # whole request numbers only
        out.append(f'<line x1="{px(x):.1f}" y1="{TOP}" x2="{px(x):.1f}" y2="{TOP + ph}" stroke="#e5e7eb"/>'
                   f'<text x="{px(x):.1f}" y="{TOP + ph + 14}" text-anchor="middle" class="xtick">{x}</text>')
    y = 0.0
    while y <= ymax + 1e-9:
        out.append(f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{LEFT + pw}" y2="{py(y):.1f}" stroke="#e5e7eb"/>'
                   f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{_fmt(y, ystep)}</text>')
        y += ystep
    out.append(f'<text x="{LEFT + pw / 2}" y="{TOP + ph + 28}" text-anchor="middle">request #</text>')
    for r in rows:
        color = MODE_COLORS.get(r["mode"], "#111827")
        label = f"#{r['request']} {r['mode']}: {float(r[key]):g}{unit}"
        out.append(f'<circle class="point" data-mode="{html.escape(r["mode"])}" cx="{px(r["request"]):.1f}" '
                   f'cy="{py(float(r[key])):.1f}" r="4.5" fill="{color}" stroke="white" stroke-width="1">'
                   f'<title>{html.escape(label)}</title></circle>')
    lx = LEFT
    for mode in MODES:  # every mode in the legend from the start, so colours never shift
        out.append(f'<circle cx="{lx + 5}" cy="{H - 10}" r="4.5" fill="{MODE_COLORS[mode]}"/>'
                   f'<text x="{lx + 13}" y="{H - 6}" class="legend">{mode}</text>')
        lx += 13 + 6.2 * len(mode) + 14
    out.append("</svg>")
    return "".join(out)
