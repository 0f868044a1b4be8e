"""The record store: records, in-flight markers and the sweep index, read and written by every driver process."""
