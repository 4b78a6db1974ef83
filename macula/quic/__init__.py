"""QUIC for client and station: the transport over aioquic or qh3, its acks, pings, path sizes,
stateless resets, receive credit, held streams and datagram reading."""
