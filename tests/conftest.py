"""Root of the test suite: helpers live in vectorkit.py (unit) and integration/meshkit.py."""
