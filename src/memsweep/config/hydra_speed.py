"""Make Hydra's `--help` answer in about a second instead of four or more.

`--help` lists every option of every config group; for each of the ~150 look-ups Hydra 1.3 builds
a `CachingConfigRepository`, which deep-copies the whole repository including the ConfigStore
(memsweep's schema and the launcher/sweeper plugins' configs): ~30 ms each. The store needs no
copy: `ConfigStore.load` already returns a deep copy of what it hands out, and nothing writes to
the store while configs are composed. So the copies share it; everything else is still copied.
"""
import copy

_PATCHED = False


def share_config_store_in_repository_copies() -> None:
    global _PATCHED
    if _PATCHED:
        return
    from hydra._internal import config_repository
    from hydra.core.config_store import ConfigStore

    cls = config_repository.CachingConfigRepository

    def __init__(self, delegate) -> None:
        store = ConfigStore.instance()
        self.delegate = copy.deepcopy(delegate, {id(store): store})
        self.cache = {}

    original = cls.__init__
    probe = object.__new__(cls)
    original(probe, config_repository.ConfigRepository.__new__(config_repository.ConfigRepository))
    if set(vars(probe)) != {"delegate", "cache"}:  # a Hydra whose class holds more: leave it alone
        return
    cls.__init__ = __init__
    _PATCHED = True
