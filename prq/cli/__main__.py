"""`python -m prq.cli`: the `prq` command line."""

from prq.cli import main

if __name__ == "__main__":
    main()
