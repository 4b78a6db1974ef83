"""The station's monitoring port: HTTP, the status page, figures, metrics."""
