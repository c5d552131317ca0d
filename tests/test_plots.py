"""The loss and evaluation charts as SVG: parsed with xml.etree, every label present, no two labels overlapping.

Label boxes are measured with a real font: Blender's own UI font through `blf` (not the estimate the chart code
lays out with), turned by each label's own `transform`, and compared pairwise with the separating-axis test.
"""

import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

SVG = "{http://www.w3.org/2000/svg}"
NUMBER = re.compile(r"^−?[0-9]+(\.[0-9]+)?(×10[⁻]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+)?$|^−?10[⁻]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+$")
BANDAI_LIKE = ["dataset-1_walk_normal_001", "dataset-1_bow_tired_001", "dataset-2_raise-up-both-hands_feminine_002",
               "x", "dataset-1_run_normal_001", "dataset-2_wave-left-hand_not-confident_003", "dataset-1_dash_giant_002"]
METHODS = {"network": "network", "refined": "network + refinement", "blender_ik": "Blender IK, no poles",
           "blender_ik_poles": "Blender IK, poles from the reference"}


def measure(text, size):
    """(width, ascent, descent) of `text` at font size `size` in Blender's UI font."""
    import blf

    blf.size(0, 100)
    width, _height = blf.dimensions(0, text)
    return width * size / 100, 0.8 * size, 0.25 * size


def text_boxes(root):
    """[(element, text, corners)] of every <text> (its title child excluded), corners in document pixels."""
    boxes = []
    for el in root.iter(f"{SVG}text"):
        text = el.text or ""
        x, y, size = float(el.get("x")), float(el.get("y")), float(el.get("font-size"))
        width, ascent, descent = measure(text, size)
        if el.get("font-weight") == "bold":
            width *= 1.12
        x0 = {"start": 0.0, "middle": -width / 2, "end": -width}[el.get("text-anchor", "start")]
        corners = [(x0, -ascent), (x0 + width, -ascent), (x0 + width, descent), (x0, descent)]
        angle = 0.0
        match = re.match(r"rotate\(([-0-9.]+) ([-0-9.]+) ([-0-9.]+)\)", el.get("transform", ""))
        if match:
            angle, cx, cy = (float(v) for v in match.groups())
            assert (cx, cy) == (x, y), "labels turn about their own anchor"
        a = math.radians(angle)
        turned = [(x + dx * math.cos(a) - dy * math.sin(a), y + dx * math.sin(a) + dy * math.cos(a)) for dx, dy in corners]
        boxes.append((el, text, turned))
    return boxes


def overlap(p, q):
    """Whether two convex polygons overlap (separating-axis test; touching counts as apart)."""
    for poly in (p, q):
        for (x0, y0), (x1, y1) in zip(poly, poly[1:] + poly[:1]):
            nx, ny = y0 - y1, x1 - x0
            a = [nx * x + ny * y for x, y in p]
            b = [nx * x + ny * y for x, y in q]
            if max(a) <= min(b) + 1e-6 or max(b) <= min(a) + 1e-6:
                return False
    return True


def assert_no_overlaps(root):
    boxes = text_boxes(root)
    clashes = [(t1, t2) for i, (_e1, t1, p) in enumerate(boxes) for (_e2, t2, q) in boxes[i + 1:] if overlap(p, q)]
    assert not clashes, f"labels overlap: {clashes[:5]}"
    width, height = float(root.get("width")), float(root.get("height"))
    outside = [t for _e, t, poly in boxes if min(x for x, _ in poly) < -1 or max(x for x, _ in poly) > width + 1
               or min(y for _, y in poly) < -1 or max(y for _, y in poly) > height + 1]
    assert not outside, f"labels outside the picture: {outside}"
    return boxes


def labels(root, cls):
    return [el.text for el in root.iter(f"{SVG}text") if el.get("class") == cls]


