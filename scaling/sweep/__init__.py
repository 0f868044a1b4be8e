"""The sweep driver: grid expansion and its forecast, progress, status and named sweep files."""
