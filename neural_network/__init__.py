"""The math of Neural IK: pure NumPy (plus onnx/onnxruntime for export and inference). Never imports bpy."""
