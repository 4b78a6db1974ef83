"""``macula-mcp register``: the macula entry in each MCP client's configuration, edited
surgically."""
