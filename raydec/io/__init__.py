"""raydec.io: datasets (local, glob, s3://), image codecs, result writers and manifests.

This layer knows nothing of models; `runtime/` and `jobs/` compose it with the engine.
"""

from raydec.io.config import (
    DatasetSchemaError,
    InputConfig,
    RowFormat,
    IOConfigError,
    OutputConfig,
    OutputNotWritableError,
    S3Config,
)
from raydec.io.datasets import (
    InputFile,
    check_dataset,
    iter_validated_batches,
    list_input_files,
    load_rows,
    read_rows,
    read_table,
)
from raydec.io.filesystem import resolve_filesystem, s3_client
from raydec.io.images import ImageError, attach_caption_images, decode_image, encode_png, load_image
from raydec.io.validation import derive_row_id, derive_seed, validate_caption_rows, validate_t2i_rows
from raydec.io.storage import OutputLocation, check_output_writable
from raydec.io.writers import RESULT_SCHEMA, ResultWriter, completed_ids, error_result, read_manifest, read_results, write_manifest

__all__ = [
    "DatasetSchemaError", "IOConfigError", "ImageError", "InputConfig", "InputFile", "OutputConfig", "RowFormat",
    "OutputLocation", "OutputNotWritableError", "RESULT_SCHEMA", "ResultWriter", "S3Config", "attach_caption_images",
    "check_dataset", "check_output_writable", "completed_ids", "decode_image", "derive_row_id",
    "derive_seed", "encode_png", "error_result", "iter_validated_batches", "list_input_files",
    "load_image", "load_rows", "read_manifest", "read_results", "read_rows", "read_table",
    "resolve_filesystem", "s3_client", "validate_caption_rows", "validate_t2i_rows", "write_manifest",
]
