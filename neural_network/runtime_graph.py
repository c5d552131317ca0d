"""The run-time ONNX graph: raw target world matrices in, local quaternions out, in one ONNX Runtime call.

The exported file (onnx_export.py) keeps the game-engine contract, 50 inputs -> 69 clamped deltas. Live ticks use this
second graph, built in memory from the same Model, because ONNX Runtime runs a small node in about 0.2 us while a
NumPy call on a tiny array costs 0.5-1 us plus Python: the whole input builder and output conversion of the solver
(solver.InputBuilder, q = q_mean * exp(delta)) as about 80 graph nodes is several times faster than as NumPy calls.
tests/test_solver.py checks its inputs against features.build_inputs and its quaternions against the NumPy path.

    world (K, 7, 4, 4)       transposed (column-major, as foreach_get reads them) world matrices: armature, then the
                             root and the five effector targets (the armature's slot is not read here)
    to_character_t (K, 1, 4, 4)  (character space from world space)^T per character
    settings (K, 6)          -ground left/right (character space), desired contact left/right, phase, task code
    z_limits, step_limits (K, 2)  per foot: ankle height and squared step below which it is in contact
    hips_maps (K, 16, 10)    vec(hips transform^T) -> hips quaternion squares and location (set_hips_maps takes
                             live.LiveCharacter.hips_map's, on the row-major vec)
    previous_feet (K, 6)     the feet positions of the previous tick (the `feet` output of that tick)
 -> q (K, 92)                local quaternions (w, x, y, z) per role, identity where the rig lacks the role
    hips_q (K, 4), hips_location (K, 3): the hips' matrix_basis quaternion and location (zeros without hips maps)
    feet (K, 6), check (K, 3) (see check_limits), targets_t (K, 6, 4, 4) transposed character-space targets, and
    with debug=True the 50 network inputs (K, 50)

Per-rotation sums and their spreading back are products with 0/1 matrices, the input assembly and normalisation
fold into the first layer, and tensors stay 2-D so MatMul + Add become one Gemm.

The rig's bridges/offsets enter only through the builder's constant matrix (the thigh-to-thigh axis the heading is made
from); a session whose in-between bones stand off their rest pose builds its graph from a skeleton holding their
links (solver.resolve_links), so they cost nothing per tick.

The graph assumes unit rotation columns (unscaled empties); `check` says when that, or anything else the fast path
relies on, does not hold - non-finite numbers, an absurd distance, a shear or reflection, a degenerate heading, a
relative rotation near a half turn - and the solver then redoes the tick on the careful NumPy path.
"""

import numpy as np

from .features import NUM_INPUTS
from .roles import NUM_ROLES

GRAPH_INPUTS = ("world", "to_character_t", "settings", "z_limits", "step_limits", "hips_maps", "previous_feet")
CHECK_TOLERANCE = 1e-2       # summed |4 sin^2 + 4 cos^2 - 4| of the six relative rotations


def check_limits(height):
    """check columns must each be <= these (NaN fails): the largest |entry| (positions within ABSURD_DISTANCE rig
    heights), the rotation deviation, -2 cos of the relative rotations (away from a half turn)."""
    from .solver import ABSURD_DISTANCE

    return np.array([ABSURD_DISTANCE * height, CHECK_TOLERANCE, 1.998], np.float32)


def _transposed_rows():
    """Row order of vec(T^T) in terms of vec(T) for six 4x4 matrices."""
    perm = np.empty(96, np.int64)
    for t in range(6):
        for i in range(4):
            for j in range(4):
                perm[t * 16 + j * 4 + i] = t * 16 + i * 4 + j
    return perm


