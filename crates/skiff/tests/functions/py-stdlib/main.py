# Imports every module the event names (the standard library the host's python imports)
# and reports what failed, and the paths the interpreter and its modules see.
import importlib
import os
import sys


def handle(event, context):
    failed = {}
    for name in event:
        try:
            importlib.import_module(name)
        except BaseException as e:  # SystemExit too: a module must not end the instance
            failed[name] = f"{type(e).__name__}: {e}"
    paths = [("sys.path", p) for p in sys.path]
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        for path in [getattr(module, "__file__", None), getattr(spec, "origin", None),
                     *list(getattr(module, "__path__", None) or [])]:
            if isinstance(path, str):
                paths.append((name, path))
    return {
        "failed": failed,
        "imported": sum(name in sys.modules for name in event),
        "module_paths": [f"{name}: {path}" for name, path in paths],
        # A module's file that is not in the sandbox names some other tree (the host's);
        # sys.path may name what does not exist (python311.zip).
        "absent": [f"{name}: {path}" for name, path in paths
                   if name != "sys.path" and path.startswith("/") and not os.path.exists(path)],
        "sys_path": sys.path,
        "prefix": [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix],
        "executable": sys.executable,
    }
