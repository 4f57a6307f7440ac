"""linattn-cpu-chunked: an out-of-tree linattn backend (chunked-form GDN/KDA prefill on CPUs).

Install it next to linattn (``pip install -e examples/linattn-cpu-chunked``) and the dispatcher
finds it through the ``linattn.backends`` entry point; ``linattn check --backend cpu-chunked``
runs the conformance suite against it.
"""

from .chunked import CHUNK, chunked_prefill, cumsum2

__version__ = "0.1.0"
__all__ = ["CHUNK", "chunked_prefill", "cumsum2"]