def test_numbers_are_written_as_people_write_them():
    from neural_ik.neural_network.report.plot_svg import format_number

    assert format_number(200) == "200" and format_number(200.0, 50.0) == "200"
    assert format_number(0.05) == "0.05" and format_number(1500, 500) == "1500"
    assert format_number(0.5, 0.25) == "0.50" and format_number(0.75, 0.25) == "0.75"
    assert format_number(2e-5) == "2×10⁻⁵" and format_number(1e-4) == "10⁻⁴" and format_number(0) == "0"
    assert format_number(-3, 1) == "−3"


def test_loss_curve_of_200_epochs(addon, tmp_path):
    """The issue's case: 200 epochs read "200" (not "2.0E2"), the legend keeps '+' and ',', nothing overlaps."""
    from neural_ik.neural_network.report.plot_svg import loss_curve_svg

    epochs = np.arange(1, 201)
    names = ["train loss", "val effector, cm", "network + refinement, cm"]
    path = tmp_path / "loss.svg"
    loss_curve_svg(path, epochs, {names[0]: np.geomspace(3, 0.02, 200), names[1]: np.linspace(30, 4, 200),
                                  names[2]: np.linspace(20, 3, 200)})
    root = ET.parse(path).getroot()
    assert root.get("viewBox") == f"0 0 {root.get('width')} {root.get('height')}"
    assert labels(root, "legend") == names
    ticks_x, ticks_y = labels(root, "tick-x"), labels(root, "tick-y")
    assert "200" in ticks_x and "100" in ticks_x and len(ticks_x) >= 4
    assert len(ticks_y) >= 3 and {"1", "10"} <= set(ticks_y)
    assert all(NUMBER.match(t) for t in ticks_x + ticks_y), ticks_x + ticks_y
    assert labels(root, "title") == ["training"] and labels(root, "axis-label") == ["epoch"]
    assert len(list(root.iter(f"{SVG}polyline"))) == 3
    assert_no_overlaps(root)


@pytest.mark.parametrize("width, x, values", [
    (640, np.arange(1, 31), np.geomspace(1e-3, 1e-5, 30)),          # tiny losses: 10⁻⁵ .. 10⁻³
    (640, np.arange(1, 31), np.linspace(0.5, 0.3, 30)),             # inside one decade
    (320, np.arange(1, 1001), np.geomspace(50, 0.5, 1000)),        # narrow and long
    (1200, np.arange(1, 4), np.array([2.0, 2.0, 2.0])),             # flat
    (640, np.array([1]), np.array([0.7])),                          # one epoch
    (640, np.arange(1, 11), np.array([1, 0.5, np.nan, 0.3, 0.2, np.inf, 0.1, 0.1, 0.09, 0.08])),   # gaps
    (640, np.arange(1, 4), np.array([20.4, 2.6, 1.3])),             # the demo's 3 epochs: 1..9 would crowd 9 and 10
])
def test_loss_curves_of_any_range_keep_their_labels_apart(addon, tmp_path, width, x, values):
    from neural_ik.neural_network.report.plot_svg import loss_curve_svg

    path = tmp_path / "loss.svg"
    loss_curve_svg(path, x, {"train loss": values}, width=width)
    root = ET.parse(path).getroot()
    ticks_x, ticks_y = labels(root, "tick-x"), labels(root, "tick-y")
    assert len(ticks_y) >= 2 and len(ticks_x) >= 1, (ticks_x, ticks_y)
    assert all(NUMBER.match(t) for t in ticks_x + ticks_y), ticks_x + ticks_y
    assert_no_overlaps(root)


def evaluation_inputs(names, lengths, roles, seed=0):
    rng = np.random.default_rng(seed)
    actions = np.concatenate([np.full(k, i) for i, k in enumerate(lengths)])
    report = {"methods": METHODS, "clips": [{"name": n, "frames": int(k)} for n, k in zip(names, lengths)],
              "results": {m: {"per_role_cm": {r: float(rng.uniform(0.5, 12)) for r in roles}} for m in METHODS}}
    frames = {m: {"inner_cm": rng.uniform(0, 9, len(actions))} for m in METHODS}
    return report, frames, actions


