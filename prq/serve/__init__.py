"""The serve loop: run handlers, answer, stop gracefully."""
