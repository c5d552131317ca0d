"""Where an action's motion comes from, and what it does: every BVH import notes its source on the action (custom
property `neural_ik_source`, a JSON string {"kind": "library", "file", "skeleton", "retargeted"}); an action without
the note is the user's own clip. Extraction stores the parsed note per action, the trainer weights and validates on
own clips. The task (idle, locomotion, reach) is the action's Neural IK task setting or the keywords of its name.
"""

import json

from ...neural_network.data.dataset import task_index

SOURCE_PROPERTY = "neural_ik_source"


def source_note(file_name, skeleton, retargeted):
    """The JSON string of action[SOURCE_PROPERTY]."""
    return json.dumps({"kind": "library", "file": file_name, "skeleton": skeleton, "retargeted": bool(retargeted)})


def mark_source(action, file_name, skeleton, retargeted):
    """Note on an imported action where it comes from."""
    action[SOURCE_PROPERTY] = source_note(file_name, skeleton, retargeted)


def action_source(action):
    """The parsed source note of an action, or {"kind": "own"} for the user's own clips (no note, or an unreadable
    one)."""
    raw = action.get(SOURCE_PROPERTY) if hasattr(action, "get") else None
    if isinstance(raw, str):
        try:
            note = json.loads(raw)
        except ValueError:
            note = None
        if isinstance(note, dict) and note.get("kind") == "library":
            return note
    return {"kind": "own"}


def action_task(action):
    """The task index of an action: its Neural IK task setting, or (AUTO) the keywords of its name."""
    return task_index(action.name, getattr(action, "neural_ik_task", "AUTO"))
