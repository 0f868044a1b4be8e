"""hydra-submitit-launcher's SLURM launcher, for sweeps of thousands of points.

Three changes to how its `launch` submits and waits, none to what a job runs: the launcher and Hydra's state are
pickled once per launch, not once per point; points go out in job arrays of at most `array_chunk`, throttled so
that no more than `array_parallelism` run at once; each task's end is read as it appears, so the driver prints its
progress line and marks each submitted point as queued under its SLURM job id. Details: docs/sweeps.md.
hydra-submitit-launcher and submitit come with the [slurm] extra; without it the class still imports (Hydra's
plugin scan stays quiet) and starting the launcher says what to install.
"""

from typing import Any, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
except ModuleNotFoundError:

    class SlurmLauncher(Launcher):  # type: ignore[no-redef]
        """Stands in for hydra-submitit's launcher without the [slurm] extra: starting it says what to install."""

        def __init__(self, **params: Any) -> None:
            raise ModuleNotFoundError(
                "the SLURM launcher needs the [slurm] extra: pip install 'scaling[slurm]'",
                name="hydra_plugins.hydra_submitit_launcher",
            )

        def setup(self, **kwargs: Any) -> None:
            raise NotImplementedError

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            raise NotImplementedError


class ScalingSlurmLauncher(SlurmLauncher):
    """SLURM launcher that submits a sweep in throttled job arrays and reports each point as it ends."""

    def __init__(self, array_chunk: int, **params: Any) -> None:
        if array_chunk < 1:
            raise ValueError(
                f"hydra.launcher.array_chunk={array_chunk} must be >= 1 (and at most SLURM's MaxArraySize)"
            )
        super().__init__(**params)
        if int(self.params["array_parallelism"]) < 1:
            raise ValueError(f"hydra.launcher.array_parallelism={self.params['array_parallelism']} must be >= 1")
        self.array_chunk = array_chunk

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Submit the points in throttled arrays (see `_impl`); their JobReturns once every one has ended."""
        from ._impl import launch_in_arrays

        assert self.config is not None
        return launch_in_arrays(self, job_overrides, initial_job_idx, self.array_chunk)
