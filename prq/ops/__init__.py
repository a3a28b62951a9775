"""The operator's view: endpoints, queues and Redis's health, read without running a node."""
