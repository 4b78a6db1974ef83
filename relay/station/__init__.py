"""The station's I/O shell: ``Station`` moves bytes between QUIC and the router core, and the
parts it starts (links, upkeep, waits, drain, TLS)."""
