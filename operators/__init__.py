"""Operators: thin shells that gather inputs from Blender, call the core, and report in plain words.

Each module lists its classes in `classes`; they are registered in the order of MODULES.
"""

from ..registration import register_modules, unregister_modules

MODULE_NAMES = (
    "rig",
    "evaluate",
    "data",
    "live",
    "train",
)

_modules = []


def register():
    _modules[:] = register_modules(__package__, MODULE_NAMES)


def unregister():
    unregister_modules(_modules)
    _modules.clear()
