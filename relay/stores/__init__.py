"""The station's SQLite stores: DHT records and content, and their limits."""
