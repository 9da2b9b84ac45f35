"""Records: frozen attrs records and enums, errors, the clock, ids and the converter.

Pure data, imported by every layer above; it imports nothing of loom's but itself.
"""
