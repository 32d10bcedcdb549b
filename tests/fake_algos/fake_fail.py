"""A fake algorithm script that logs 5 evaluations, then fails with exit status 3."""

from _fake import main

if __name__ == "__main__":
    main("fake_fail", offset=-50.0, slope=1.0, fail_after=5)
