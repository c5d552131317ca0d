"""Register the classes of a package's modules in order, and unregister them in reverse.

A module lists its classes in `classes`; optional `register_extra()` / `unregister_extra()` add what is not a class
(handlers, timers, menus).
"""

import importlib

import bpy


def register_modules(package, names):
    """Import `package.<name>` for each name, register its classes; returns the modules, for unregister_modules."""
    modules = []
    for name in names:
        module = importlib.import_module(f".{name}", package)
        modules.append(module)
        for cls in module.classes:
            bpy.utils.register_class(cls)
        if hasattr(module, "register_extra"):
            module.register_extra()
    return modules


def unregister_modules(modules):
    for module in reversed(modules):
        if hasattr(module, "unregister_extra"):
            module.unregister_extra()
        for cls in reversed(module.classes):
            if getattr(cls, "is_registered", False):
                bpy.utils.unregister_class(cls)
