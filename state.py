"""Runtime state that is never saved in the .blend: the training run and the live IK sessions.

Training state crosses the thread wall through one small object: the worker thread writes numbers and reads the
cancel flag; a timer on the main thread reads the numbers and redraws the panel. No bpy data is touched from the
worker.
"""

import threading
from dataclasses import dataclass, field


@dataclass
class TrainingProgress:
    running: bool = False
    epoch: int = 0
    epochs: int = 0
    train_loss: float = float("nan")
    val_error_cm: float = float("nan")
    seconds_left: float = float("nan")
    message: str = ""
    history: list = field(default_factory=list)      # [{"epoch", "train_loss", "val_loss", ...}]
    best_metrics: dict = field(default_factory=dict)
    checkpoint_path: str = ""
    plot_path: str = ""
    cancel: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread = None
    val_inner_cm: float = float("nan")               # inner-joint MPJPE of the last validation
    elapsed: float = 0.0
    error: str = ""                                  # why the last run failed ("" when it did not)
    library: str = ""                                # with library "auto": which run was kept, both figures

    def reset(self, epochs):
        """Clear the numbers of a previous run before a new one starts (the object itself stays shared)."""
        self.running, self.epoch, self.epochs = True, 0, epochs
        self.train_loss = self.val_error_cm = self.val_inner_cm = self.seconds_left = float("nan")
        self.elapsed, self.message, self.error, self.library = 0.0, "preparing data", "", ""
        self.history, self.best_metrics = [], {}
        self.checkpoint_path = self.plot_path = ""
        self.cancel.clear()

    @property
    def fraction(self):
        return self.epoch / self.epochs if self.epochs else 0.0


training = TrainingProgress()

# Live IK sessions by armature object name, managed by operators/live.py.
live_sessions = {}


class LiveSettingsVersion:
    """Counts edits of the live settings (ground, contact, task, phase, refinement) on any armature: their RNA update
    callbacks bump it, so a live tick re-reads the panel values at once after an edit and otherwise only a slice
    per tick (values changed without an update callback, by a driver, arrive later: see LiveTick)."""
    value = 0


live_settings = LiveSettingsVersion()
