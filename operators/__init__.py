"""Operators: thin shells that gather inputs from Blender, call the core, and report in plain words.

Each module lists its classes in `classes`; they are registered in the order of MODULES.
"""

import importlib

MODULE_NAMES = (
    "rig",
    "evaluate",
    "data",
    "live",
    "train",
)

_modules = []


def register():
    import bpy

    _modules.clear()
    for name in MODULE_NAMES:
        module = importlib.import_module(f".{name}", __package__)
        _modules.append(module)
        for cls in module.classes:
            bpy.utils.register_class(cls)
        if hasattr(module, "register_extra"):
            module.register_extra()


def unregister():
    import bpy

    for module in reversed(_modules):
        if hasattr(module, "unregister_extra"):
            module.unregister_extra()
        for cls in reversed(module.classes):
            if getattr(cls, "is_registered", False):
                bpy.utils.unregister_class(cls)
    _modules.clear()
