"""Observability hooks every layer may call: Prometheus counters and tracing spans."""
