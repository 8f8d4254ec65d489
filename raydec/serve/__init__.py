"""Online serving on Ray Serve: OpenAI-compatible image generation (SJD-PAC) and vision chat
(ViSpec), requests from many clients decoded together.

    from raydec.serve import ServeConfig, build_app
"""

from raydec.serve.app import app_builder, build_app
from raydec.serve.config import LimitsConfig, ServeConfig, ServedModel
from raydec.serve.media import MediaConfig

__all__ = ["LimitsConfig", "MediaConfig", "ServeConfig", "ServedModel", "app_builder", "build_app"]
