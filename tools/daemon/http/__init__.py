"""The daemon's loopback HTTP listener: MCP over Streamable HTTP, its tokens and guard, and the
console behind it."""
