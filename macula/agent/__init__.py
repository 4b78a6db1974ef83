"""The agent layer: petnames, room envelopes and threading, contact policy, ring proofs."""
