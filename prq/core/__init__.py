"""The vocabulary every layer shares: errors, settings, wire models, key names. No I/O."""
