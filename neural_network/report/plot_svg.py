"""Line and bar charts as SVG files, in pure Python (an extension cannot ship matplotlib).

Text is real SVG `<text>` in the viewer's own sans-serif font, so the charts stay legible at any size. Nothing here
can measure a font, so every label's box is estimated generously (`CHAR_EM` of the font size per character, a line
height of `LINE_EM`) and the layout only ever places labels whose estimated boxes keep a gap: tick counts are
thinned until the labels fit, long category names are rotated and abbreviated, and a label that would still touch
its neighbour is left out. Numbers are written as people write them ("200", "0.05", "2×10⁻⁵"). Files are written
atomically.
"""

import math
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from ..data.files import atomic_write_bytes

FONT = "DejaVu Sans, Verdana, Arial, Helvetica, sans-serif"
CHAR_EM = 0.66      # estimated advance of one character, in font sizes (digits are 0.64 in DejaVu Sans and in
                    # Blender's UI font, mixed-case names ~0.5)
LINE_EM = 1.2       # estimated height of a line of text, in font sizes
GAP = 6.0           # pixels kept free between two labels
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")
GRID, AXIS, INK, MUTED = "#dddddd", "#333333", "#222222", "#666666"
SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


# ---- numbers -------------------------------------------------------------------------------------------------


def format_number(value, step=None):
    """A tick value as people write it: "200", "0.05", "1.5", "2×10⁻⁵" (only far outside 0.001..1e6).
    step: the tick spacing, which decides the decimals (0.25 steps show 0.25, 0.5, 0.75)."""
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    magnitude = abs(value)
    if magnitude < 1e-3 or magnitude >= 1e6:
        exponent = math.floor(math.log10(magnitude))
        mantissa = value / 10 ** exponent
        if abs(mantissa - round(mantissa)) < 1e-6:
            mantissa = round(mantissa)
        head = "" if mantissa == 1 else "−" if mantissa == -1 else f"{mantissa:g}×".replace("-", "−")
        return f"{head}10{str(exponent).translate(SUPERSCRIPT)}"
    reference = abs(step) if step else magnitude
    decimals = 0
    while decimals < 6 and abs(round(reference, decimals) - reference) > 1e-9 * max(reference, 1e-12):
        decimals += 1
    if not step:
        decimals = max(decimals, 0) if magnitude >= 1 else min(max(decimals, 1), 4)
    text = f"{value:.{decimals}f}"
    return text.replace("-", "−")


def nice_step(span, count):
    """The 1-2-5 step that cuts `span` into about `count` intervals (never fewer than `count` would give)."""
    raw = span / max(count, 1)
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    base = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if mult * base >= raw - 1e-12 * base:
            return mult * base
    return 10 * base


def linear_ticks(lo, hi, count, integer=False):
    """Values of about `count` 1-2-5 ticks inside [lo, hi] (whole numbers only when integer)."""
    step = nice_step(hi - lo, count)
    if integer:
        step = max(1.0, round(step)) if step >= 1 else 1.0
    first = math.ceil(lo / step - 1e-9)
    values = []
    k = first
    while k * step <= hi + 1e-9 * max(abs(hi), step):
        values.append(round(k * step, 12))
        k += 1
    return values, step


