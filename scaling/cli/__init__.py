"""The `scaling` command and every subcommand's argument parsing."""
