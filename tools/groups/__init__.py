"""The ten MCP tool groups, their arguments, views, pages and bounds."""
