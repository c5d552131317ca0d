"""The run-time ONNX graph: raw target world matrices in, local quaternions out, in one ONNX Runtime call.

The exported file (onnx_export.py) keeps the game-engine contract, 50 inputs -> 69 clamped deltas. Live ticks use this
second graph, built in memory from the same Model, because ONNX Runtime runs a small node in less than half of what
a NumPy call on a tiny array costs, and without Python between them: the whole input builder and output conversion of the solver
(inputs.InputBuilder, q = q_mean * exp(delta)) as about 60 graph nodes is several times faster than as NumPy calls.
The node count is the cost (session options change nothing measurable), so every stage is written in as few nodes as
it can be: products with constant 0/1 matrices instead of Gather/Reshape runs, biases folded into Gemms, the hips'
quaternion from one per-character product. tests/test_solver.py checks the inputs against features.build_inputs and
the quaternions against the NumPy path.

    world (K, 28, 4)         transposed (column-major, as foreach_get reads them) world matrices: armature, then the
                             root and the five effector targets (RuntimeEngine's (K, 7, 4, 4) buffer)
    to_character_t (K, 4, 3) the top three rows of (character space from world space), transposed, per character
                             (RuntimeEngine.set_to_character): the bottom row of an affine matrix is known, so the
                             graph never carries it - 84 numbers per character instead of 112 (a smaller linear map)
    settings (K, 6)          -ground left/right (character space), desired contact left/right, phase, task code
    z_limits, step_limits (K, 2)  per foot: ankle height and squared step below which it is in contact
    previous_feet (K, 6)     the feet positions of the previous tick (the `feet` output of that tick)
 -> q_ext (K, 96)            local quaternions (w, x, y, z) per role (92), identity where the rig lacks the role, then
                             the hips' matrix_basis quaternion (4); hips_location (K, 3) the hips' location
    feet (K, 6), check (K, 3) (see check_limits), matrices_t (K, 28, 3) the top rows of the character-space matrices
    (armature, then the targets), and with debug=True the 50 network inputs (K, 50)
    with a pose layout (live: every rig of the group has the same bones): pose_base (K, 4 bones + 96) in, pose out:
    the rigs' whole rotation_quaternion buffers (the first 4 bones columns), ready for foreach_set

The hips' map (vec of the root target -> its matrix_basis quaternion squares and location, live.LiveCharacter.hips_map)
is a constant of the graph, folded into the linear map: a live group holds characters that share one (copies of a rig).

Stages (each a function below): character space, the heading and the features (the matrices turned into the root
frame, one features map), contacts, axis-angles, the network, the hips, q = q_mean * exp(delta) (and the pose buffers,
one ScatterND into the unmapped bones' rotations), the check. Tensors stay 2-D where they meet a constant matrix, so
ONNX Runtime fuses MatMul + Add into one Gemm. At one character the cost is a fixed amount per node (55 after fusion)
plus one per call; at 50 the per-character arithmetic counts too, so the constant matrices (~52k floats) are kept small.

The rig's bridges/offsets enter only through the builder's constant matrix (the thigh-to-thigh axis the heading is made
from); a session whose in-between bones stand off their rest pose builds its graph from a skeleton holding their
links (solver.resolve_links), so they cost nothing per tick.

The graph assumes unit rotation columns (unscaled empties); `check` says when that, or anything else the fast path
relies on, does not hold - non-finite numbers, an absurd distance, a shear or reflection, a degenerate heading, a
relative rotation near a half turn - and the solver then redoes the tick on the careful NumPy path.
"""

import numpy as np

from ..data.features import NUM_INPUTS
from ..skeleton.roles import NUM_ROLES
from .engines import ort_session
from .inputs import ABSURD_DISTANCE, NUM_FEATURES, SETTING_COLUMNS

GRAPH_INPUTS = ("world", "to_character_t", "settings", "z_limits", "step_limits", "previous_feet")
CHECK_TOLERANCE = 1e-2       # summed |4 sin^2 + 4 cos^2 - 4| of the six relative rotations
NEAR_HALF_TURN = 0.002       # 2 + 2 cos of a relative rotation must stay above this (away from a half turn)
FULL_VEC = 112               # vec of the seven transposed 4x4 matrices (armature, root, five effectors)
VEC = 84                     # the same without the bottom rows: 12 per matrix (compact_rows)
ROTATIONS = 6                # relative rotations converted to axis-angles: five effectors, then the hips (check only)
PADDED = 16                  # transcendental kernels get rows of 16 (SIMD blocks and a scalar tail round differently,
                             # so padding keeps a character's numbers independent of how many share the call)
