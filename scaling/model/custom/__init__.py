"""A model the user brings: build.py (import, build, blocks, initialise), count.py (FLOPs counted, the contract)."""
