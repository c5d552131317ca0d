"""Bad input for a workflow, with a message meant for the user (operators report it as an ERROR and cancel)."""


class UserError(Exception):
    """A problem with what the user gave or chose, in plain words."""


class DataError(UserError, ValueError):
    """Bad input for BVH import or dataset extraction."""


class LiveError(UserError):
    """Bad input for live IK, model loading, export or bake."""


class EvaluationError(UserError):
    """Bad input for an evaluation run."""


class LiveStopped(Exception):
    """The live session cannot go on (a deleted armature, target or ground, ...); the message says why, in plain
    words."""
