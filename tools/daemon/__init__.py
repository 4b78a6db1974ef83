"""``macula-mcp daemon``: one long-lived process per home that hosts the runtimes every harness
session attaches to."""
