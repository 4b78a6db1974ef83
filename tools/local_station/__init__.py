"""This home's local station: its process, settings and commands."""
