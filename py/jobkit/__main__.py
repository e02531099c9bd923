"""`python -m jobkit ...` is `jobkit ...` (the click CLI), for an interpreter without the console script."""

from jobkit.cli import main

if __name__ == "__main__":
    main()