def log_ticks(lo, hi):
    """Candidate tick sets for a log axis over [lo, hi] (positive values), densest last: decades, then 1-2-5 per
    decade, then every integer multiple. Each is (values, step-for-formatting or None)."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    sets = []
    for mults in ((1,), (1, 2, 5), (1, 2, 3, 4, 5, 6, 7, 8, 9)):
        values = [m * 10.0 ** e for e in range(first, last + 1) for m in mults]
        sets.append([v for v in values if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)])
    return sets


# ---- text boxes ----------------------------------------------------------------------------------------------


def text_width(text, size):
    return len(text) * size * CHAR_EM


def abbreviate(text, chars):
    """`text` cut to `chars` characters with an ellipsis in the middle (the ends of clip names say the most)."""
    if len(text) <= chars:
        return text
    if chars <= 1:
        return text[:chars]
    head = (chars - 1) // 2
    tail = chars - 1 - head
    return text[:head] + "…" + (text[-tail:] if tail else "")


def _spacing_fits(positions, size, width_of, angle):
    """Whether labels anchored at these x positions (same baseline) keep GAP between their estimated boxes when
    rotated by `angle` degrees (0: horizontal and centred; otherwise they all turn the same way, so two neighbours
    are clear when their anchors are a line height apart across the text direction or a text length along it)."""
    for (x0, w0), (x1, w1) in zip(zip(positions, width_of), zip(positions[1:], width_of[1:])):
        dx = x1 - x0
        if angle == 0:
            if dx < (w0 + w1) / 2 + GAP:
                return False
        else:
            across = dx * math.sin(math.radians(abs(angle)))
            along = dx * math.cos(math.radians(abs(angle)))
            if across < size * LINE_EM + GAP * 0.5 and along < max(w0, w1) + GAP:
                return False
    return True


def thin_labels(positions, labels, size, angle=0.0):
    """Indices of the labels to draw, left to right, such that no two drawn labels' boxes come within GAP: each is
    kept when it clears the last one kept (the first is always kept)."""
    kept = []
    for i, (x, label) in enumerate(zip(positions, labels)):
        if kept and not _spacing_fits([positions[kept[-1]], x], size,
                                      [text_width(labels[kept[-1]], size), text_width(label, size)], angle):
            continue
        kept.append(i)
    return kept


# ---- the document --------------------------------------------------------------------------------------------


class Svg:
    """An SVG document built element by element; `classes` on text name what a label is (tick-x, tick-y, legend,
    category, title) so a reader (or a test) can find them."""

    def __init__(self, width, height):
        self.width, self.height = int(math.ceil(width)), int(math.ceil(height))
        self.parts = []

    def line(self, x0, y0, x1, y1, color=AXIS, width=1.0, dash=None):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" stroke="{color}" '
                          f'stroke-width="{width:g}"{extra}/>')

    def rect(self, x0, y0, x1, y1, color, title=None):
        x, y = min(x0, x1), min(y0, y1)
        body = f"<title>{escape(title)}</title>" if title else ""
        self.parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{abs(x1 - x0):.1f}" height="{abs(y1 - y0):.1f}" '
                          f'fill="{color}">{body}</rect>')

    def polyline(self, points, color, width=1.5):
        if len(points) < 2:
            return
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="{width:g}" '
                          f'stroke-linejoin="round"/>')

    def circle(self, x, y, r, color):
        self.parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:g}" fill="{color}"/>')

    def text(self, x, y, string, size=12, anchor="start", angle=0.0, cls="", color=INK, weight=None, full=None):
        """A label with its baseline at y; angle turns it about its anchor (negative: counter-clockwise, reading
        upwards). full: the whole text as a tooltip when the label is abbreviated."""
        attrs = [f'x="{x:.1f}"', f'y="{y:.1f}"', f'font-size="{size:g}"', f'text-anchor="{anchor}"', f'fill="{color}"']
        if angle:
            attrs.append(f'transform="rotate({angle:g} {x:.1f} {y:.1f})"')
        if cls:
            attrs.append(f"class={quoteattr(cls)}")
        if weight:
            attrs.append(f'font-weight="{weight}"')
        body = escape(string) + (f"<title>{escape(full)}</title>" if full and full != string else "")
        self.parts.append(f"<text {' '.join(attrs)}>{body}</text>")

    def to_string(self):
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
                f'viewBox="0 0 {self.width} {self.height}" font-family={quoteattr(FONT)}>')
        background = f'<rect x="0" y="0" width="{self.width}" height="{self.height}" fill="#ffffff"/>'
        return "\n".join(['<?xml version="1.0" encoding="UTF-8"?>', head, background, *self.parts, "</svg>"]) + "\n"

    def write(self, path):
        data = self.to_string().encode("utf-8")
        atomic_write_bytes(path, lambda handle: handle.write(data))


# ---- axes ----------------------------------------------------------------------------------------------------


class Axes:
    """A plot area [left, right] x [top, bottom] in pixels with data ranges; log_y maps values through log10."""

    def __init__(self, svg, left, top, right, bottom, x_range, y_range, log_y=False, size=12):
        self.svg, self.left, self.top, self.right, self.bottom = svg, left, top, right, bottom
        self.x_lo, self.x_hi = x_range
        self.log_y, self.size = log_y, size
        lo, hi = y_range
        self.y_lo, self.y_hi = (math.log10(lo), math.log10(hi)) if log_y else (lo, hi)

    def px(self, x):
        return self.left + (x - self.x_lo) / (self.x_hi - self.x_lo) * (self.right - self.left)

    def py(self, y):
        v = math.log10(max(y, 1e-300)) if self.log_y else y
        return self.bottom - (v - self.y_lo) / (self.y_hi - self.y_lo) * (self.bottom - self.top)

    def frame(self):
        self.svg.line(self.left, self.top, self.left, self.bottom, AXIS)
        self.svg.line(self.left, self.bottom, self.right, self.bottom, AXIS)

    def y_ticks(self, unit=""):
        """Horizontal grid lines and their labels, as many as fit a line height apart (at least two)."""
        height = self.bottom - self.top
        room = max(2, int(height // (self.size * LINE_EM + GAP)))
        if self.log_y:      # ticks crowd towards each decade's top: the densest set whose neighbours all clear
            lo, hi = 10 ** self.y_lo, 10 ** self.y_hi
            chosen = None
            for values in log_ticks(lo, hi):
                if len(values) > room or not self._rows_clear(values):
                    break
                if len(values) >= 2 or chosen is None:
                    chosen = values
            if chosen is None or len(chosen) < 2:
                values, _step = linear_ticks(lo, hi, min(room, 5))
                chosen = [v for v in values if v > 0] or [lo, hi]
            chosen = self._thin_rows(chosen)
            labels = [format_number(v) for v in chosen]
        else:
            count = min(room, 6)
            while True:
                chosen, step = linear_ticks(self.y_lo, self.y_hi, count)
                if len(chosen) <= room or count <= 2:
                    break
                count -= 1
            chosen = self._thin_rows(chosen)
            labels = [format_number(v, step) for v in chosen]
        for value, label in zip(chosen, labels):
            y = self.py(value)
            self.svg.line(self.left, y, self.right, y, GRID)
            self.svg.text(self.left - 6, y + self.size * 0.35, label, self.size, anchor="end", cls="tick-y")
        return max((text_width(lbl, self.size) for lbl in labels), default=0.0)

    def _rows_clear(self, values):
        ys = sorted(self.py(v) for v in values)
        return all(b - a >= self.size * LINE_EM + 2 for a, b in zip(ys, ys[1:]))

    def _thin_rows(self, values):
        """values whose labels keep a line height apart, from the bottom up (a safety net for any tick set)."""
        kept = []
        for v in sorted(values):
            if not kept or abs(self.py(kept[-1]) - self.py(v)) >= self.size * LINE_EM + 2:
                kept.append(v)
        return kept

    def x_ticks(self, integer=False):
        """Numeric ticks along the bottom, thinned until the widest label fits its slot with a gap."""
        count = 10
        while True:
            values, step = linear_ticks(self.x_lo, self.x_hi, count, integer=integer)
            labels = [format_number(v, step) for v in values]
            positions = [self.px(v) for v in values]
            widths = [text_width(lbl, self.size) for lbl in labels]
            if count <= 1 or _spacing_fits(positions, self.size, widths, 0):
                break
            count -= 1
        keep = thin_labels(positions, labels, self.size) if count <= 1 else range(len(values))
        for i in keep:
            self.svg.line(positions[i], self.bottom, positions[i], self.bottom + 4, AXIS)
            self.svg.text(positions[i], self.bottom + 6 + self.size, labels[i], self.size, anchor="middle",
                          cls="tick-x")


def legend(svg, x, y, right, names, size=12):
    """Swatches and names in rows from (x, y) that wrap before `right`; returns the y below the last row."""
    cursor, baseline = x, y
    for i, name in enumerate(names):
        item = 14 + 5 + text_width(name, size) + 16
        if cursor > x and cursor + item > right:
            cursor, baseline = x, baseline + size * LINE_EM + 4
        svg.rect(cursor, baseline - size * 0.8, cursor + 14, baseline - size * 0.8 + 10, PALETTE[i % len(PALETTE)])
        svg.text(cursor + 19, baseline, name, size, cls="legend")
        cursor += item
    return baseline + size * 0.4


def _fit_flat(names, slots, size):
    slots = list(slots) if isinstance(slots, (list, tuple)) else [slots] * len(names)
    return bool(names) and all(text_width(n, size) + GAP <= s for n, s in zip(names, slots))


def category_labels(svg, centers, names, baseline, slots, size=11, max_chars=32):
    """Category names under an axis, centred on `centers`: horizontal when every name fits its slot (a width, or
    one per name), otherwise turned 45 degrees (90 when that keeps more of them), abbreviated to `max_chars` (or
    shorter where a label would run off the left edge) and thinned so no two overlap. Returns the depth the labels
    take below `baseline`."""
    names = [str(n) for n in names]
    if _fit_flat(names, slots, size):
        for x, name in zip(centers, names):
            svg.text(x, baseline + size, name, size, anchor="middle", cls="category")
        return size * LINE_EM
    def turned(angle):
        """Names abbreviated to max_chars, and shorter where a turned label would run off the picture's left edge."""
        spread = math.cos(math.radians(angle)) * size * CHAR_EM
        return [abbreviate(n, max_chars if spread < 1e-9 else max(1, min(max_chars, int((x + size * 0.3 - 4) / spread))))
                for x, n in zip(centers, names)]

    angle, shown, keep = max(((a, turned(a), thin_labels(list(centers), turned(a), size, a)) for a in (-45.0, -90.0)),
                             key=lambda choice: len(choice[2]))     # 45 degrees unless 90 keeps more names
    depth = 0.0
    for i in keep:
        x, y = centers[i] + size * 0.3, baseline + 4
        svg.text(x, y, shown[i], size, anchor="end", angle=angle, cls="category", full=names[i])
        depth = max(depth, text_width(shown[i], size) * math.sin(math.radians(abs(angle))) + size)
    return depth


