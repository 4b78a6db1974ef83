"""Rooms as an agent sees them: joining and leaving, saying and reading (the inbox, its read
marks, waits), the outbox that holds says while no station is reachable, and private rooms'
keys and sealing."""
