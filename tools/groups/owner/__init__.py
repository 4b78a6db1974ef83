"""Tools about what the owner (a person) controls, read-only for the model (issue 39)."""
