"""The entrypoints, wired from the layers below: the job dispatcher behind train.py (job.py), the estimate
command line (`python -m memsweep.app.estimate`, estimate.py), mode=plan (plan.py) and the Hydra callbacks
that announce a sweep's jobs and write its report (callbacks.py). Nothing below imports this package."""
