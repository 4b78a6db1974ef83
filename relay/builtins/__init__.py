"""The station's built-in procedures (PROTOCOL.md §6.6), their argument parser and how an
answer or a refusal is shaped."""
