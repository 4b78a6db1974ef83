"""House services the station hosts as ordinary advertised procedures (DESIGN.md §3)."""
