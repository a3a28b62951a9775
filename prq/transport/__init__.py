"""The I/O boundary: where Redis is, connections, batching and retries, pub/sub."""
