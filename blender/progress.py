"""What long work prints where no window shows a progress bar (background mode: the CLI, `blender -b`).

A ProgressLine is one line that updates in place in a terminal (carriage return, at most a few times a second),
a line every few seconds when the output is a file or a pipe, and every step on a line of its own with `verbose`
(the CLI's --verbose). `say` prints a result line; `detail` prints only with verbose. The CLI points `Console.stream`
at its own stdout (while it keeps Blender's report lines out of it); otherwise output goes to sys.stdout.
"""

import shutil
import sys
import time

INTERVAL = 10.0         # seconds between lines when the output is not a terminal
TTY_INTERVAL = 0.1      # seconds between redraws of the line in a terminal


class Console:
    stream = None       # None: sys.stdout at the time of writing
    verbose = False


def output():
    return Console.stream or sys.stdout


def say(text):
    """A line of result, always printed."""
    stream = output()
    stream.write(text + "\n")
    stream.flush()


def detail(text):
    """A line printed only with verbose."""
    if Console.verbose:
        say(text)


def is_terminal(stream):
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def duration(seconds):
    """'42 s', '3 min 05 s', '1 h 02 min' (or '?' when not known)."""
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class ProgressLine:
    """One updating line of progress. update(text, detail) per step; done(text) at the end (it leaves the final text
    on a line of its own). With verbose every step prints its detail line (default: its text) instead."""

    def __init__(self, stream=None, interval=INTERVAL, clock=time.monotonic):
        self.stream = stream or output()
        self.terminal = is_terminal(self.stream)
        self.interval = TTY_INTERVAL if self.terminal else interval
        self.clock = clock
        self.last = None            # when a line was last written
        self.pending = ""           # the newest text not yet written
        self.shown = ""             # the text on screen (terminal) or last printed
        self.open = False           # a terminal line without its newline yet

    def update(self, text, detail=None):
        if Console.verbose:
            self._line(detail or text)
            return
        now = self.clock()
        if self.last is not None and now - self.last < self.interval:
            self.pending = text
            return
        self.last, self.pending = now, ""
        if self.terminal:
            self._redraw(text)
        else:
            self._line(text)

    def done(self, text=None):
        """Write the final text (default: the newest step not yet shown) and end the line."""
        final = text or self.pending
        if Console.verbose:
            if text:
                self._line(text)
            return
        if self.terminal:
            if final:
                self._redraw(final)
            if self.open:
                self.stream.write("\n")
                self.stream.flush()
                self.open = False
        elif final and final != self.shown:
            self._line(final)
        self.pending = ""

    def _redraw(self, text):
        width = max(shutil.get_terminal_size((100, 24)).columns - 1, 20)
        text = text[:width]
        self.stream.write("\r" + text + " " * max(len(self.shown) - len(text), 0))
        self.stream.flush()
        self.shown, self.open = text, True

    def _line(self, text):
        if self.open:
            self.stream.write("\n")
            self.open = False
        self.stream.write(text + "\n")
        self.stream.flush()
        self.shown = text
