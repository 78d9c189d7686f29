"""How many attention sinks conversion keeps: window + k sinks, untrained
(README.md beside this file)."""
