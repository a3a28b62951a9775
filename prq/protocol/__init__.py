"""The protocol without I/O: Lua steps and their typed calls, flows of effects, outcomes."""
