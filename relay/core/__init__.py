"""The station's sans-I/O router (PROTOCOL.md §5-§8): ``RouterCore`` and the parts it is made
of. Nothing here does I/O (the import contracts check it)."""
