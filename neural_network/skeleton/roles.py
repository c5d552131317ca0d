"""The 23 bone roles the network controls, and the fixed layout built on them.

Everything after the bone map speaks roles, never bone names. The order here is the order of every
(N, 23, ...) array in the project: datasets, checkpoints, ONNX outputs and the JSON sidecar.
"""

ROLES = (
    "Hips", "Spine", "Spine1", "Spine2", "NeckLower", "NeckUpper", "Head",
    "LeftShoulder", "LeftArm", "LeftForeArm", "LeftHand",
    "RightShoulder", "RightArm", "RightForeArm", "RightHand",
    "LeftThigh", "LeftShin", "LeftFoot", "LeftToeBase",
    "RightThigh", "RightShin", "RightFoot", "RightToeBase",
)
NUM_ROLES = len(ROLES)
ROLE_INDEX = {name: i for i, name in enumerate(ROLES)}

# Parent of each role in the ideal humanoid chain (-1 for the hips). On a real rig a role may be missing
# (the Bandai rig has no Spine2 and one neck bone); the Skeleton then links a role to its nearest mapped ancestor.
ROLE_PARENTS = (
    -1, 0, 1, 2, 3, 4, 5,
    3, 7, 8, 9,
    3, 11, 12, 13,
    0, 15, 16, 17,
    0, 19, 20, 21,
)

# Roles every usable rig must map; the others may be absent and are masked downstream.
ESSENTIAL_ROLES = (
    "Hips", "Spine", "Head",
    "LeftArm", "LeftForeArm", "LeftHand", "RightArm", "RightForeArm", "RightHand",
    "LeftThigh", "LeftShin", "LeftFoot", "RightThigh", "RightShin", "RightFoot",
)

# The five targets a user moves, in input order.
EFFECTORS = ("LeftHand", "RightHand", "LeftFoot", "RightFoot", "Head")
EFFECTOR_ROLES = tuple(ROLE_INDEX[name] for name in EFFECTORS)
FEET = ("LeftFoot", "RightFoot")
FOOT_ROLES = tuple(ROLE_INDEX[name] for name in FEET)

# Joints whose position neither the hips transform nor an effector fixes: the figure that separates solvers.
GIVEN_BY_HIPS = ("Hips", "Spine", "LeftThigh", "RightThigh")
FIXED_BY_EFFECTORS = ("LeftHand", "RightHand", "LeftFoot", "RightFoot", "Head", "LeftToeBase", "RightToeBase")
INNER_ROLES = tuple(
    i for i, name in enumerate(ROLES) if name not in GIVEN_BY_HIPS and name not in FIXED_BY_EFFECTORS
)

# Motion tasks, in the order of their input code. Keywords are matched against action names (lower case).
TASKS = ("idle", "locomotion", "reach", "grab", "crouch", "jump")
TASK_KEYWORDS = (
    ("locomotion", ("walk", "run", "jog", "dash", "sprint", "locomotion")),
    ("crouch", ("crouch", "squat", "kneel")),
    ("jump", ("jump", "hop", "leap")),
    ("grab", ("grab", "scoop", "pick", "grasp")),
    ("reach", ("reach", "point", "raise", "wave")),
    ("idle", ("idle", "stand", "rest", "breath")),
)


def task_from_name(action_name: str) -> int:
    """Task index for an action name by keyword; idle when nothing matches."""
    lowered = action_name.lower()
    for task, words in TASK_KEYWORDS:
        if any(word in lowered for word in words):
            return TASKS.index(task)
    return TASKS.index("idle")
