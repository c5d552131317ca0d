"""Neural IK: full-body inverse kinematics learned from the rig's own animations.

Blender-specific code lives in operators/, panels/, properties.py, state.py and blender/; the math lives in
neural_network/ (pure NumPy) and never imports bpy.
"""

if __package__:   # pytest imports this file as a plain module when the checkout's folder is not a Python name
    from . import operators, panels, properties


def register():
    properties.register()
    operators.register()
    panels.register()


def unregister():
    panels.unregister()
    operators.unregister()
    properties.unregister()
