"""`python -m jobkit ...` runs the click CLI."""

from jobkit.cli import main

if __name__ == "__main__":
    main()
