"""What the tests share: composed configs, synthetic records and DP truths, real points, the SLURM cluster, processes."""
