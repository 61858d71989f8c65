# Imports every module the event names (the standard library the host's python imports)
# and reports what failed, and the paths the interpreter and its modules see.
import importlib
import sys


def handle(event, context):
    failed = {}
    for name in event:
        try:
            importlib.import_module(name)
        except BaseException as e:  # SystemExit too: a module must not end the instance
            failed[name] = f"{type(e).__name__}: {e}"
    paths = []
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        for path in [getattr(module, "__file__", None), getattr(spec, "origin", None),
                     *list(getattr(module, "__path__", None) or [])]:
            if isinstance(path, str):
                paths.append(f"{name}: {path}")
    return {
        "failed": failed,
        "imported": sum(name in sys.modules for name in event),
        "module_paths": paths,
        "sys_path": sys.path,
        "prefix": [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix],
        "executable": sys.executable,
    }
