"""The service surface: the ``loom`` command line (HTTP later). No semantics of its own."""
