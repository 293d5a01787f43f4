"""Load a method plugin from its folder: ``methods/<name>/method.py``."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

from sslbench.errors import SslbenchError
from sslbench.kit.method import REQUIRED_HOOKS, Method


class PluginError(SslbenchError, ValueError):
    pass


def load_method_class(method_dir: str | Path) -> type[Method]:
    """The one ``Method`` subclass defined in ``<method_dir>/method.py``."""
    folder = Path(method_dir)
    path = folder / "method.py"
    if not path.is_file():
        raise PluginError(
            f"{folder}: no method.py. A method folder needs a method.py defining a subclass of "
            "sslbench.Method (copy methods/_template/ to start)."
        )
    module_name = f"sslbench_methods.{folder.name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as err:
        raise PluginError(f"{path}:{err.lineno}: syntax error: {err.msg}. Fix the method file.") from err
    except Exception as err:  # an import error inside the plugin, for example
        raise PluginError(f"{path}: failed to import: {type(err).__name__}: {err}") from err
    classes = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, Method)
        and obj is not Method
        and obj.__module__ == module_name
    ]
    if len(classes) != 1:
        found = [c.__name__ for c in classes]
        raise PluginError(
            f"{path}: expected exactly one subclass of sslbench.Method, found {found or 'none'}. "
            "Define one class `class MyMethod(Method): ...`."
        )
    cls = classes[0]
    missing = [hook for hook in REQUIRED_HOOKS if getattr(cls, hook) is getattr(Method, hook)]
    if missing:
        raise PluginError(f"{path}: {cls.__name__} does not implement the required hook(s) {missing}.")
    return cls