def build_runtime_graph(model, builder, height, debug=False):
    """onnx.ModelProto of the run-time path for `model` (builder: solver.InputBuilder of the same model)."""
    from onnx import TensorProto, helper, numpy_helper

    from .quaternion_math import left_matrices
    from .rotations import matrix_to_quaternion
    from .solver import NUM_FEATURES

    inits, nodes = [], []

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(np.asarray(value, dtype)), name))
        return name

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, list(inputs), [output], name=output, **attrs))
        return output

    # ---- the linear map, extended by the hips' rotation relative to its reference (only for the check) --------
    F = NUM_FEATURES + 5                # + the hips' relative rotation (4) and the constant 2 (padding for Atan)
    M = builder.matrix                                            # (104, 3 * 55 + 2), rows vec(T) then settings
    blocks = M[:, :3 * NUM_FEATURES].reshape(-1, 3, NUM_FEATURES)
    extra = np.zeros((M.shape[0], 3, 5))
    href = np.asarray(model.feature_spec.hips_reference, np.float64)
    basis = (np.diag([1.0, 1.0, 0.0, 0.0]), np.array([[0, 1, 0, 0], [-1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0.0]]),
             np.diag([0.0, 0.0, 1.0, 1.0]))
    for u in range(96):
        probe = np.zeros(96)
        probe[u] = 1.0
        probe = probe.reshape(6, 4, 4)
        for b, B in enumerate(basis):
            G = B @ probe[0]
            A = href.T @ G[:3, :3]                                  # the hips relative to their reference
            extra[u, b] = (A[2, 1] - A[1, 2], A[0, 2] - A[2, 0], A[1, 0] - A[0, 1], np.trace(A) - G[3, 3], 2 * G[3, 3])
    rows = np.concatenate([_transposed_rows(), 96 + np.array([0, 1, 4, 5, 6, 7, 2, 3])])
    sign = np.ones(F)
    sign[list(range(NUM_INPUTS, NUM_INPUTS + 5)) + [NUM_FEATURES + 3, NUM_FEATURES + 4]] = -1.0   # -2 cos, -2
    big = np.concatenate([(np.concatenate([blocks, extra], axis=2) * sign).reshape(-1, 3 * F), M[:, 3 * NUM_FEATURES:]],
                         axis=1)[rows]                                                       # (104, 3F + 2)
    i64 = lambda name, v: const(name, v, np.int64)
    # ---- 2-D tensors (K, n) throughout, so ONNX Runtime fuses each MatMul + Add into one Gemm ----------------
    tt = node("MatMul", [node("Slice", ["world", i64("s1", [1]), i64("e7", [7]), i64("ax1", [1])], "world6"),
                         "to_character_t"], "targets_t")                                     # rows = columns of T
    vec = node("Reshape", [tt, i64("shape96", [-1, 96])], "vec")
    # contacts: the ankle low and slow (the feet are rows 3 of targets 3 and 4)
    feet = node("Gather", [vec, i64("feet_cols", [60, 61, 62, 76, 77, 78])], "feet", axis=1)
    step = node("Sub", [feet, "previous_feet"], "step")
    sum_feet = np.zeros((6, 2))
    sum_feet[[0, 1, 2], 0] = sum_feet[[3, 4, 5], 1] = 1.0
    step2 = node("MatMul", [node("Mul", [step, step], "step_sq"), const("sum_feet", sum_feet)], "step2")
    z = node("Gather", [vec, i64("z_cols", [62, 78])], "z", axis=1)
    contact = node("Cast", [node("And", [node("Less", [z, "z_limits"], "low"), node("Less", [step2, "step_limits"], "slow")],
                                 "low_slow")], "contact", to=TensorProto.FLOAT)
    y = node("MatMul", [node("Concat", [vec, "settings", contact], "x", axis=1), const("linear_map", big)], "y")
    # heading: features = cos * Y0 + sin * Y1 + Y2
    parts = [f"y{i}" for i in range(4)]
    nodes.append(helper.make_node("Split", [y, i64("split_y", [F, F, F, 2])], parts, name="split_y", axis=1))
    lat = parts[3]
    length = node("Sqrt", [node("ReduceSum", [node("Mul", [lat, lat], "lat_sq"), i64("axes1", [1])], "lat2", keepdims=1)],
                  "lat_len")
    nodes.append(helper.make_node("Split", [node("Div", [lat, length], "cos_sin"), i64("split_cs", [1, 1])],
                                  ["cos", "sin"], name="split_cs", axis=1))
    feats = node("Add", [node("Add", [node("Mul", [parts[0], "cos"], "y0c"), node("Mul", [parts[1], "sin"], "y1s")], "y01"),
                         parts[2]], "feats")
    # axis-angle of the six relative rotations (5 effectors + the hips, for the check); the trace columns hold
    # -2 cos, and transcendental kernels get rows of 16 (SIMD blocks and a scalar tail round differently, so
    # padding keeps a character's numbers independent of how many share the call; padding: sin 0, -2 cos = -2)
    v_cols = [6 * e + 3 + a for e in range(5) for a in range(3)] + [NUM_FEATURES, NUM_FEATURES + 1, NUM_FEATURES + 2]
    t_cols = list(range(NUM_INPUTS, NUM_INPUTS + 5)) + [NUM_FEATURES + 3] + [NUM_FEATURES + 4] * 10
    sum3 = np.zeros((18, 16))
    sum3[:, :6] = np.kron(np.eye(6), np.ones((3, 1)))
    v = node("Gather", [feats, i64("v_cols", v_cols)], "v", axis=1)
    neg_cos = node("Gather", [feats, i64("t_cols", t_cols)], "neg_two_cos", axis=1)
    sin2 = node("MatMul", [node("Mul", [v, v], "v_sq"), const("sum3", sum3)], "four_sin2")
    two_sin = node("Sqrt", [sin2], "two_sin")
    # angle = atan2(2 sin, 2 cos) = 2 atan(2 sin / (2 + 2 cos)) for a rotation (the check guards everything else)
    half = node("Atan", [node("Div", [two_sin, node("Sub", [const("two", 2.0), neg_cos], "two_plus")], "tan_half")],
                "half_angle")
    factor = node("Div", [half, node("Max", [two_sin, const("tiny", 1e-30)], "sin_safe")], "factor")
    aa = node("Mul", [v, node("MatMul", [factor, const("spread3", 2.0 * sum3.T)], "factor18")], "aa")   # (K, 18)
    # the network, its first layer folded with the input assembly and normalisation
    std, mean = np.asarray(model.input_std, np.float64), np.asarray(model.input_mean, np.float64)
    rot_inputs = [6 * e + 3 + a for e in range(5) for a in range(3)]
    P = np.zeros((F + 18, NUM_INPUTS))                  # [feats, aa] -> the 50 inputs
    for j in range(NUM_INPUTS):
        if j not in rot_inputs:
            P[j, j] = 1.0
    for i, j in enumerate(rot_inputs):
        P[F + i, j] = 1.0
    W = [np.asarray(w, np.float64) for w in model.weights]
    both = node("Concat", [feats, aa], "feats_aa", axis=1)
    h = node("Add", [node("MatMul", [both, const("W0", P @ (W[0] / std[:, None]))], "z0m"),
                     const("b0", W[1] - (mean / std) @ W[0])], "z0")
    layers = len(W) // 2
    for k in range(1, layers):
        h = node("Tanh", [h], f"h{k}")
        scale = 0.5 if k == layers - 1 else 1.0                  # the last layer gives half deltas
        h = node("Add", [node("MatMul", [h, const(f"W{k}", W[2 * k] * scale)], f"z{k}m"), const(f"b{k}", W[2 * k + 1] * scale)],
                 f"z{k}")
    if layers == 1:
        h = node("Mul", [h, const("half_out", 0.5)], "z_half")
    low = 0.5 * np.asarray(model.limit_low, np.float64).reshape(-1)
    high = 0.5 * np.asarray(model.limit_high, np.float64).reshape(-1)
    d = node("Max", [node("Min", [h, const("limit_high", high)], "below_high"), const("limit_low", low)], "half_deltas")
    # q = q_mean * exp(delta): E = [cos (23, padded to 32), sin/theta * d (69)], q = E @ block + identity where unmapped
    sum3r = np.zeros((3 * NUM_ROLES, 32))
    sum3r[:, :NUM_ROLES] = np.kron(np.eye(NUM_ROLES), np.ones((3, 1)))
    theta = node("Sqrt", [node("Add", [node("MatMul", [node("Mul", [d, d], "d_sq"), const("sum_roles", sum3r)], "theta2m"),
                                       const("tiny2", np.full(32, 1e-30))], "theta2")], "theta")
    sinc = node("MatMul", [node("Div", [node("Sin", [theta], "sin_theta"), theta], "sinc"), const("spread_roles", sum3r.T)],
                "sinc69")
    e = node("Concat", [node("Cos", [theta], "cos_theta"), node("Mul", [d, sinc], "xyz")], "exp", axis=1)
    mask = model.skeleton.role_mask
    mean_q = matrix_to_quaternion(np.asarray(model.mean_pose, np.float64))
    L = np.where(mask[:, None, None], left_matrices(mean_q), 0.0)
    block = np.zeros((32 + 3 * NUM_ROLES, 4 * NUM_ROLES))
    for j in range(NUM_ROLES):
        block[j, 4 * j:4 * j + 4] = L[j][:, 0]
        block[32 + 3 * j:32 + 3 * j + 3, 4 * j:4 * j + 4] = L[j][:, 1:].T
    bias = np.where(mask[:, None], 0.0, np.array([1.0, 0.0, 0.0, 0.0])).reshape(-1)
    node("Add", [node("MatMul", [e, const("mean_left", block)], "q_raw"), const("q_bias", bias)], "q")
    # the hips' matrix_basis quaternion and location through each character's hips map (live.LiveCharacter.hips_map)
    hv = node("Reshape", [node("Slice", [vec, i64("hs", [0]), i64("he", [16]), i64("hax", [1])], "hips_vec"),
                          i64("shape_h", [-1, 1, 16])], "hips_vec3")
    hm = node("Reshape", [node("MatMul", [hv, "hips_maps"], "hips_mapped3"), i64("shape_hm", [-1, 10])], "hips_mapped")
    nodes.append(helper.make_node("Split", [hm, i64("split_h", [4, 3, 3])], ["squares", "signs", "hips_location"],
                                  name="split_h", axis=1))
    mag = node("Sqrt", [node("Relu", ["squares"], "squares_pos")], "magnitudes")
    nodes.append(helper.make_node("Split", [mag, i64("split_w", [1, 3])], ["mag_w", "mag_xyz"], name="split_w", axis=1))
    xyz = node("Where", [node("Less", ["signs", const("zero_s", 0.0)], "negative"), node("Neg", ["mag_xyz"], "neg_xyz"),
                         "mag_xyz"], "signed_xyz")
    node("LpNormalization", [node("Concat", ["mag_w", xyz], "hips_q_raw", axis=1)], "hips_q", axis=1, p=2)
    # check (K, 3), every column <= check_limits: |entries| (absurd distances), the rotation deviation (NaN from
    # any non-finite entry reaches it through the products), -2 cos (away from a half turn)
    far = node("ReduceMax", [node("Abs", [vec], "vec_abs")], "far", axes=[1], keepdims=1)
    sc = node("Sub", [node("Add", [sin2, node("Mul", [neg_cos, neg_cos], "c_sq")], "sc"), const("four", 4.0)], "sc4")
    rot_dev = node("ReduceSum", [node("Abs", [sc], "sc_abs"), i64("axes1b", [1])], "rot_dev", keepdims=1)
    near_pi = node("ReduceMax", [neg_cos], "near_pi", axes=[1], keepdims=1)
    node("Concat", [far, rot_dev, near_pi], "check", axis=1)
    outputs = ["q", "feet", "check", "targets_t", "hips_q", "hips_location"]
    if debug:
        node("MatMul", [both, const("P", P)], "inputs")
        outputs += ["inputs"]
    shapes = {"world": [None, 7, 4, 4], "to_character_t": [None, 1, 4, 4], "settings": [None, 6],
              "z_limits": [None, 2], "step_limits": [None, 2], "hips_maps": [None, 16, 10], "previous_feet": [None, 6]}
    out_shapes = {"q": [None, 4 * NUM_ROLES], "feet": [None, 6], "check": [None, 3], "inputs": [None, NUM_INPUTS],
                  "targets_t": [None, 6, 4, 4], "hips_q": [None, 4], "hips_location": [None, 3]}
    info = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch"] + s[1:])
    graph = helper.make_graph(nodes, "neural_ik_runtime", [info(n, shapes[n]) for n in GRAPH_INPUTS],
                              [info(n, out_shapes[n]) for n in outputs], initializer=inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="neural_ik.runtime")
    proto.ir_version = 8
    return proto


