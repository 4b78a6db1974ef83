"""Macula wire v2, sans-I/O: deterministic CBOR, framing, the frame catalogue and its signing,
error codes, DHT records and their storage keys, content ids and identities
(``../shared/PROTOCOL.md``). No asyncio, sockets or clock: time and randomness are arguments."""
