"""The plugin module named by the ``linattn.backends`` entry point of this distribution.

linattn reads ``LINATTN_API_VERSION`` before it registers anything: a plugin written for another
plugin API is reported with reason ``api_version`` and never enters dispatch.
"""

from linattn.dispatch.plugin import hookimpl

LINATTN_API_VERSION = "2"


@hookimpl
def linattn_register_backends():
    """Return the backend classes this plugin provides."""
    from .backend import CpuChunkedBackend

    return [CpuChunkedBackend]