class RuntimeEngine:
    """ONNX Runtime on the run-time graph, every input and output bound once to a preallocated float32 buffer.

    The feet output of one tick is the previous_feet input of the next: two bindings swap the two feet buffers, so
    nothing is copied. `previous_feet` is always the buffer holding the latest feet."""
    name = "onnxruntime"

    def __init__(self, model, builder, height, characters, debug=False):
        from .solver import ort_session

        k = characters
        self.session = ort_session(build_runtime_graph(model, builder, height, debug).SerializeToString())
        self.world = np.broadcast_to(np.eye(4, dtype=np.float32), (k, 7, 4, 4)).copy()
        self.to_character_t = np.broadcast_to(np.eye(4, dtype=np.float32), (k, 1, 4, 4)).copy()
        self.settings = np.zeros((k, 6), np.float32)
        self.z_limits = np.zeros((k, 2), np.float32)
        self.step_limits = np.full((k, 2), np.inf, np.float32)
        self.hips_maps = np.zeros((k, 16, 10), np.float32)
        self.feet = (np.zeros((k, 6), np.float32), np.zeros((k, 6), np.float32))
        self.q = np.zeros((k, 4 * NUM_ROLES), np.float32)
        self.check = np.zeros((k, 3), np.float32)
        self.ok = np.zeros((k, 3), bool)
        self.limits = check_limits(height)
        self.targets_t = np.zeros((k, 6, 4, 4), np.float32)
        self.targets = np.swapaxes(self.targets_t, -1, -2)           # character space (a view)
        self.hips_q = np.zeros((k, 4), np.float32)
        self.hips_location = np.zeros((k, 3), np.float32)
        self.inputs = np.zeros((k, NUM_INPUTS), np.float32) if debug else None
        outputs = {"q": self.q, "check": self.check, "targets_t": self.targets_t, "hips_q": self.hips_q,
                   "hips_location": self.hips_location}
        if debug:
            outputs["inputs"] = self.inputs
        self.bindings = []
        for p in (0, 1):
            io = self.session.io_binding()
            for name in GRAPH_INPUTS[:-1]:
                io.bind_cpu_input(name, getattr(self, name))
            io.bind_cpu_input("previous_feet", self.feet[p])
            for name, buf in list(outputs.items()) + [("feet", self.feet[1 - p])]:
                io.bind_output(name, "cpu", 0, np.float32, buf.shape, buf.ctypes.data)
            self.bindings.append(io)
        self.parity = 0
        self.run_binding = self.session.run_with_iobinding

    def set_hips_maps(self, maps):
        """maps (K or 1, 16, 10) acting on vec(hips transform) (row-major); the graph holds it transposed."""
        np.copyto(self.hips_maps, np.asarray(maps)[:, _transposed_rows()[:16]])

    @property
    def previous_feet(self):
        return self.feet[self.parity]

    def run(self):
        """One call; returns True when every character passed the graph's checks."""
        self.run_binding(self.bindings[self.parity])
        self.parity ^= 1
        return np.less_equal(self.check, self.limits, out=self.ok).all()
