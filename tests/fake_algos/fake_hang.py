"""A fake algorithm script that never finishes (for --timeout)."""

from _fake import main

if __name__ == "__main__":
    main("fake_hang", offset=-50.0, slope=1.0, hang=True)
