"""Shared pytest fixtures. Fixture modules live beside this file and are imported here."""

from tests.s3_fixture import moto_server, s3_bucket, s3_config  # noqa: F401
from tests.ray_fixture import ray_cluster  # noqa: F401
