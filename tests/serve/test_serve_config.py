"""The shipped Serve configs: raydec's own file validates as a ServeConfig, the Serve config file
as Ray's ServeDeploySchema with args that validate as a ServeConfig, and `raydec serve
--print-config` reads a file; bad configs name the field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.ray_fixture import REPO_ROOT


def test_reference_serve_config_validates():
    from raydec.serve import ServeConfig

    config = ServeConfig.from_yaml(REPO_ROOT / "cluster/serve/reference.yaml")
    assert {m.task for m in config.models} == {"t2i", "caption"}
    assert [m.decode.method for m in config.models] == ["sjd_pac", "vispec"]


def test_serve_config_file_matches_rays_schema_and_raydecs():
    from ray.serve.schema import ServeDeploySchema

    from raydec.serve import ServeConfig, app_builder

    raw = yaml.safe_load((REPO_ROOT / "cluster/serve/serve_config.yaml").read_text())
    schema = ServeDeploySchema.model_validate(raw) if hasattr(ServeDeploySchema, "model_validate") else ServeDeploySchema.parse_obj(raw)
    (app,) = schema.applications
    assert app.import_path == "raydec.serve:app_builder"
    config = ServeConfig.model_validate(app.args)
    assert config.models[0].autoscaling_config["max_replicas"] == 4
    application = app_builder(app.args)  # the Serve application object the file deploys
    assert type(application).__name__ == "Application"


def test_bad_serve_configs_name_the_field():
    from pydantic import ValidationError

    from raydec.serve import ServeConfig

    cases = {
        "decode.method: 'vispec' does not serve task": {"models": [{"name": "m", "task": "t2i", "decode": {"method": "vispec"}}]},
        "names must be unique": {"models": [{"name": "m", "task": "t2i"}, {"name": "m", "task": "caption", "decode": {"method": "ar"}}]},
        "models.0.nmae": {"models": [{"nmae": "m", "name": "m", "task": "t2i"}]},
        "media.allowed_domains": {"models": [{"name": "m", "task": "t2i"}], "media": {"allowed_domains": ["https://x.com/path"]}},
        "limits.max_n": {"models": [{"name": "m", "task": "t2i"}], "limits": {"max_n": 0}},
        "gpus_per_worker\n  Value error, 2: a replica decodes on one GPU": {"models": [{"name": "m", "task": "t2i", "gpus_per_worker": 2}]},
    }
    for needle, raw in cases.items():
        with pytest.raises(ValidationError) as caught:
            ServeConfig.model_validate(raw)
        assert needle in str(caught.value), (needle, str(caught.value))


def test_keys_from_config_and_environment_stay_secret(monkeypatch):
    from raydec.serve import ServeConfig

    config = ServeConfig.model_validate({"models": [{"name": "m", "task": "t2i"}], "api_keys": ["k-config"], "api_keys_env": "TEST_RAYDEC_KEYS"})
    monkeypatch.setenv("TEST_RAYDEC_KEYS", "k-env1, k-env2")
    assert config.keys() == {"k-config", "k-env1", "k-env2"}
    assert "k-config" not in repr(config) and "k-config" not in str(config.model_dump())


def test_raydec_serve_print_config(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text((REPO_ROOT / "cluster/serve/reference.yaml").read_text())
    done = subprocess.run([sys.executable, "-m", "raydec.cli", "serve", "--config", str(path), "--port", "9001", "--print-config"],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["port"] == 9001 and printed["models"][0]["name"] == "raydec-reference-t2i"
    path.write_text("models: []\n")
    done = subprocess.run([sys.executable, "-m", "raydec.cli", "serve", "--config", str(path)], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT)
    assert done.returncode != 0 and "models" in (done.stderr + done.stdout)
