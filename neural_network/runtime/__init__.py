"""Run time: ONNX export and loading, the run-time graph and the solver."""
