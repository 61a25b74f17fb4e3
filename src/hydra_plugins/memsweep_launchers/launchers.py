"""hydra-submitit-launcher's launchers (`hydra/launcher=local`, `slurm`), with one change: a sweep told to
stop (memsweep/run/stopping.py) ends with its summary even when a job was killed before it wrote a result
(a terminal's Ctrl-C under `hydra/launcher=local`, which submitit's controller gets too): such a job is listed
`missing`, the sweep exits 130, and resume runs it again.

Everything else is the plugin's; they live here because Hydra instantiates a launcher only from the
`hydra_plugins` namespace. Why a Ctrl-C loses results there: docs/guide/running.md.
"""
from collections.abc import Sequence
from typing import Any

from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from memsweep.run import stopping


class _KeepsWhatFinished:
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from submitit.core.utils import UncompletedJobError

        try:
            return super().launch(job_overrides, initial_job_idx)  # type: ignore[misc]
        except UncompletedJobError as exc:
            if stopping.requested() is None:  # a job lost for another reason: submitit's error, as before
                raise
            print(f"[memsweep] a stopped job left no result: {str(exc).splitlines()[0]}", flush=True)
            return []  # the summary reads every job's results from the sweep dir


class LocalLauncher(_KeepsWhatFinished, submitit_launcher.LocalLauncher):
    pass


class SlurmLauncher(_KeepsWhatFinished, submitit_launcher.SlurmLauncher):
    pass