ROT_INPUTS = [6 * e + 3 + a for e in range(5) for a in range(3)]      # the effectors' axis-angle inputs
PLAIN_INPUTS = [j for j in range(NUM_INPUTS) if j not in ROT_INPUTS]  # the other 35, linear in the targets
# Column layout of the features map (and of `feats`): the 35 plain inputs, then the six rotations'
# 2 sin axis (18) and 2 cos (6), then -(2 + 2 cos) of the six padded to 16 (padding -4: a zero rotation).
V_START = len(PLAIN_INPUTS)
NC_START, NTP_START, FEATS = V_START + 3 * ROTATIONS, V_START + 4 * ROTATIONS, V_START + 4 * ROTATIONS + PADDED
FEET_COLUMNS = [16 * 4 + 12 + a for a in range(3)] + [16 * 5 + 12 + a for a in range(3)]   # feet: slots 4, 5, row 3
HIPS_ROWS = 16                                                        # the root's 16 entries start here in vec
QUATERNIONS = 4 * NUM_ROLES + 4                                       # q_ext: every role's quaternion, then the hips'
ROLE_COLUMNS = 24            # the 23 roles' angles padded to a multiple of 8 (not 32: at K = 50 the Sin, Cos, Sqrt
                             # and Div on them cost measurably less each tick; numbers measured bitwise the same alone or batched)


def check_limits(height):
    """The raw check measures must each be <= these (NaN fails): the summed |target coordinates| (within
    ABSURD_DISTANCE rig heights), the rotation deviation, -(2 + 2 cos) of the relative rotations (away from a half
    turn). The graph outputs the first two over their limits, so every column must be <= CHECK_BOUNDS."""
    return np.array([ABSURD_DISTANCE * height, CHECK_TOLERANCE, -NEAR_HALF_TURN], np.float64)


CHECK_BOUNDS = (1.0, 1.0, -NEAR_HALF_TURN)
# Up to this many characters the check's 3 K comparisons are cheaper in Python than as NumPy calls (about 5x at
# K = 1); at K = 50 Python costs about three times the NumPy calls.
PYTHON_CHECK_CHARACTERS = 16


def _transposed_rows():
    """Row order of vec(T^T) in terms of vec(T) for six 4x4 matrices."""
    perm = np.empty(96, np.int64)
    for t in range(6):
        for i in range(4):
            for j in range(4):
                perm[t * 16 + j * 4 + i] = t * 16 + i * 4 + j
    return perm


def compact_rows(full):
    """(FULL_VEC, n) acting on vec of the seven transposed 4x4 matrices -> ((VEC, n), bias (n,)) acting on their top
    three rows: entry (row j, column i) of slot s moves from 16 s + 4 i + j to 12 s + 3 i + j; the bottom row of an
    affine matrix is (0, 0, 0, 1), so its entries only add the rows of the ones to a constant bias."""
    full = np.asarray(full, np.float64)
    keep = [16 * s + 4 * i + j for s in range(7) for i in range(4) for j in range(3)]
    return full[keep], full[[16 * s + 15 for s in range(7)]].sum(axis=0)


HEADING = (np.diag([1.0, 1.0, 0.0, 0.0]), np.array([[0, 1, 0, 0], [-1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0.0]]),
           np.diag([0.0, 0.0, 1.0, 1.0]))       # the root frame's turn H = cos * [0] + sin * [1] + [2] (inputs.InputBuilder)


