"""The sans-I/O client core (PROTOCOL.md §4-§8): its events and channels, the intent a node
replays, which station to dial and when, and what a frame may be before it is sent."""
