"""Structured config of the `scaling_slurm` launcher, registered under `hydra/launcher`.

hydra-submitit-launcher's SLURM options (every field of its `submitit_slurm`), plus how a large
sweep is cut into job arrays. conf/hydra/launcher/slurm.yaml builds on it. Without the [slurm] extra
(hydra-submitit-launcher is not installed) the node holds this file's own fields and takes any other key,
so that `hydra/launcher=slurm` still composes and the launcher says which extra is missing when it starts.
"""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

try:
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
except ModuleNotFoundError:
    SlurmQueueConf = None


@dataclass
class ScalingSlurmConf(SlurmQueueConf or object):
    """SLURM job arrays of at most `array_chunk` points, `array_parallelism` of the sweep's points at once."""

    _target_: str = "hydra_plugins.scaling_slurm_launcher.launcher.ScalingSlurmLauncher"
    array_chunk: int = 1000
    """Points per SLURM job array. SLURM refuses arrays past its MaxArraySize (1001 by default), and only
    one array's job objects are held at a time; the next array is submitted once the ones in flight
    leave room under array_parallelism."""


ConfigStore.instance().store(
    group="hydra/launcher",
    name="scaling_slurm",
    node=ScalingSlurmConf if SlurmQueueConf else OmegaConf.to_container(OmegaConf.structured(ScalingSlurmConf)),
    provider="scaling",
)
