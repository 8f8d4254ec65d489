"""Reference models that ship with raydec: the shapes world (:mod:`.shapes`), its judge
(:mod:`.judge`), and small trained Janus (text-to-image, :mod:`.janus`) and LLaVA (VLM,
:mod:`.llava`, with its assisted-generation draft in :mod:`.assistant`) checkpoints, their
weights in ``weights/``. ``python -m raydec.reference.train`` retrains any of them.

``load(name)`` and ``REFERENCE_MODELS`` come from :mod:`raydec.reference.load` and are
imported lazily, so ``import raydec.reference`` stays cheap. The submodule and the function
share the name ``load``; the package keeps ``raydec.reference.load`` bound to the
*function* (use ``from raydec.reference.load import ...`` or ``sys.modules`` for the module).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__all__ = ["load", "REFERENCE_MODELS"]

_LOAD_MODULE = "raydec.reference.load"


class _ReferencePackage(types.ModuleType):
    """Keeps the import system from replacing the ``load`` function by the ``load`` submodule."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "load" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _ReferencePackage


def __getattr__(name: str) -> Any:
    """Lazy exports from :mod:`raydec.reference.load`."""
    if name in __all__:
        value = getattr(importlib.import_module(_LOAD_MODULE), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
