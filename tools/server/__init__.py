"""The MCP server: tools, resources and prompts over one runtime; its schema, argument
boundary, results, receipts and channel push."""
