"""``Node``: one identity on the mesh over one session to a station, with its liveness,
subscriptions, served procedures, direct dial and counters."""
