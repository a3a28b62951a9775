"""The two facades applications use: AsyncQueue (asyncio) and Queue (blocking)."""
