"""Federation: stations linked into one mesh (docs/federation.md)."""
