"""The network's engines at run time: ONNX Runtime with IO binding, or the Model in NumPy where onnxruntime is
missing (and as the reference the ONNX graphs are checked against)."""

import numpy as np

from ..data.features import NUM_INPUTS
from ..skeleton.roles import NUM_ROLES
from .onnx_export import build_onnx


class NumpyEngine:
    """The Model's network in float64, for machines without onnxruntime (and the reference the ONNX graphs are checked
    against): float64 so a character's result does not depend on how many share the call (float32 BLAS sums a
    single row and a block of rows in different orders)."""
    name = "numpy"

    def __init__(self, model, capacity):
        self.model = model
        self.weights = [np.asarray(w, np.float64) for w in model.weights]
        self.mean = np.asarray(model.input_mean, np.float64)
        self.scale = 1.0 / np.asarray(model.input_std, np.float64)
        self.low = np.asarray(model.limit_low, np.float64).reshape(-1)
        self.high = np.asarray(model.limit_high, np.float64).reshape(-1)
        self.inputs = np.zeros((capacity, NUM_INPUTS), np.float32)
        self.outputs = np.zeros((capacity, NUM_ROLES * 3))

    def run(self, rows):
        h = (self.inputs[:rows] - self.mean) * self.scale
        w = self.weights
        for i in range(0, len(w), 2):
            h = h @ w[i] + w[i + 1]
            if i + 2 < len(w):
                h = np.tanh(h)
        np.clip(h, self.low, self.high, out=self.outputs[:rows])
        return self.outputs[:rows]


def ort_session(onnx_bytes):
    """A CPU InferenceSession with one thread (the tick is far too small to split) and full graph optimisation."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])


class OrtEngine:
    """ONNX Runtime with IO binding: buffers bound once per row count, written in place, no per-call allocation."""
    name = "onnxruntime"

    def __init__(self, onnx_bytes, capacity):
        self.session = ort_session(onnx_bytes)
        self.inputs = np.zeros((capacity, NUM_INPUTS), np.float32)
        self.outputs = np.zeros((capacity, NUM_ROLES * 3), np.float32)
        self.bindings = {}

    def binding(self, rows):
        io = self.bindings.get(rows)
        if io is None:
            io = self.session.io_binding()
            io.bind_cpu_input("inputs", self.inputs[:rows])
            io.bind_output("deltas", "cpu", 0, np.float32, (rows, NUM_ROLES * 3), self.outputs[:rows].ctypes.data)
            self.bindings[rows] = io
        return io

    def run(self, rows):
        self.session.run_with_iobinding(self.binding(rows))
        return self.outputs[:rows]


def make_engine(model, onnx_bytes=None, capacity=1, engine="auto"):
    """ONNX Runtime when available (and asked for), else NumPy."""
    if engine in ("auto", "onnxruntime"):
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            if engine == "onnxruntime":
                raise
        else:
            if onnx_bytes is None:
                onnx_bytes = build_onnx(model).SerializeToString()
            return OrtEngine(onnx_bytes, capacity)
    return NumpyEngine(model, capacity)
