"""The example notebooks run top to bottom: examples/quickstart.ipynb on the CPU, and
examples/cluster.ipynb against a `ray start --head` cluster on 127.0.0.1 and a moto S3 endpoint.

Each notebook runs with nbclient in a kernel of this test's own interpreter (the venv): the test
writes a kernel spec whose argv names `sys.executable` into a temporary folder, hands jupyter_client
a KernelSpecManager that sees only that folder, and checks from inside the kernel that its
`sys.executable` and `sys.prefix` are the test's. The kernel inherits the test's environment,
which is how the cluster notebook gets its RAY_ADDRESS, RAYDEC_* and AWS_* variables. The kernel
starts in examples/, as Jupyter starts a notebook in its own folder. Notebooks are executed in
memory: the files in the repository stay without outputs (RAYDEC_NOTEBOOK_DUMP=DIR keeps the
executed copies in DIR, to look at).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from tests.ray_fixture import REPO_ROOT, ray_head  # noqa: F401

EXAMPLES = REPO_ROOT / "examples"
KERNEL_NAME = "raydec-test-venv"
KERNEL_PROBE = "import json, sys\nprint('KERNEL-PROBE ' + json.dumps({'executable': sys.executable, 'prefix': sys.prefix}))"


@pytest.fixture(scope="module")
def venv_kernels(tmp_path_factory) -> KernelSpecManager:
    """A KernelSpecManager that knows one kernel, `KERNEL_NAME`: ipykernel on this interpreter."""
    root = tmp_path_factory.mktemp("kernels")
    spec_dir = root / KERNEL_NAME
    spec_dir.mkdir()
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "raydec (test venv)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return KernelSpecManager(kernel_dirs=[str(root)], ensure_native_kernel=False)


def outputs_of(nb) -> tuple[str, list]:
    """All stream and text/plain output of an executed notebook, and its error outputs."""
    texts, errors = [], []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                texts.append(output.text)
            elif output.output_type == "error":
                errors.append(f"{output.ename}: {output.evalue}")
            elif "text/plain" in output.get("data", {}):
                texts.append(output["data"]["text/plain"])
    return "".join(texts), errors


def run_notebook(name: str, kernels: KernelSpecManager, cell_timeout_s: int):
    """Execute examples/<name> top to bottom in the venv kernel (a probe cell first); return it executed."""
    path = EXAMPLES / name
    nb = nbformat.read(path, as_version=4)
    assert not any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), f"{name} is saved with outputs: clear them"
    nb.cells.insert(0, nbformat.v4.new_code_cell(KERNEL_PROBE))
    manager = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=kernels)
    client = NotebookClient(nb, km=manager, timeout=cell_timeout_s, resources={"metadata": {"path": str(EXAMPLES)}})
    started = time.monotonic()
    try:
        client.execute()  # raises CellExecutionError, with the cell and its traceback, on the first error
    finally:
        if manager.has_kernel:  # nbclient shuts down only kernels it created itself
            manager.shutdown_kernel(now=True)
        if os.environ.get("RAYDEC_NOTEBOOK_DUMP"):  # keep the executed notebook (outputs so far) there
            nbformat.write(nb, os.path.join(os.environ["RAYDEC_NOTEBOOK_DUMP"], name))
    print(f"{name}: executed in {time.monotonic() - started:.1f}s")

    text, errors = outputs_of(nb)
    assert not errors, errors
    probe = json.loads(re.search(r"KERNEL-PROBE (\{.*\})", text).group(1))
    assert probe == {"executable": sys.executable, "prefix": sys.prefix}, (probe, sys.executable, sys.prefix)
    assert sys.prefix != sys.base_prefix, f"the tests should run in a virtual environment, not {sys.prefix}"
    return nb, text


@pytest.mark.timeout(300)
def test_quickstart_notebook_runs(venv_kernels, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    nb, text = run_notebook("quickstart.ipynb", venv_kernels, cell_timeout_s=120)
    assert "an image is a 16x16 grid of tokens" in text
    for row in ("text-to-image  ar", "text-to-image  sjd_pac", "captioning     ar", "captioning     vispec"):
        assert row in text, text[-3000:]
    figures = sum("image/png" in output.get("data", {}) for cell in nb.cells for output in cell.get("outputs", []))
    assert figures == 3, f"expected the image grid, the heat map and the histogram, got {figures} figures"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cluster_notebook_runs_the_job_on_s3(ray_head, moto_server, s3_bucket, venv_kernels, monkeypatch):  # noqa: F811
    """The notebook submits the job to the head's dashboard and uses moto for S3; the Serve part
    is skipped (RAYDEC_SERVE_URL unset). AWS credentials: the moto_server fixture's dummy ones."""
    monkeypatch.setenv("RAY_ADDRESS", ray_head["address"])
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the test cluster runs without token auth
    monkeypatch.setenv("RAYDEC_S3_ENDPOINT", moto_server)
    monkeypatch.setenv("RAYDEC_BUCKET", s3_bucket)
    monkeypatch.delenv("RAYDEC_SERVE_URL", raising=False)
    monkeypatch.delenv("RAYDEC_API_KEY", raising=False)

    nb, text = run_notebook("cluster.ipynb", venv_kernels, cell_timeout_s=300)
    assert re.search(r"job raydec-notebook-\S+: SUCCEEDED", text), text[-4000:]
    assert "results: 4 rows, 0 errors" in text, text[-4000:]
    assert "skipping the Serve part" in text

    # what the job wrote, read independently of the notebook
    from raydec.io import OutputConfig, S3Config, read_results

    output_uri = re.search(rf"output (s3://{s3_bucket}/runs/notebook-\S+)", text).group(1)
    s3 = S3Config(endpoint_url=moto_server)
    rows = read_results(OutputConfig(path=output_uri, s3=s3)).to_pylist()
    assert sorted(row["id"] for row in rows) == ["circle", "cross", "diamond", "square"]
    assert all(row["method"] == "sjd_pac" and row["output_uri"].startswith(output_uri + "/images/") for row in rows)
