"""The one exception the pipeline raises for bad input or a missing runtime."""

from __future__ import annotations


class PipelineError(Exception):
    """Input that cannot be used, or a runtime piece that is missing.

    The message names the file or the missing piece; the CLI prints it and
    exits with status 2 instead of a traceback.
    """
