"""The built-in Llama-style decoder: args.py (its shapes and closed-form counts), decoder.py (the module), flops.py."""
