"""``python -m linattn`` is the ``linattn`` command."""

from linattn.cli import app

app()
