"""blender.progress: one line that updates in a terminal, a line every few seconds in a file or pipe, every step with
verbose (no Blender needed, a stand-in clock)."""

import io

import pytest

from neural_ik.blender.progress import Console, ProgressLine, duration


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture(autouse=True)
def quiet():
    saved = Console.verbose
    Console.verbose = False
    yield
    Console.verbose = saved


def _steps(line, clock, count, seconds):
    for i in range(1, count + 1):
        line.update(f"epoch {i}/{count}", detail=f"epoch {i} in detail")
        clock.now += seconds


def test_a_terminal_gets_one_line_that_updates():
    stream, clock = Terminal(), Clock()
    line = ProgressLine(stream, clock=clock)
    _steps(line, clock, 200, 0.03)        # faster than the line redraws (at most 10 times a second)
    line.done()
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")              # one line, ended once
    assert text.startswith("\repoch 1/200") and "\repoch 200/200" in text   # the final step is shown
    assert 40 <= text.count("\r") <= 70          # a redraw at most every 0.1 s


def test_a_file_gets_a_line_every_few_seconds_and_the_last_step():
    stream, clock = io.StringIO(), Clock()
    line = ProgressLine(stream, interval=10.0, clock=clock)
    _steps(line, clock, 200, 0.37)        # 74 s
    line.done()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines[0] == "epoch 1/200" and lines[-1] == "epoch 200/200"
    assert 7 <= len(lines) <= 10


def test_verbose_prints_every_detail_line():
    Console.verbose = True
    stream, clock = Terminal(), Clock()
    line = ProgressLine(stream, clock=clock)
    _steps(line, clock, 5, 0.01)
    line.done("finished")
    assert stream.getvalue().splitlines() == [f"epoch {i} in detail" for i in range(1, 6)] + ["finished"]


def test_done_with_a_final_text_ends_the_terminal_line():
    stream, clock = Terminal(), Clock()
    line = ProgressLine(stream, clock=clock)
    line.update("evaluating: clip 1 of 3")
    line.done("evaluated 3 clips in 4 s")
    assert stream.getvalue() == "\revaluating: clip 1 of 3\revaluated 3 clips in 4 s\n"


def test_durations_read_as_people_say_them():
    assert [duration(s) for s in (4.4, 65, 3725, float("nan"))] == ["4 s", "1 min 05 s", "1 h 02 min", "?"]
