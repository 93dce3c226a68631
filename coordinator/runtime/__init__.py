"""Applies commands to the core one at a time, owns timers and parked requests,
and releases replies only after the writes they depend on are committed."""
