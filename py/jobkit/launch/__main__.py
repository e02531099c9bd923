"""`python -m jobkit.launch <config.yml> [key=value ...]`: the training entry, as `jobkit launch` runs it."""

from jobkit.launch.entry import finish, main

if __name__ == "__main__":
    finish(main())
