"""Line and bar charts as PNG files with nothing but NumPy and zlib (an extension cannot ship matplotlib).

The charts are for a person glancing at a training run: a loss curve with a legend and axis labels drawn in a tiny
built-in 3x5 pixel font, and a bar chart for per-joint errors. Files are written atomically.
"""

import math
import struct
import zlib

import numpy as np

from ..data.files import atomic_write_bytes

_GLYPHS = {   # 3x5 bitmaps, rows top to bottom, "1" = ink
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001010010010",
    "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
    ":": "000010000010000", "/": "001001010100100", " ": "000000000000000", "%": "101001010100101",
    "a": "010101111101101", "b": "110101110101110", "c": "011100100100011", "d": "110101101101110",
    "e": "111100110100111", "f": "111100110100100", "g": "011100101101011", "h": "101101111101101",
    "i": "111010010010111", "j": "001001001101010", "k": "101101110101101", "l": "100100100100111",
    "m": "101111111101101", "n": "110101101101101", "o": "010101101101010", "p": "110101110100100",
    "q": "010101101110011", "r": "110101110101101", "s": "011100010001110", "t": "111010010010010",
    "u": "101101101101111", "v": "101101101101010", "w": "101101111111101", "x": "101101010101101",
    "y": "101101010010010", "z": "111001010100111",
}
PALETTE = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14), (23, 190, 207))


def png_bytes(rgb):
    """(H, W, 3) uint8 -> PNG file bytes (8-bit RGB, no filtering)."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    h, w, _ = rgb.shape
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rgb.reshape(h, w * 3)], axis=1).tobytes()

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def write_png(path, rgb):
    data = png_bytes(rgb)
    atomic_write_bytes(path, lambda handle: handle.write(data))


class Canvas:
    def __init__(self, width, height):
        self.img = np.full((height, width, 3), 255, np.uint8)

    def rect(self, x0, y0, x1, y1, color):
        h, w, _ = self.img.shape
        x0, x1 = sorted((int(round(x0)), int(round(x1))))
        y0, y1 = sorted((int(round(y0)), int(round(y1))))
        self.img[max(y0, 0):min(y1 + 1, h), max(x0, 0):min(x1 + 1, w)] = color

    def line(self, x0, y0, x1, y1, color, width=1):
        steps = int(max(abs(x1 - x0), abs(y1 - y0), 1)) * 2
        xs = np.linspace(x0, x1, steps + 1)
        ys = np.linspace(y0, y1, steps + 1)
        h, w, _ = self.img.shape
        for dx in range(width):
            for dy in range(width):
                xi = np.clip(np.round(xs).astype(int) + dx - width // 2, 0, w - 1)
                yi = np.clip(np.round(ys).astype(int) + dy - width // 2, 0, h - 1)
                self.img[yi, xi] = color

    def text(self, x, y, string, color=(0, 0, 0), scale=2):
        for ch in str(string).lower():
            bits = _GLYPHS.get(ch, _GLYPHS[" "])
            for i, bit in enumerate(bits):
                if bit == "1":
                    r, c = divmod(i, 3)
                    self.rect(x + c * scale, y + r * scale, x + (c + 1) * scale - 1, y + (r + 1) * scale - 1, color)
            x += 4 * scale


def _fmt(value):
    if value == 0:
        return "0"
    if abs(value) >= 100 or abs(value) < 0.01:
        exponent = int(math.floor(math.log10(abs(value))))
        return f"{value / 10 ** exponent:.1f}e{exponent}"
    return f"{value:.3g}"


def loss_curve_png(path, x, series, log_y=True, width=560, height=320, title="training"):
    """Write a line chart of {name: values} over x (e.g. epochs); log_y for losses spanning decades."""
    c = Canvas(width, height)
    left, right, top, bottom = 70, width - 15, 30, height - 40
    x = np.asarray(x, np.float64)
    arrays = {k: np.asarray(v, np.float64) for k, v in series.items()}
    values = np.concatenate([v[np.isfinite(v)] for v in arrays.values()] or [np.array([1.0])])
    if log_y:
        values = values[values > 0]
    if len(values) == 0:
        values = np.array([1.0])
    transform = (lambda v: np.log10(np.maximum(v, 1e-12))) if log_y else (lambda v: v)
    lo, hi = float(transform(values.min())), float(transform(values.max()))
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    x_lo, x_hi = (float(x.min()), float(x.max())) if len(x) else (0.0, 1.0)
    if x_hi - x_lo < 1e-9:
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    px = lambda v: left + (v - x_lo) / (x_hi - x_lo) * (right - left)
    py = lambda v: bottom - (transform(v) - lo) / (hi - lo) * (bottom - top)
    grey = (200, 200, 200)
    for k in range(5):
        level = lo + (hi - lo) * k / 4
        y = bottom - (bottom - top) * k / 4
        c.line(left, y, right, y, grey)
        c.text(4, y - 5, _fmt(10 ** level if log_y else level))
    c.line(left, top, left, bottom, (0, 0, 0))
    c.line(left, bottom, right, bottom, (0, 0, 0))
    c.text(left, bottom + 8, _fmt(x_lo))
    c.text(right - 40, bottom + 8, _fmt(x_hi))
    c.text((left + right) // 2 - 20, bottom + 22, "epoch")
    c.text(left, 8, title)
    lx = left + 120
    for i, (name, v) in enumerate(arrays.items()):
        color = PALETTE[i % len(PALETTE)]
        ok = np.isfinite(v) & (v > 0 if log_y else True)
        xs, ys = x[ok], v[ok]
        for k in range(len(xs) - 1):
            c.line(px(xs[k]), py(ys[k]), px(xs[k + 1]), py(ys[k + 1]), color, width=2)
        if len(xs) == 1:
            c.rect(px(xs[0]) - 2, py(ys[0]) - 2, px(xs[0]) + 2, py(ys[0]) + 2, color)
        c.rect(lx, 10, lx + 10, 16, color)
        c.text(lx + 14, 8, name)
        lx += 14 + 8 * len(name) + 16
    write_png(path, c.img)


def bar_chart_png(path, labels, values, width=560, height=320, title="", unit=""):
    """Write a bar chart (e.g. error per joint); labels are drawn vertically-stacked under short bars."""
    c = Canvas(width, height)
    left, right, top, bottom = 70, width - 15, 30, height - 60
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    hi = float(finite.max()) if len(finite) and finite.max() > 0 else 1.0
    c.text(left, 8, f"{title} {unit}".strip())
    for k in range(5):
        y = bottom - (bottom - top) * k / 4
        c.line(left, y, right, y, (200, 200, 200))
        c.text(4, y - 5, _fmt(hi * k / 4))
    n = max(len(values), 1)
    slot = (right - left) / n
    for i, (label, v) in enumerate(zip(labels, values)):
        x0 = left + i * slot + slot * 0.15
        x1 = left + (i + 1) * slot - slot * 0.15
        if np.isfinite(v):
            c.rect(x0, bottom - v / hi * (bottom - top), x1, bottom, PALETTE[0])
        c.text(x0, bottom + 6 + (i % 3) * 14, str(label)[:max(int(slot * 3 / 8), 3)], scale=1 if slot < 24 else 2)
    c.line(left, bottom, right, bottom, (0, 0, 0))
    write_png(path, c.img)
