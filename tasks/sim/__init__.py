"""The embedded simulator as a target: its processes, and the same spec run in virtual time."""
