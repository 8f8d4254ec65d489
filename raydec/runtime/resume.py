"""Whether an output folder may take this job's rows: the resume identity (task, model, dtype,
decode config, seed, input location and columns, image size) and the weights' fingerprints recorded in its
manifest must match.

    output, earlier, weights = check_output(job)   # writable, and holding only this job's rows
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Tuple

from raydec.config import DRAFT_METHODS, JACOBI_METHODS, DraftTreeConfig, SamplingConfig
from raydec.io.storage import EarlierOutput, OutputLocation
from raydec.models.registry import REFERENCE_NAME, REFERENCE_T2I_DIR, REFERENCE_VLM_DIR, resolve_draft_path
from raydec.models.sources import describe_source, model_identity
from raydec.runtime.config import JobConfig

logger = logging.getLogger("raydec.runtime.pipeline")


class ResumeMismatchError(ValueError):
    """The output holds results of a job with another model, dtype, decode config, seed or input.

    ``field`` names what differs: one of :data:`RESUME_KEYS`, or "weights" when the settings
    match but the model (or draft) folder now holds other weights than the results were made with.
    """

    ADVICE = "write to a new output.path or delete the old results"

    def __init__(self, detail: str, field: str = "") -> None:
        detail = detail.removesuffix(f"; {self.ADVICE}")  # an unpickled copy passes the whole message back
        super().__init__(f"{detail}; {self.ADVICE}")
        self.detail, self.field = detail, field


RESUME_KEYS = ("task", "model", "dtype", "decode", "seed", "input", "size")
"""Job fields that must equal those of the manifest already in the output for a resume ("input":
where the rows come from and which columns give their ids, seeds, prompts and images; "size": the
image size, unset and 'auto' alike)."""

INPUT_IDENTITY = ("path", "format", "id_column", "seed_column", "prompt_column", "negative_prompt_column", "image_column",
                  "image_uri_column")


def check_output(job: JobConfig) -> Tuple[OutputLocation, EarlierOutput, Dict[str, str]]:
    """(``job``'s output, writable; what earlier runs left there, read once; the fingerprints of
    the weights ``job`` decodes with), once the output's manifest, if any, records this same job
    (``check_resume``). A relative output path is relative to this process's working directory
    (for a submitted job, Ray's copy of the working dir); ``OutputLocation.uri`` is absolute."""
    weights = job_weights(job)
    output = OutputLocation(job.output)
    output.check_writable()
    earlier = output.earlier()
    check_resume(job, earlier, weights)
    return output, earlier, weights


# decode fields a gumbel-coupled row does not depend on (the manifest still records them)
GUMBEL_SPEED_FACTS = ("method", "jacobi", "draft_tree", "draft_model", "draft_dtype")


def check_resume_compatible(job: JobConfig) -> None:
    """Refuse to add rows to ``job``'s output when its manifest records a different job
    (``check_resume`` on what the output holds, read here; the output is not probed)."""
    check_resume(job, OutputLocation(job.output).earlier(), job_weights(job))


def check_resume(job: JobConfig, output: EarlierOutput, weights: Dict[str, str]) -> None:
    """Refuse to add rows to an output whose manifest records a different job, or other weights
    than ``weights`` (``job_weights``: what ``job`` decodes with).

    A resume skips ids already written; mixing in rows made by another model or decode
    config would give one output two meanings. Outputs without a readable manifest pass.
    output: what the output holds from earlier runs (``OutputLocation.earlier``).
    """
    manifest = output.manifest or {}
    earlier = manifest.get("config")
    if not isinstance(earlier, dict):  # no manifest yet
        return
    if not output.has_results:  # e.g. a run whose workers failed to load: nothing to mix with
        logger.info("output %s has a manifest but no results yet: this job replaces it", job.output.path)
        return
    now = _resume_identity(job.model_dump(mode="json"))
    for key, value in _resume_identity(earlier).items():
        if _differs(value, now[key]):
            name, was, is_now = _first_difference(key, value, now[key])
            raise ResumeMismatchError(
                f"{name}: output {job.output.path} holds results written with {name}={was!r}, "
                f"this job has {name}={is_now!r}",
                field=key,
            )
    if "weights" not in manifest:
        logger.warning(
            "output %s was written by a raydec that did not record its weights: this resume cannot check "
            "that the model (and draft) folders still hold the weights its rows were made with", job.output.path,
        )
    for role, fingerprint in (manifest.get("weights") or {}).items():
        if role == "draft" and job.decode.coupling == "gumbel":  # the draft decides speed only: the rows are the seeds'
            continue
        if _differs(fingerprint, weights.get(role)):
            name = job.model if role == "model" else job.decode.draft_model or f"the reference {job.decode.method} draft"
            raise ResumeMismatchError(
                f"weights: output {job.output.path} holds results of {role} weights {fingerprint}, the {role} "
                f"{name} now holds {weights.get(role)} (retrained or replaced since)",
                field="weights",
            )


def job_weights(job: JobConfig) -> Dict[str, str]:
    """Identities of the weights `job` decodes with: the model's, and the draft's for vispec / eagle.

    Recorded in the manifest so a resume after the weights changed is refused, even when `model`
    still names the same folder, hub id, bucket (or "reference"). Nothing is downloaded: a hub id's
    identity is its commit, an ``s3://`` model's its objects' ETags (``sources.model_identity``).
    """
    return weights_of(job.task, job.model, job.decode, s3=job.input.s3)


def weights_of(task: str, model: str, decode: Any, s3: Any = None) -> Dict[str, str]:
    """Identities of the model's weights (and the draft's for vispec / eagle) a ``task`` decodes with."""
    weights = {"model": model_identity(_reference_folder(task, model), s3=s3)}
    if task == "caption" and decode.method in DRAFT_METHODS:
        if decode.draft_model is not None:
            weights["draft"] = model_identity(decode.draft_model, s3=s3, field="decode.draft_model")
        else:
            weights["draft"] = model_identity(resolve_draft_path(model, decode.method, None))
    return weights


def job_models(job: JobConfig) -> Dict[str, Dict[str, str]]:
    """What the manifest records of each model a job names: its name, source, resolved revision
    (``weights``' identity) and the folder it resolves to on each node (``sources.describe_source``)."""
    models = {"model": describe_source(_reference_folder(job.task, job.model), s3=job.input.s3)}
    models["model"]["name"] = job.model
    if job.task == "caption" and job.decode.method in DRAFT_METHODS:
        draft = job.decode.draft_model or resolve_draft_path(job.model, job.decode.method, None)
        models["draft"] = describe_source(draft, s3=job.input.s3)
    if job.vqgan_path is not None:
        models["vqgan"] = describe_source(job.vqgan_path, s3=job.input.s3)
    return models


def _reference_folder(task: str, model: str) -> Any:
    """The shipped folder for "reference", else ``model`` as named."""
    if model == REFERENCE_NAME:
        return REFERENCE_VLM_DIR if task == "caption" else REFERENCE_T2I_DIR
    return model


def _differs(earlier: Any, now: Any) -> bool:
    """Whether a recorded value disagrees with today's; fields a manifest lacks (an older raydec) pass."""
    if earlier is None:
        return False
    if isinstance(earlier, dict) and isinstance(now, dict):
        return any(_differs(value, now.get(key)) for key, value in earlier.items())
    return earlier != now


def _first_difference(name: str, earlier: Any, now: Any) -> tuple[str, Any, Any]:
    """The dotted name and both values of the first nested field where ``_differs`` holds."""
    if isinstance(earlier, dict) and isinstance(now, dict):
        for key, value in earlier.items():
            if _differs(value, now.get(key)):
                return _first_difference(f"{name}.{key}", value, now.get(key))
    return name, earlier, now


def _resume_identity(config: Dict[str, Any]) -> Dict[str, Any]:
    """The RESUME_KEYS of a dumped JobConfig (the seed lives in its input section)."""
    identity = {key: config.get("input", {}).get("seed") if key == "seed" else config.get(key) for key in RESUME_KEYS}
    identity["decode"] = _decode_identity(identity["decode"])
    identity["size"] = None if identity["size"] == "auto" else identity["size"]  # a manifest from before sizes has none
    if isinstance(identity["input"], dict):
        identity["input"] = {key: identity["input"].get(key) for key in INPUT_IDENTITY}
    return identity


def _decode_identity(decode: Any) -> Any:
    """A dumped DecodeConfig with the drafts as decoding uses them: the Jacobi draft only for the
    Jacobi methods, the draft tree resolved from the sampling temperature when unset and left out
    for methods that build no draft tree (a new tree default must not block resuming an SJD job,
    and must block resuming a ViSpec one). In gumbel coupling the method and its drafts are left
    out (``GUMBEL_SPEED_FACTS``): they change how fast rows come, not which."""
    if not isinstance(decode, dict):
        return decode
    decode = dict(decode)
    decode.setdefault("coupling", "rejection")  # a manifest from before couplings decoded in rejection mode
    if decode["coupling"] == "gumbel":  # a row is the seed's whatever drafted it: the draft is a speed fact, not identity
        for key in GUMBEL_SPEED_FACTS:
            decode.pop(key, None)
        return decode
    if "draft" in decode and "jacobi" not in decode:  # a manifest of an earlier release
        decode["jacobi"] = decode.pop("draft")
    if decode.get("method") not in JACOBI_METHODS:
        decode.pop("jacobi", None)  # only the Jacobi methods decode with it
    if "draft_tree" not in decode:
        return decode
    tree = decode.pop("draft_tree")
    if decode.get("method") in DRAFT_METHODS:
        temperature = (decode.get("sampling") or {}).get("temperature", SamplingConfig().temperature)
        decode["draft_tree"] = tree if tree is not None else DraftTreeConfig.for_temperature(temperature).model_dump()
    return decode
