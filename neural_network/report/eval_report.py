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
