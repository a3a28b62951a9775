"""One node: identity, its sender and receiver halves, and its watch loop."""
