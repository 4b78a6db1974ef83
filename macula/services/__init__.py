"""The house-service contract in one place: procedure names, limits and refusal reasons that
the station (``relay/``) and the MCP layer (``tools/``) both take from here."""
