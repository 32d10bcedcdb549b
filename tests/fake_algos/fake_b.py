"""A fake algorithm script that succeeds: eval return -30.0 + 20.0 * step / total_timesteps + 0.5 * seed."""

from _fake import main

if __name__ == "__main__":
    main("fake_b", offset=-30.0, slope=20.0)
