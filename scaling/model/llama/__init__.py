"""The built-in Llama-style decoder: family.py (its entry in the registry), args.py (its shapes and closed-form counts),
decoder.py (the module), flops.py."""
