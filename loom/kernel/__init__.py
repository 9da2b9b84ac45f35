"""The kernel: every state change as a deterministic procedure ``x_in_tx(tx, now_ms, ...)``.

Procedures depend only on database state, ``now_ms`` and their arguments: no await, no
I/O besides ``tx``, no wall clock, no randomness.
"""
