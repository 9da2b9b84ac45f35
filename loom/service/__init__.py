"""The service surface: the ``loom`` command line, and ``loom serve`` (the HTTP API, operator controls
and web view over the runtime). No semantics of its own."""
