"""Starting ranks: torchrun, SLURM placement, device leases and the collectives measurement."""