def linear_map(model, builder, hips_map=None):
    """Two linear maps, each (matrix, bias) on vec of the seven matrices' top rows:

    features: the matrices turned into the root frame's heading (H T) -> `feats` (FEATS: the 35 plain inputs, the six
    rotations' 2 sin axis and 2 cos, -(2 + 2 cos) padded); first: the matrices as they are -> the thigh-to-thigh axis
    (2) the heading comes from, the feet (6) and their heights (2), then the hips' squares (4), sign carriers (4) and
    location (3) through hips_map (16, 10) (live.LiveCharacter.hips_map; None: zeros). The settings and contact flags
    pass straight into the inputs, so they join at the first layer instead.

    From inputs.InputBuilder's matrix (rows vec(T) of the six targets then its settings order, columns three heading
    blocks of the 50 inputs and the effectors' trace - 1, features = cos * block0 + sin * block1 + block2, then the
    axis), extended by the hips' relative rotation (for the check) and the -(2 + 2 cos) columns the axis-angle stage
    divides by; rows reordered to the graph's inputs. Features are linear in the turned matrices, and H is block0's
    basis plus block2's at cos = 1, sin = 0, so the features map is block0 + block2: a third of the three-block product
    the heading would otherwise be mixed from."""
    M = builder.matrix
    nf = NUM_FEATURES
    href = np.asarray(model.feature_spec.hips_reference, np.float64)
    out = np.zeros((M.shape[0], 3, FEATS))
    for b in range(3):
        block = M[:, b * nf:(b + 1) * nf]
        out[:, b, :V_START] = block[:, PLAIN_INPUTS]
        for e in range(5):
            out[:, b, V_START + 3 * e:V_START + 3 * e + 3] = block[:, 6 * e + 3:6 * e + 6]
            out[:, b, NC_START + e] = block[:, NUM_INPUTS + e]
    one = np.zeros(M.shape[0])                 # the linear form of the constant 1 (= the root's entry 3, 3)
    one[15] = 1.0
    for u in range(96):                        # the hips relative to their reference: 2 sin axis and 2 cos
        probe = np.zeros(96)
        probe[u] = 1.0
        for b, B in enumerate(HEADING):
            G = B @ probe.reshape(6, 4, 4)[0]
            A = href.T @ G[:3, :3]
            out[u, b, V_START + 15:V_START + 18] = (A[2, 1] - A[1, 2], A[0, 2] - A[2, 0], A[1, 0] - A[0, 1])
            out[u, b, NC_START + 5] = np.trace(A) - G[3, 3]
    # -(2 + 2 cos) = -(2 cos) - 2 * 1, in the constant block (the heading's third basis keeps G[3, 3])
    out[:, :, NTP_START:NTP_START + ROTATIONS] = -out[:, :, NC_START:NC_START + ROTATIONS]
    out[:, 2, NTP_START:NTP_START + PADDED] -= 2.0 * one[:, None]
    out[:, 2, NTP_START + ROTATIONS:] -= 2.0 * one[:, None]          # padding: -4, a zero rotation
    big = np.concatenate([out.reshape(-1, 3 * FEATS), M[:, 3 * nf:]], axis=1)[_transposed_rows()]
    full = np.zeros((FULL_VEC, big.shape[1] + 8 + 11))
    full[16:, :big.shape[1]] = big             # the armature's own matrix (slot 0) enters nothing
    for i, column in enumerate(FEET_COLUMNS + [FEET_COLUMNS[2], FEET_COLUMNS[5]]):
        full[column, big.shape[1] + i] = 1.0
    full[:, big.shape[1] + 8:] = graph_hips_map(np.zeros((16, 10)) if hips_map is None else hips_map)
    return compact_rows(full[:, :FEATS] + full[:, 2 * FEATS:3 * FEATS]), compact_rows(full[:, 3 * FEATS:])


def settings_rows():
    """(8, 50): [settings (6), contact (2)] -> the inputs they pass into (inputs.InputBuilder's setting columns)."""
    rows = np.zeros((8, NUM_INPUTS))
    order = [0, 1, 4, 5, 6, 7, 2, 3]           # the graph's settings then contact, in the builder's settings order
    for i, j in enumerate(order):
        rows[i, SETTING_COLUMNS[j]] = 1.0
    return rows


class _Graph:
    """Node and initializer lists with one-line helpers, so the stages below read like the maths."""

    def __init__(self):
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.inits, self.nodes = [], []

    def const(self, name, value, dtype=np.float32):
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(np.asarray(value, dtype)), name))
        return name

    def ints(self, name, value):
        return self.const(name, value, np.int64)

    def node(self, op, inputs, output, **attrs):
        """One node; output is a name or a list of names (returned as given)."""
        outputs = [output] if isinstance(output, str) else list(output)
        self.nodes.append(self.helper.make_node(op, list(inputs), outputs, name=outputs[0], **attrs))
        return output


def _character_space(g):
    """The seven world matrices into character space, flattened: vec (K, 84), their top three rows.

    The 28 rows of the seven transposed matrices times C^T in one (28, 4) @ (4, 3) product per character: as
    (K, 7, 4, 4) @ (K, 1, 4, 4) ONNX Runtime makes 7 tiny products per character, each about six times this
    product's cost at K = 50)."""
    g.node("MatMul", ["world", "to_character_t"], "matrices_t")             # rows = columns of C @ W, top three entries
    return g.node("Reshape", ["matrices_t", g.ints("shape_vec", [-1, VEC])], "vec")


