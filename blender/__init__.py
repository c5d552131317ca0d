"""Everything that touches Blender besides operators and panels: reading and writing rigs and actions, the live
tick, and the workflows (BVH import, extract, bake, evaluate, the Blender IK baseline, the demo rig)."""
