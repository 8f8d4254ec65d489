"""Captioning batch job: `ray job submit --working-dir . -- python jobs/caption_batch.py --config CONFIG`.

Re-running the same command resumes: rows already written are skipped (see jobs/README.md).
"""

import sys

from raydec.runtime.entrypoint import job_main

if __name__ == "__main__":
    sys.exit(job_main("caption", __doc__.splitlines()[0]))
