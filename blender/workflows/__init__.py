"""What the operators call: BVH import and retargeting, extraction, training, bake, evaluation with Blender's IK
baseline, the demo rig."""