# ---- charts --------------------------------------------------------------------------------------------------


def _finite(values, positive=False):
    out = []
    for v in values:
        try:
            v = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v) and (v > 0 or not positive):
            out.append(v)
    return out


def loss_curve_svg(path, x, series, log_y=True, width=640, height=360, title="training", x_label="epoch"):
    """Write a line chart of {name: values} over x (e.g. epochs); log_y for losses spanning decades."""
    size = 12
    xs = [float(v) for v in x]
    arrays = {name: list(values) for name, values in series.items()}
    values = [v for vals in arrays.values() for v in _finite(vals, positive=log_y)] or [1.0]
    lo, hi = min(values), max(values)
    if log_y:
        lo, hi = lo / 1.15, hi * 1.15
    else:
        pad = (hi - lo) * 0.05 or 0.5
        lo, hi = lo - pad, hi + pad
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_hi - x_lo < 1e-9:
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    svg = Svg(width, height)
    svg.text(16, 22, title, 14, cls="title", weight="bold")
    legend_bottom = legend(svg, 16, 44, width - 16, list(arrays), size)
    # the y labels' width decides the left margin: measure them on a throwaway axis first
    probe = Axes(Svg(1, 1), 0, legend_bottom + 10, 10, height - 48, (x_lo, x_hi), (lo, hi), log_y, size)
    left = 16 + probe.y_ticks() + 8
    axes = Axes(svg, left, legend_bottom + 10, width - 20, height - 48, (x_lo, x_hi), (lo, hi), log_y, size)
    axes.y_ticks()
    axes.x_ticks(integer=all(float(v).is_integer() for v in xs))
    axes.frame()
    svg.text((axes.left + axes.right) / 2, height - 10, x_label, size, anchor="middle", cls="axis-label")
    for i, vals in enumerate(arrays.values()):
        color = PALETTE[i % len(PALETTE)]
        runs = [[]]
        for xv, v in zip(xs, vals):
            ok = _finite([v], positive=log_y)
            if ok:
                runs[-1].append((axes.px(xv), axes.py(ok[0])))
            elif runs[-1]:
                runs.append([])
        for run in runs:
            if len(run) == 1:
                svg.circle(*run[0], 2.5, color)
            svg.polyline(run, color)
    svg.write(path)
    return svg


