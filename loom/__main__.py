"""``python -m loom``: the ``loom`` command line."""

from .service.cli import main

main()
