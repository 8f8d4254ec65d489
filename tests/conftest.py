"""Shared pytest fixtures. Fixture modules live beside this file and are imported here.

Every process of the suite (this one, notebook kernels, CLI subprocesses, job drivers, Ray
workers) runs torch with one intra-op thread: the suite's models are tiny, so a second thread
only adds synchronisation, and with another process on one of the cores every parallel op
waits for its descheduled thread (the quickstart notebook took 19 s idle and over 300 s beside
one busy process with two threads; 18 s and 15 s with one). Draft shapes tuned by the suite
('auto') are cached in a folder of its own, never in the user's ~/.cache/raydec.
"""

import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by every process the tests start
os.environ["RAYDEC_CACHE_DIR"] = tempfile.mkdtemp(prefix="raydec-test-cache-")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from tests.s3_fixture import moto_server, s3_bucket, s3_config  # noqa: F401, E402
from tests.ray_fixture import _ray_session, ray_cluster, stop_shared_cluster  # noqa: F401, E402


def pytest_collection_modifyitems(session, config, items):
    """Note the modules with a test that uses the shared Ray cluster (`ray_cluster`). Under
    pytest-xdist (`make test` runs two workers, `--dist loadgroup`), a module's tests stay on one
    worker (its module-scoped models and clusters are built once), and so do the Serve app's
    (tests/serve/ shares one app per worker)."""
    config._ray_cluster_modules = {item.module.__name__ for item in items if "ray_cluster" in getattr(item, "fixturenames", ())}
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            parts = item.path.relative_to(config.rootpath).parts
            item.add_marker(pytest.mark.xdist_group("serve" if parts[:2] == ("tests", "serve") else "/".join(parts)))


def pytest_runtest_setup(item):
    """A module that does not use the shared Ray cluster runs without it, as if it were alone."""
    module = getattr(item, "module", None)
    if module is not None and module.__name__ not in getattr(item.config, "_ray_cluster_modules", set()):
        stop_shared_cluster()
