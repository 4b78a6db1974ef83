"""``macula-mcp`` over stdio: the first answer before the SDK loads, and the depth guard in
front of its reader."""
