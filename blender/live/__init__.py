"""The live tick: where each target comes from (empties, the playing clip, the ground under the feet), one solve per
model, the pose written back; live sessions."""