def evaluation_svg(path, report, frames, actions, width=1100):
    """One SVG: inner-joint error over frames (clips side by side, one line per method, the clip boundaries marked
    and the clips named under them) above grouped bars of the mean error per role and method. Text is real text
    so it reads at any size."""
    size = 12
    methods = list(report["results"])
    labels = [report["methods"].get(m, m) for m in methods]
    actions = np.asarray(actions)
    n = max(len(actions), 2)
    series = {m: np.asarray(frames[m]["inner_cm"], np.float64) for m in methods}
    values = np.concatenate([v[np.isfinite(v)] for v in series.values()] or [np.ones(1)])
    top_hi = float(np.percentile(values, 99.5)) if values.size else 1.0
    top_hi = top_hi if top_hi > 0 else 1.0
    roles = list(report["results"][methods[0]]["per_role_cm"])
    bars = np.array([[report["results"][m]["per_role_cm"].get(r, np.nan) for m in methods] for r in roles], float)
    bars = bars.reshape(len(roles), len(methods))
    bar_hi = float(np.nanmax(bars)) if np.isfinite(bars).any() else 1.0
    bar_hi = bar_hi if bar_hi > 0 else 1.0
    # -- layout: the left margin fits the widest y label of both charts; label bands fit the clip and role names
    probe = Svg(1, 1)
    y_width = max(Axes(probe, 0, 0, 10, 220, (0, 1), (0, top_hi * 1.02), size=size).y_ticks(),
                  Axes(probe, 0, 0, 10, 200, (0, 1), (0, bar_hi * 1.05), size=size).y_ticks())
    left, right = 16 + y_width + 8, width - 20
    cuts = np.flatnonzero(np.diff(actions)) + 1 if len(actions) else np.zeros(0, int)
    starts = np.concatenate([[0], cuts]).astype(float)
    ends = np.concatenate([cuts, [len(actions)]]).astype(float)
    clips = [c["name"] for c in report.get("clips", [])][:len(starts)]
    px = lambda i: left + i / (n - 1) * (right - left)
    clip_centers = [(px(s) + px(max(e - 1, s))) / 2 for s, e in zip(starts, ends)][:len(clips)]
    clip_slots = [max(px(max(e - 1, s)) - px(s), 1.0) for s, e in zip(starts, ends)][:len(clips)]
    role_slot = (right - left) / max(len(roles), 1)
    role_centers = [left + (r + 0.5) * role_slot for r in range(len(roles))]
    svg = Svg(width, 1)
    svg.text(16, 24, "Inner-joint error over frames, cm (held-out clips side by side)", 14, cls="title", weight="bold")
    y = legend(svg, 16, 48, right, labels, size)
    top, bottom = y + 12, y + 12 + 240
    axes = Axes(svg, left, top, right, bottom, (0, n - 1), (0, top_hi * 1.02), size=size)
    axes.y_ticks()
    for cut in cuts:
        svg.line(px(cut), top, px(cut), bottom, MUTED, dash="4 3")
    for i, m in enumerate(methods):
        v = series[m]
        step = max(1, len(v) // int(right - left))
        for s, e in zip(starts.astype(int), ends.astype(int)):
            idx = np.arange(s, e, step)
            points = [(px(k), axes.py(min(v[k], top_hi * 1.02))) for k in idx if k < len(v) and np.isfinite(v[k])]
            svg.polyline(points, PALETTE[i % len(PALETTE)], width=1.2)
    axes.frame()
    depth = category_labels(svg, clip_centers, clips, bottom, clip_slots, size=11)
    # -- bottom: grouped bars per role
    top = bottom + depth + 2 * size * LINE_EM + 16
    svg.text(16, top - size * LINE_EM - 4, "Mean error per role, cm", 14, cls="title", weight="bold")
    bottom = top + 220
    axes = Axes(svg, left, top, right, bottom, (0, 1), (0, bar_hi * 1.05), size=size)
    axes.y_ticks()
    bar = role_slot * 0.8 / max(len(methods), 1)
    for r, role in enumerate(roles):
        x0 = left + r * role_slot + role_slot * 0.1
        for i, label in enumerate(labels):
            v = bars[r, i]
            if np.isfinite(v) and v > 0:
                svg.rect(x0 + i * bar, axes.py(v), x0 + (i + 1) * bar - 1, bottom, PALETTE[i % len(PALETTE)],
                         title=f"{role}, {label}: {v:.2f} cm")
    axes.frame()
    depth = category_labels(svg, role_centers, roles, bottom, role_slot, size=11)
    svg.height = int(math.ceil(bottom + depth + 16))
    svg.write(path)
    return svg
