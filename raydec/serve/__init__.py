"""Online serving on Ray Serve: OpenAI-compatible image generation (SJD-PAC) and vision chat
(ViSpec), requests from many clients decoded together.

    from raydec.serve import ServeConfig, build_app

The public names load on first use, so importing a light module of this package (Serve's HTTP
proxies import ``raydec.serve.http_guard`` while they start) costs no torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_PUBLIC = {
    "app_builder": "raydec.serve.app",
    "build_app": "raydec.serve.app",
    "LimitsConfig": "raydec.serve.config",
    "ServeConfig": "raydec.serve.config",
    "ServedModel": "raydec.serve.config",
    "MediaConfig": "raydec.serve.media",
}

__all__ = ["LimitsConfig", "MediaConfig", "ServeConfig", "ServedModel", "app_builder", "build_app"]
assert sorted(__all__) == sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'raydec.serve' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from raydec.serve.app import app_builder, build_app
    from raydec.serve.config import LimitsConfig, ServeConfig, ServedModel
    from raydec.serve.media import MediaConfig
