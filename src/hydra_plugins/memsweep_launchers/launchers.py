"""hydra-submitit-launcher's launchers (`hydra/launcher=local`, `slurm`), with one change: a sweep told to
stop (memsweep/run/stopping.py) ends with its summary even when a job was killed before it wrote a result.

That is what a terminal's Ctrl-C does under `hydra/launcher=local`: submitit's local controller shares
the terminal's process group, gets the Ctrl-C too, and ends its tasks itself (SIGINT, then SIGKILL a
second later), too soon for a job to finish its step and write its result. submitit then raises
UncompletedJobError as the main process collects the results, and Hydra would end there, with no
summary. The results are on disk, so the sweep ends as a stopped one instead: the summary lists such a
job as `missing`, the sweep exits 130, and resume runs it again. SIGTERM, which the controller forwards
and waits on, ends every job cleanly `interrupted`.

Everything else is the plugin's: its `checkpoint()` returns a DelayedSubmission of the same job, which
submitit requeues on the cluster's time-limit/preemption signal (memsweep.run.stopping.hand_over). They live
here because Hydra instantiates a launcher only from the `hydra_plugins` namespace.
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
