"""`python -m prq.demo`: run the demo with default options (arguments are not read)."""

from __future__ import annotations

from prq.demo.config import DemoConfig
from prq.demo.run import run_demo

if __name__ == "__main__":
    raise SystemExit(run_demo(DemoConfig()))