def _contacts(g):
    """Contact flags (K, 2) as in training: the ankle low (z below its limit) and slow (squared step below its
    limit, against the previous tick's feet); `feet` (from the linear map) is the next tick's previous_feet."""
    from onnx import TensorProto

    step = g.node("Sub", ["feet", "previous_feet"], "step")
    sum_feet = np.zeros((6, 2))
    sum_feet[[0, 1, 2], 0] = sum_feet[[3, 4, 5], 1] = 1.0
    step2 = g.node("MatMul", [g.node("Mul", [step, step], "step_sq"), g.const("sum_feet", sum_feet)], "step2")
    low_slow = g.node("And", [g.node("Less", ["feet_z", "z_limits"], "low"), g.node("Less", [step2, "step_limits"], "slow")],
                      "low_slow")
    return g.node("Cast", [low_slow], "contact", to=TensorProto.FLOAT)


def _features(g, model, builder, vec, hips_map):
    """feats (K, FEATS) (and the feet, the hips' squares, signs and location): a first product gives the heading's
    axis (and the rest that needs no heading), the heading's cos and sin (the normalised thigh-to-thigh axis; a zero
    axis gives NaN, which the check catches) make each character's turn H^T (one small product), the matrices' rows
    times H^T are the turned matrices, and one product with the features map gives feats."""
    (features, features_bias), (first, first_bias) = linear_map(model, builder, hips_map)
    y = g.node("Add", [g.node("MatMul", [vec, g.const("first_map", first)], "y_m"), g.const("first_bias", first_bias)], "y")
    g.node("Split", [y, g.ints("split_y", [2, 6, 2, 4, 4, 3])],
           ["lateral", "feet", "feet_z", "squares", "signs", "hips_location"], axis=1)
    cos_sin = g.node("Div", ["lateral", g.node("ReduceL2", ["lateral"], "lateral_length", axes=[1], keepdims=1)],
                     "cos_sin")
    turn = np.stack([HEADING[0][:3, :3].T.reshape(9), HEADING[1][:3, :3].T.reshape(9)])      # cos, sin -> vec(H^T)
    turn_t = g.node("Reshape", [g.node("Add", [g.node("MatMul", [cos_sin, g.const("turn_map", turn)], "turn_m"),
                                                g.const("turn_bias", HEADING[2][:3, :3].T.reshape(9))], "turn9"),
                                g.ints("shape_turn", [-1, 3, 3])], "turn_t")
    turned = g.node("Reshape", [g.node("MatMul", ["matrices_t", turn_t], "turned_t"), g.ints("shape_turned", [-1, VEC])],
                    "turned")
    return g.node("Add", [g.node("MatMul", [turned, g.const("features_map", features)], "feats_m"),
                          g.const("features_bias", features_bias)], "feats")


def _axis_angles(g, feats):
    """Axis-angles of the six relative rotations from their 2 sin axis (v) and -(2 + 2 cos) (ntp):
    angle / 2 = atan(|v| / (2 + 2 cos)), aa = v * angle / |v|. Returns (aa (K, 24): the five effectors' axis-angles
    (15), then zeros, rotation deviation (K, 1) for the check: sum |4 sin^2 + 4 cos^2 - 4|)."""
    g.node("Split", [feats, g.ints("split_feats", [V_START, 4 * ROTATIONS, PADDED])], ["feats_inputs", "vnc", "ntp"],
           axis=1)
    sq = g.node("Mul", ["vnc", "vnc"], "vnc_sq")
    sum_v = np.zeros((4 * ROTATIONS, PADDED))
    sum_v[:3 * ROTATIONS, :ROTATIONS] = np.kron(np.eye(ROTATIONS), np.ones((3, 1)))
    sum_all = sum_v[:, :ROTATIONS].copy()
    sum_all[3 * ROTATIONS:] = np.eye(ROTATIONS)
    four_sin2 = g.node("Add", [g.node("MatMul", [sq, g.const("sum_v", sum_v)], "four_sin2_m"),
                               g.const("tiny_sin", np.full(PADDED, 1e-30))], "four_sin2")
    deviation = g.node("Add", [g.node("MatMul", [sq, g.const("sum_all", sum_all / CHECK_TOLERANCE)], "four_m"),
                               g.const("minus_four", np.full(ROTATIONS, -4.0 / CHECK_TOLERANCE))], "deviation")
    rot_dev = g.node("ReduceL1", [deviation], "rot_dev", axes=[1], keepdims=1)
    two_sin = g.node("Sqrt", [four_sin2], "two_sin")
    minus_half = g.node("Atan", [g.node("Div", [two_sin, "ntp"], "minus_tan_half")], "minus_half_angle")
    factor = g.node("Div", [minus_half, two_sin], "factor")                       # -angle / (4 sin)
    spread = np.zeros((PADDED, 4 * ROTATIONS))
    spread[:5, :15] = -2.0 * np.kron(np.eye(5), np.ones((1, 3)))                  # the hips' only feed the check
    aa = g.node("Mul", ["vnc", g.node("MatMul", [factor, g.const("spread", spread)], "factor24")], "aa")
    return aa, rot_dev


