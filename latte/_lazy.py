"""Names a package exports without importing their modules up front: the
package's `__getattr__` (PEP 562) imports a module on the first lookup."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, exports: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: exports maps a name to the
    module that defines it ("module" or "module:attribute"); the value found
    is stored in the package's namespace, so later lookups skip this."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = exports[name].partition(":")
        value = getattr(importlib.import_module(module), attr or name)
        namespace[name] = value
        return value

    return __getattr__
