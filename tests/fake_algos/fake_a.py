"""A fake algorithm script that succeeds: eval return -20.0 + 10.0 * step / total_timesteps + 0.5 * seed."""

from _fake import main

if __name__ == "__main__":
    main("fake_a", offset=-20.0, slope=10.0)