def _network(g, model, feats, aa, contact):
    """The MLP with the input assembly and normalisation folded into its first layer; returns half deltas (K, 69)
    (the last layer and the clamp are halved: exp takes half angles), the first layer's input [the 35 plain inputs,
    aa, settings, contact] and the map P of that input to the 50 network inputs (for the debug inputs)."""
    std, mean = np.asarray(model.input_std, np.float64), np.asarray(model.input_mean, np.float64)
    P = np.zeros((V_START + 4 * ROTATIONS + 8, NUM_INPUTS))
    for i, j in enumerate(PLAIN_INPUTS):
        P[i, j] = 1.0
    for i, j in enumerate(ROT_INPUTS):
        P[V_START + i, j] = 1.0
    P[V_START + 4 * ROTATIONS:] = settings_rows()
    W = [np.asarray(w, np.float64) for w in model.weights]
    both = g.node("Concat", ["feats_inputs", aa, "settings", contact], "first_input", axis=1)
    h = g.node("Add", [g.node("MatMul", [both, g.const("W0", P @ (W[0] / std[:, None]))], "z0m"),
                       g.const("b0", W[1] - (mean / std) @ W[0])], "z0")
    layers = len(W) // 2
    for k in range(1, layers):
        h = g.node("Tanh", [h], f"h{k}")
        scale = 0.5 if k == layers - 1 else 1.0                  # the last layer gives half deltas
        h = g.node("Add", [g.node("MatMul", [h, g.const(f"W{k}", W[2 * k] * scale)], f"z{k}m"),
                           g.const(f"b{k}", W[2 * k + 1] * scale)], f"z{k}")
    if layers == 1:
        h = g.node("Mul", [h, g.const("half_out", 0.5)], "z_half")
    low = 0.5 * np.asarray(model.limit_low, np.float64).reshape(-1)
    high = 0.5 * np.asarray(model.limit_high, np.float64).reshape(-1)
    d = g.node("Max", [g.node("Min", [h, g.const("limit_high", high)], "below_high"), g.const("limit_low", low)],
               "half_deltas")
    return d, both, P