def test_evaluation_chart_of_many_short_clips(addon, tmp_path):
    """The demo's case: 27 clips of one length, the first one's turned name must not run off the left edge."""
    from neural_ik.neural_network.report.plot_svg import evaluation_svg
    from neural_ik.neural_network.skeleton.roles import ROLES

    names = [f"{kind}_{n:02d}" for kind in ("reach_across_right_low", "grab_shelf_right", "crouch") for n in range(9)]
    path = tmp_path / "evaluation.svg"
    evaluation_svg(path, *evaluation_inputs(names, [90] * len(names), ROLES))
    root = ET.parse(path).getroot()
    assert len(labels(root, "category")) >= len(names) // 2 + len(ROLES)
    assert_no_overlaps(root)


@pytest.mark.parametrize("width", [1100, 700])
def test_evaluation_chart_names_clips_and_roles_without_overlap(addon, tmp_path, width):
    """Clip names as long as Bandai's (and one clip too short to name) under the frames chart, the 23 roles under
    the bars, a legend whose labels keep '+' and ','."""
    from neural_ik.neural_network.report.plot_svg import evaluation_svg
    from neural_ik.neural_network.skeleton.roles import ROLES

    lengths = [120, 60, 90, 3, 200, 150, 40]
    path = tmp_path / "evaluation.svg"
    evaluation_svg(path, *evaluation_inputs(BANDAI_LIKE, lengths, ROLES), width=width)
    root = ET.parse(path).getroot()
    assert labels(root, "legend") == list(METHODS.values())
    assert labels(root, "category")[-len(ROLES):] == list(ROLES)           # every role named, in order
    clip_labels = [el for el in root.iter(f"{SVG}text") if el.get("class") == "category"][:-len(ROLES)]
    shown = {}
    for el in clip_labels:
        title = el.find(f"{SVG}title")
        full = title.text if title is not None else el.text
        assert full in BANDAI_LIKE and (el.text == full or "…" in el.text), el.text
        shown[full] = el.text
    assert set(BANDAI_LIKE) - set(shown) <= {"x"}, shown          # only the 3-frame clip may go unnamed
    assert len(list(root.iter(f"{SVG}rect"))) >= len(ROLES) * len(METHODS)
    assert_no_overlaps(root)


def test_evaluation_chart_of_one_short_clip(addon, tmp_path):
    """The operator's own case (one clip, the roles a rig lacks missing from the table): still every label."""
    from neural_ik.neural_network.report.plot_svg import evaluation_svg
    from neural_ik.neural_network.skeleton.roles import ROLES

    roles = [r for r in ROLES if r not in ("Spine2", "NeckUpper")]
    path = tmp_path / "evaluation.svg"
    evaluation_svg(path, *evaluation_inputs(["Walker_walk"], [24], roles))
    root = ET.parse(path).getroot()
    assert labels(root, "category") == ["Walker_walk", *roles]
    assert_no_overlaps(root)


def test_the_overlap_check_sees_overlaps(addon):
    """Not vacuous: the font measures real widths, and labels that touch (side by side, or turned 45 degrees a few
    pixels apart) are caught."""
    from neural_ik.neural_network.report.plot_svg import Svg

    assert 15 < measure("200", 12)[0] < 30 and measure("WWWW", 12)[0] > measure("iiii", 12)[0] * 2
    side_by_side, turned, apart = Svg(300, 200), Svg(300, 200), Svg(300, 200)
    side_by_side.text(100, 50, "dataset-1_walk", 12, anchor="middle")
    side_by_side.text(150, 50, "dataset-1_run", 12, anchor="middle")
    turned.text(100, 50, "dataset-1_walk_normal", 11, anchor="end", angle=-45)
    turned.text(108, 50, "dataset-1_run_normal", 11, anchor="end", angle=-45)
    apart.text(100, 80, "dataset-1_walk_normal", 11, anchor="end", angle=-45)
    apart.text(125, 80, "dataset-1_run_normal", 11, anchor="end", angle=-45)
    for svg in (side_by_side, turned):
        with pytest.raises(AssertionError, match="overlap"):
            assert_no_overlaps(ET.fromstring(svg.to_string().split("\n", 1)[1]))
    assert_no_overlaps(ET.fromstring(apart.to_string().split("\n", 1)[1]))
