"""Named adjustments for published rows measured on an older library than the one memsweep installs.

memsweep's estimate is the step of the libraries it installs. A published figure measured years earlier
can differ by what those libraries did then; where the source states its version and the difference is a
documented change of that library, the row is estimated as that version stepped, and the adjustment is
named in the row's note. Nothing here is fitted to a table: each adjustment is a mechanism with its source
and the versions it applies to, and a table that states no version gets none.

- torch's foreach Adam / AdamW before July 2023 made the update's denominator out of place:
  `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`, divided in place by the bias correction, then
  `denom = torch._foreach_add(exp_avg_sq_sqrt, eps)` and `torch._foreach_addcdiv_(params, exp_avgs, denom, ...)`:
  two lists the size of the parameters alive at the update, where the torch memsweep installs keeps one
  (it adds eps in place). pytorch/pytorch issue #97712 ("Foreach optimizers use higher memory due to
  intermediates"); the Adam family was reduced to one intermediate by the PRs of 2023-07-10 (#104898 for
  AdamW, the issue's comment of 2023-07-12 for Adam), so torch 2.0.x and the 2.1 nightlies dated before
  2023-07-10 hold the second list; torch 2.1.0 (October 2023) does not.
"""
import contextlib
import re
from typing import Any, Iterator, Optional

import yaml

# "torch 2.0.0", "torch 2.1.0.dev20230623+cu118", "PyTorch 2.1.0+cu121": the first version the table states
TORCH = re.compile(r"\b(?:py)?torch[ =]+(\d+)\.(\d+)\.(\d+)(?:\.dev(\d{8}))?", re.IGNORECASE)
# (major, minor, nightly date) of the change: the foreach Adam family's PRs merged from 2023-07-10 on, so a 2.1
# nightly dated before keeps two lists; the 2.1.0 release (October 2023) and later keep one
FOREACH_ADAM_ONE_INTERMEDIATE = (2, 1, "20230710")
FOREACH_ADAM = "foreach Adam's second intermediate (torch < 2.1, pytorch#97712)"


def stated_torch(table: dict[str, Any]) -> Optional[tuple[int, int, str]]:
    """(major, minor, nightly date or "" for a release) of the torch the table's set-up states, else None."""
    found = TORCH.search(yaml.safe_dump(table.get("common", {}), width=10_000))
    if found is None:
        return None
    major, minor, _, nightly = found.groups()
    return int(major), int(minor), nightly or ""


def foreach_adam_holds_denom(version: Optional[tuple[int, int, str]]) -> bool:
    """Whether that torch's foreach Adam / AdamW kept the second parameter-sized list (see the module)."""
    if version is None:
        return False
    major, minor, nightly = version
    fixed_major, fixed_minor, fixed_nightly = FOREACH_ADAM_ONE_INTERMEDIATE
    if (major, minor) != (fixed_major, fixed_minor):
        return (major, minor) < (fixed_major, fixed_minor)
    return bool(nightly) and nightly < fixed_nightly  # 2.1.0 itself was released after the change


def adjustments(table: dict[str, Any]) -> list[str]:
    """The names of the adjustments a table's rows are estimated with (empty: the installed libraries)."""
    return [FOREACH_ADAM] if foreach_adam_holds_denom(stated_torch(table)) else []


@contextlib.contextmanager
def stepping_as(names: list[str]) -> Iterator[None]:
    """While a row is estimated: the optimizer steps as the table's torch did."""
    if FOREACH_ADAM not in names:
        yield
        return
    import torch
    import torch.optim.adam as adam

    installed = adam._multi_tensor_adam

    def with_denom(params, grads, exp_avgs, exp_avg_sqs, *args, **kwargs):
        # the older step's sqrt(v) list beside the one the installed step makes: both alive at the update
        older = torch._foreach_sqrt(exp_avg_sqs) if exp_avg_sqs else None
        installed(params, grads, exp_avgs, exp_avg_sqs, *args, **kwargs)
        del older

    adam._multi_tensor_adam = with_denom  # AdamW steps through torch.optim.adam as well
    try:
        yield
    finally:
        adam._multi_tensor_adam = installed
