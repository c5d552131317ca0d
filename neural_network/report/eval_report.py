"""Evaluation results as text: the side-by-side table and the JSON written beside it."""

from ..data.files import save_json

COLUMNS = (     # (header with its unit, value, decimals)
    ("eff cm", lambda r: r["effector_cm"]["mean"], 3),
    ("p95 cm", lambda r: r["effector_cm"]["p95"], 3),
    ("eff deg", lambda r: r["effector_deg"]["mean"], 2),
    (">1cm %", lambda r: 100.0 * r["effector_miss_1cm"], 1),
    ("MPJPE cm", lambda r: r["mpjpe_cm"], 3),
    ("inner cm", lambda r: r["inner_mpjpe_cm"], 3),
    ("skate+ cm", lambda r: r["foot_skating_excess_cm"], 3),
    ("jitter+ cm", lambda r: r["jitter_cm"], 3),
    ("ms/frame", lambda r: r.get("seconds_per_frame", 0.0) * 1e3, 2),
)
def _cell(value, decimals):
    text = f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text     # no "-0.000"


def table(results, labels=None):
    """Plain-text table, one row per method: {method: summary dict}; units in the headers. eff: the effectors' mean
    and 95th-percentile miss and mean rotation error; >1cm %: frames where an effector misses by more than 1 cm;
    inner: MPJPE of the joints no target fixes; skate+ and jitter+: foot sliding and acceleration beyond the
    reference's (below 0 when less)."""
    labels = labels or {}
    names = [labels.get(m, m) for m in results]
    width = max([len("method")] + [len(n) for n in names])
    widths = [max(len(c), 6) for c, _, _ in COLUMNS]
    head = "method".ljust(width) + "".join(f"  {c:>{w}}" for (c, _, _), w in zip(COLUMNS, widths))
    lines = [head, "-" * len(head)]
    for name, result in zip(names, results.values()):
        cells = []
        for (_c, get, decimals), w in zip(COLUMNS, widths):
            try:
                cells.append(f"  {_cell(get(result), decimals):>{w}}")
            except (KeyError, TypeError):
                cells.append(f"  {'-':>{w}}")
        lines.append(name.ljust(width) + "".join(cells))
    return "\n".join(lines)


def write_json(path, report):
    save_json(path, report)


def evaluation_png(path, report, frames, actions, width=1100, height=720):
    """One PNG: inner-joint error over frames (clips side by side, one line per method, the clip boundaries
    marked) above grouped bars of the mean error per role and method."""
    import numpy as np

    from .plot_png import PALETTE, Canvas, _fmt, write_png

    c = Canvas(width, height)
    methods = list(report["results"])
    left, right = 70, width - 15
    # -- top: error over frames
    top, bottom = 40, height // 2 - 30
    series = {m: np.asarray(frames[m]["inner_cm"], np.float64) for m in methods}
    values = np.concatenate([v[np.isfinite(v)] for v in series.values()] or [np.ones(1)])
    hi = float(np.percentile(values, 99.5)) if values.size else 1.0
    hi = hi if hi > 0 else 1.0
    n = max(len(actions), 2)
    px = lambda i: left + i / (n - 1) * (right - left)
    py = lambda v: bottom - min(v, hi) / hi * (bottom - top)
    c.text(left, 6, "inner-joint error over frames, cm")
    for k in range(5):
        y = bottom - (bottom - top) * k / 4
        c.line(left, y, right, y, (215, 215, 215))
        c.text(4, y - 5, _fmt(hi * k / 4))
    cuts = np.flatnonzero(np.diff(actions)) + 1
    for cut in cuts:
        c.line(px(cut), top, px(cut), bottom, (150, 150, 150))
    clips = report.get("clips", [])
    starts = np.concatenate([[0], cuts])
    for s, clip in zip(starts, clips):
        c.text(px(s) + 2, bottom + 6, clip["name"][-18:], scale=1)
    for i, m in enumerate(methods):
        color, v = PALETTE[i % len(PALETTE)], series[m]
        step = max(1, len(v) // (right - left))
        idx = np.arange(0, len(v), step)
        for a, b in zip(idx[:-1], idx[1:]):
            if actions[a] == actions[b] and np.isfinite(v[a]) and np.isfinite(v[b]):
                c.line(px(a), py(v[a]), px(b), py(v[b]), color)
    lx = left + 300
    for i, m in enumerate(methods):
        label = report["methods"].get(m, m)
        c.rect(lx, 10, lx + 10, 16, PALETTE[i % len(PALETTE)])
        c.text(lx + 14, 8, label, scale=1)
        lx += 14 + 4 * len(label) + 16
    c.line(left, top, left, bottom, (0, 0, 0))
    c.line(left, bottom, right, bottom, (0, 0, 0))
    # -- bottom: grouped bars per role
    top, bottom = height // 2 + 30, height - 60
    roles = [r for r in report["results"][methods[0]]["per_role_cm"]]
    table_values = np.array([[report["results"][m]["per_role_cm"].get(r, np.nan) for m in methods] for r in roles])
    hi = float(np.nanmax(table_values)) if np.isfinite(table_values).any() else 1.0
    hi = hi if hi > 0 else 1.0
    c.text(left, top - 20, "mean error per role, cm")
    for k in range(5):
        y = bottom - (bottom - top) * k / 4
        c.line(left, y, right, y, (215, 215, 215))
        c.text(4, y - 5, _fmt(hi * k / 4))
    slot = (right - left) / max(len(roles), 1)
    bar = slot * 0.8 / max(len(methods), 1)
    for r, role in enumerate(roles):
        x0 = left + r * slot + slot * 0.1
        for i in range(len(methods)):
            v = table_values[r, i]
            if np.isfinite(v) and v > 0:
                c.rect(x0 + i * bar, bottom - v / hi * (bottom - top), x0 + (i + 1) * bar - 1, bottom,
                       PALETTE[i % len(PALETTE)])
        short = role.replace("Left", "L").replace("Right", "R").replace("Shoulder", "Sh").replace("ToeBase", "Toe")
        c.text(x0, bottom + 6 + (r % 3) * 10, short[:9], scale=1)
    c.line(left, bottom, right, bottom, (0, 0, 0))
    write_png(path, c.img)
