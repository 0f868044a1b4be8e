"""A model the user brings: family.py (its entry in the registry), build.py (import, build, blocks, initialise),
count.py (FLOPs counted, the contract), init.py (what initialisation writes, proven; ties kept), code.py (the
fingerprint of its code)."""
