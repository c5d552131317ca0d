"""Reading and writing rigs: the bone map, rig model, actions (4.2 and 5.x layouts, their sources and tasks), the pose as
keyed and as Blender evaluates it, pose and action writes, control rigs (Rigify)."""