def _quaternions(g, model, d, hips_q, pose_layout, k):
    """q = q_mean * exp(delta) per role: E = [cos theta (23, padded to ROLE_COLUMNS), sin theta / theta * d (69), the hips'
    quaternion (4)], q_ext = E @ block + identity where the rig lacks the role (block holds the mean pose's
    left-multiplication matrices; the hips' quaternion passes through as the last 4 columns). With a pose layout, one
    ScatterND puts q_ext's quaternions at their bones in `pose_base` (K, bones + 24, 4) (the unmapped bones' rotations,
    plus 24 spare places that take the roles no quaternion bone has): the rigs' rotation_quaternion buffers (`pose`)."""
    from ..geometry.quaternion_math import left_matrices
    from ..geometry.rotations import matrix_to_quaternion

    sum3r = np.zeros((3 * NUM_ROLES, ROLE_COLUMNS))
    sum3r[:, :NUM_ROLES] = np.kron(np.eye(NUM_ROLES), np.ones((3, 1)))
    theta2 = g.node("Add", [g.node("MatMul", [g.node("Mul", [d, d], "d_sq"), g.const("sum_roles", sum3r)], "theta2m"),
                            g.const("tiny2", np.full(ROLE_COLUMNS, 1e-30))], "theta2")
    theta = g.node("Sqrt", [theta2], "theta")
    sinc = g.node("MatMul", [g.node("Div", [g.node("Sin", [theta], "sin_theta"), theta], "sinc"),
                             g.const("spread_roles", sum3r.T)], "sinc69")
    e = g.node("Concat", [g.node("Cos", [theta], "cos_theta"), g.node("Mul", [d, sinc], "xyz"), hips_q], "exp", axis=1)
    mask = model.skeleton.role_mask
    mean_q = matrix_to_quaternion(np.asarray(model.mean_pose, np.float64))
    L = np.where(mask[:, None, None], left_matrices(mean_q), 0.0)
    block = np.zeros((ROLE_COLUMNS + 3 * NUM_ROLES + 4, QUATERNIONS))
    for j in range(NUM_ROLES):
        block[j, 4 * j:4 * j + 4] = L[j][:, 0]
        block[ROLE_COLUMNS + 3 * j:ROLE_COLUMNS + 3 * j + 3, 4 * j:4 * j + 4] = L[j][:, 1:].T
    block[-4:, -4:] = np.eye(4)
    bias = np.concatenate([np.where(mask[:, None], 0.0, np.array([1.0, 0.0, 0.0, 0.0])).reshape(-1), np.zeros(4)])
    q_ext = g.node("Add", [g.node("MatMul", [e, g.const("mean_left", block)], "q_raw"), g.const("q_bias", bias)], "q_ext")
    if pose_layout is not None:
        columns = pose_columns(pose_layout)
        index = np.zeros((k, QUATERNIONS // 4, 2), np.int64)
        index[:, :, 0] = np.arange(k)[:, None]
        index[:, :, 1] = columns[::4] // 4
        q3 = g.node("Reshape", [q_ext, g.ints("shape_q3", [k, QUATERNIONS // 4, 4])], "q_ext3")
        g.node("ScatterND", ["pose_base", g.ints("pose_bones", index), q3], "pose")


def pose_columns(pose_layout):
    """(96,) where each q_ext column goes in a pose buffer of 4 * bones + 96 columns: the mapped quaternion bones' and
    the hips' places, and a spare column of its own (4 * bones + column) for every other one."""
    count, bones, roles, hips_index = pose_layout
    columns = 4 * count + np.arange(QUATERNIONS)
    for b, r in zip(bones, roles):
        columns[4 * r:4 * r + 4] = 4 * b + np.arange(4)
    if hips_index is not None:
        columns[-4:] = 4 * hips_index + np.arange(4)
    return columns


def _hips(g):
    """The hips' matrix_basis quaternion from the linear map's hips columns: squares of (w, x, y, z), carriers of
    their signs (w's is the constant 1; x, y, z: the antisymmetric part, nudged off zero so a zero reads as +);
    q = sign * sqrt(max(squares, 0)) / 2. Not normalised: the check keeps the root target's rotation orthonormal to
    float precision (else the NumPy path takes the tick), and Blender normalises a pose quaternion before use."""
    magnitude = g.node("Sqrt", [g.node("Relu", ["squares"], "squares_pos")], "magnitudes")
    return g.node("Mul", [magnitude, g.node("Sign", ["signs"], "sign")], "hips_q")


def _check(g, vec, rot_dev, height):
    """check (K, 3), each column at most CHECK_BOUNDS (NaN fails) when the fast path holds: the summed |coordinates|
    of the targets over their limit (absurd distances; a product, so NaN anywhere in vec reaches it), the rotation
    deviation over its limit (scaled, sheared or mirrored targets, a degenerate heading; _axis_angles scales it), max
    -(2 + 2 cos) (away from a half turn). One comparison per number is then the whole verdict (RuntimeEngine.run)."""
    coordinates = np.zeros((FULL_VEC, 1))
    for slot in range(1, 7):
        coordinates[16 * slot + 12:16 * slot + 15] = 1.0 / check_limits(height)[0]
    far = g.node("MatMul", [g.node("Abs", [vec], "vec_abs"), g.const("coordinates", compact_rows(coordinates)[0])], "far")
    near_half_turn = g.node("ReduceMax", ["ntp"], "near_half_turn", axes=[1], keepdims=1)
    g.node("Concat", [far, rot_dev, near_half_turn], "check", axis=1)


def build_runtime_graph(model, builder, height, characters, debug=False, pose_layout=None, hips_map=None):
    """onnx.ModelProto of the run-time path for `model` (builder: inputs.InputBuilder of the same model) and a fixed
    number of characters (the pose scatter's indices are a constant of that shape).

    pose_layout (bone count, pose-bone indices, their roles, the hips' pose-bone index or None): adds the input
    `pose_base` and the output `pose` (K, 4 * bones + 96), every character's whole rotation_quaternion buffer first.
    hips_map (16, 10): live.LiveCharacter.hips_map, shared by the characters (None: zeros, the hips' outputs unused)."""
    from onnx import TensorProto, helper

    g = _Graph()
    vec = _character_space(g)
    feats = _features(g, model, builder, vec, hips_map)
    contact = _contacts(g)
    aa, rot_dev = _axis_angles(g, feats)
    d, both, P = _network(g, model, feats, aa, contact)
    hips_q = _hips(g)
    _quaternions(g, model, d, hips_q, pose_layout, characters)
    _check(g, vec, rot_dev, height)
    inputs = list(GRAPH_INPUTS)
    outputs = ["q_ext", "feet", "check", "matrices_t", "hips_location"]
    if pose_layout is not None:
        inputs.append("pose_base")
        outputs.append("pose")
    if debug:
        g.node("MatMul", [both, g.const("P", P)], "inputs")
        outputs += ["inputs"]
    width = [pose_layout[0] + QUATERNIONS // 4, 4] if pose_layout is not None else []
    shapes = {"world": [28, 4], "to_character_t": [4, 3], "settings": [6], "z_limits": [2], "step_limits": [2],
              "previous_feet": [6], "pose_base": width}
    out_shapes = {"q_ext": [QUATERNIONS], "feet": [6], "check": [3], "inputs": [NUM_INPUTS], "matrices_t": [28, 3],
                  "hips_location": [3], "pose": width}
    info = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, [characters] + s)
    graph = helper.make_graph(g.nodes, "neural_ik_runtime", [info(n, shapes[n]) for n in inputs],
                              [info(n, out_shapes[n]) for n in outputs], initializer=g.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="neural_ik.runtime")
    proto.ir_version = 8
    return proto


def graph_hips_map(hips_map):
    """(16, 10) map of live.LiveCharacter.hips_map (row-major vec(hips transform) -> 7 squares/signs of
    quaternion_math.MATRIX_TO_SQUARES and the location) -> (FULL_VEC, 11) on vec of the seven transposed matrices:
    squares over 4 (w^2, x^2, y^2, z^2), sign carriers (4: w's the constant +1), location (3)."""
    hips_map = np.asarray(hips_map, np.float64)
    rows = HIPS_ROWS + _transposed_rows()[:16]
    out = np.zeros((FULL_VEC, 11))
    out[rows, 0:4] = hips_map[:, 0:4] / 4.0
    out[HIPS_ROWS + 15, 4] = 1.0                             # w's sign: +
    out[rows, 5:8] = hips_map[:, 4:7]
    out[HIPS_ROWS + 15, 5:8] += 1e-30                        # a zero antisymmetric part reads as +
    out[rows, 8:11] = hips_map[:, 7:10]
    return out


class RuntimeEngine:
    """ONNX Runtime on the run-time graph, every input and output bound once to a preallocated float32 buffer.

    Two bindings alternate: the feet output of one tick is the previous_feet input of the next (nothing is copied),
    and every other output has a buffer per binding, so the results of the last run that passed its checks stay
    readable after a run that did not (the solver keeps them as the last good pose without copying them each tick).
    `q`, `hips_q`, `hips_location` and `pose` are the latest run's (views), `targets` its character-space targets (a
    float64 buffer of the binding, filled on each read); `results(p)` and `targets_of(p)` those of binding p."""
    name = "onnxruntime"

    def __init__(self, model, builder, height, characters, debug=False, pose_layout=None, hips_map=None):
        k = self.k = characters
        self.graph_args = (model, builder, height, k, debug, pose_layout)
        self.world = np.broadcast_to(np.eye(4, dtype=np.float32), (k, 7, 4, 4)).copy()
        self.to_character = np.broadcast_to(np.eye(4), (k, 4, 4)).copy()
        self.to_character_t = np.zeros((k, 4, 3), np.float32)
        self.set_to_character(self.to_character)
        self.settings = np.zeros((k, 6), np.float32)
        self.z_limits = np.zeros((k, 2), np.float32)
        self.step_limits = np.full((k, 2), np.inf, np.float32)
        self.feet = (np.zeros((k, 6), np.float32), np.zeros((k, 6), np.float32))
        self.check = np.zeros((k, 3), np.float32)
        self.check_flat = self.check.reshape(-1)
        self.check_bounds = list(CHECK_BOUNDS) * k
        self.check_limit = np.array(self.check_bounds, np.float32).reshape(k, 3)
        self.check_passed = np.zeros((k, 3), bool)
        self.inputs = np.zeros((k, NUM_INPUTS), np.float32) if debug else None
        self.widths = {"q_ext": (QUATERNIONS,), "matrices_t": (28, 3), "hips_location": (3,)}
        self.pose_base = None
        if pose_layout is not None:
            bones = pose_layout[0]
            self.pose_base = np.zeros((k, bones + QUATERNIONS // 4, 4), np.float32)
            self.widths["pose"] = self.pose_base.shape[1:]
        self.buffers = [{name: np.zeros((k,) + w, np.float32) for name, w in self.widths.items()} for _ in (0, 1)]
        for buffers in self.buffers:                 # views: q, the hips' quaternion, each rig's pose buffer
            buffers["q"] = buffers["q_ext"][:, :4 * NUM_ROLES]
            buffers["hips_q"] = buffers["q_ext"][:, 4 * NUM_ROLES:]
            buffers["pose_full"] = buffers.get("pose")                 # what the graph writes (spare places too)
            buffers["pose"] = buffers["pose"][:, :bones].reshape(k, 4 * bones) if pose_layout is not None else None
        self.target_buffers = [np.zeros((k, 6, 4, 4)) for _ in (0, 1)]
        self.target_copies, self.target_parts = [], []          # views made once: a refined tick fills and reads them
        for p, buffer in enumerate(self.target_buffers):
            buffer[:, :, 3, 3] = 1.0
            top = np.swapaxes(self.buffers[p]["matrices_t"].reshape(k, 7, 4, 3)[:, 1:], -1, -2)
            self.target_copies.append((buffer[:, :, :3], top))
            self.target_parts.append((buffer[:, 0], buffer[:, 1:, :3, 3], buffer[:, 1:, :3, :3]))
        self.parity = 0
        self.latest = 1
        self.set_hips_map(hips_map)

    def set_hips_map(self, hips_map):
        """(Re)build the session with the hips' map (16, 10) folded into the graph's linear map (None: zeros) and bind
        every buffer (the buffers stay the same arrays)."""
        self.session = ort_session(build_runtime_graph(*self.graph_args, hips_map=hips_map).SerializeToString())
        inputs = list(GRAPH_INPUTS[:-1]) + (["pose_base"] if self.pose_base is not None else [])
        self.bindings = []
        for p in (0, 1):
            io = self.session.io_binding()
            for name in inputs:
                io.bind_cpu_input(name, getattr(self, name).reshape(self.k, 28, 4) if name == "world" else getattr(self, name))
            io.bind_cpu_input("previous_feet", self.feet[p])
            outputs = [(name, self.buffers[p]["pose_full" if name == "pose" else name]) for name in self.widths]
            outputs += [("check", self.check), ("feet", self.feet[1 - p])]
            if self.inputs is not None:
                outputs.append(("inputs", self.inputs))
            for name, buf in outputs:
                io.bind_output(name, "cpu", 0, np.float32, buf.shape, buf.ctypes.data)
            self.bindings.append(io)
        self.run_binding = self.session.run_with_iobinding

    def set_to_character(self, matrices):
        """Character space from world space, (K, 4, 4) or one (4, 4) for everyone (an affine map: bottom row 0 0 0 1)."""
        self.to_character[:] = matrices
        self.to_character_t[:] = np.swapaxes(self.to_character[:, :3, :], -1, -2)

    def results(self, p):
        return self.buffers[p]

    def targets_of(self, p):
        """(K, 6, 4, 4) float64 the character-space targets binding p's run saw (the graph keeps their top rows):
        the binding's target buffer, filled now (it stays valid until the next call for that binding)."""
        np.copyto(*self.target_copies[p])
        return self.target_buffers[p]

    def latest_target_parts(self):
        """The latest run's targets filled as in targets_of, as (hips (K, 4, 4), effector positions (K, 5, 3),
        effector rotations (K, 5, 3, 3)) views."""
        self.targets_of(self.latest)
        return self.target_parts[self.latest]

    q = property(lambda self: self.buffers[self.latest]["q"])
    targets = property(lambda self: self.targets_of(self.latest))
    hips_q = property(lambda self: self.buffers[self.latest]["hips_q"])
    hips_location = property(lambda self: self.buffers[self.latest]["hips_location"])
    pose = property(lambda self: self.buffers[self.latest]["pose"])

    @property
    def previous_feet(self):
        return self.feet[self.parity]

    def run(self):
        """One call; returns True when every character passed the graph's checks."""
        p = self.parity
        self.run_binding(self.bindings[p])
        self.latest = p
        self.parity = p ^ 1
        if self.k > PYTHON_CHECK_CHARACTERS:
            return bool(np.less_equal(self.check, self.check_limit, out=self.check_passed).all())     # NaN fails
        for value, bound in zip(self.check_flat.tolist(), self.check_bounds):
            if not value <= bound:                  # NaN fails too
                return False
        return True
