"""``python -m linattn`` is the ``linattn`` command."""

from linattn.apps.cli import app

app()
