"""Panels of the Neural IK sidebar tab: they only draw, reading settings and the live/training state.

Each module lists its classes in `classes`; they are registered in the order of MODULES.
"""

from ..registration import register_modules, unregister_modules

MODULE_NAMES = (
    "lists",
    "main",
)

_modules = []


def register():
    _modules[:] = register_modules(__package__, MODULE_NAMES)


def unregister():
    unregister_modules(_modules)
    _modules.clear()
