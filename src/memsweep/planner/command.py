"""A plan row as the job a person runs: the plan job's own overrides with the row's options, its micro-batch
(accumulation makes up the batch), its profile, and every step padded to max_seq_len, the step the plan
predicts. plan.md prints each fitting row's command; plan.run runs them (app/confirm.py)."""
import shlex

from ..config.schema import Config
from ..run import task
from .search import PlanRow
from .space import GROUPS

# the config groups a row picks an option of (the rest of its overrides are values)
GROUP_KEYS = (*GROUPS, "hardware")
# keys a row sets, or that make the plan job a plan: left out of the plan job's overrides
ROW_KEYS = (*GROUPS, "accumulation", "hardware", "mode", "plan", "max_steps", "epochs", "data.pad_to_multiple_of")


def base_overrides(given: list[str]) -> list[str]:
    """The plan job's command-line overrides that stay in a row's job: those no row key sets."""
    def key(override: str) -> str:
        return override.split("=", 1)[0].lstrip("+~")

    return [o for o in given if not any(key(o) == k or key(o).startswith(k + ".") for k in ROW_KEYS)]


def row_overrides(row: PlanRow, job: Config, steps: int) -> list[str]:
    """What makes the plan's job this row's job, for `steps` optimizer steps."""
    options = [f"{group}={option}" for group, option in row.combination.options().items()]
    padded = [] if task.images(job.task) else [f"data.pad_to_multiple_of={job.max_seq_len}"]
    return [*options, f"accumulation.steps={row.accumulation}", f"hardware={row.gpu}", f"max_steps={steps}", *padded]


def command(row: PlanRow, job: Config, base: list[str]) -> str:
    """The row's job as one command line."""
    return shlex.join(["python", "train.py", *base, *row_overrides(row, job, job.plan.run_steps)])
