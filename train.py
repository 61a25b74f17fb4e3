"""memsweep's single entrypoint: `python train.py [group=option ...]`, or `-m` to sweep a grid."""
import sys
import warnings

import hydra
from omegaconf import DictConfig

from memsweep.config.hydra_speed import share_config_store_in_repository_copies
from memsweep.config.schema import register_configs
from memsweep.sweep.search import register_resolver

register_configs()
register_resolver()  # a search's direction follows its metric (conf/hparams_search/optuna.yaml)
share_config_store_in_repository_copies()  # `--help` in ~1 s instead of 4+ (see the module)
# conf/hydra/launcher/ray.yaml takes the Ray plugin's name on purpose (`hydra/launcher=ray`), so Hydra checks
# it against the plugin's own schema, and says each time that such matching is deprecated.
warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/ray' is validated against ConfigStore schema")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from memsweep.app.job import run  # imported here so `--help` and `--cfg job` answer fast
    from memsweep.sweep.search import objective

    # The return value is what a hyperparameter sweeper (hparams_search=optuna) optimises.
    return objective(run(cfg), cfg.search, cfg.task.name)


if __name__ == "__main__":
    from memsweep.config.validate_args import arguments
    from memsweep.errors import EXIT_CODES, ConfigError

    try:
        arguments(sys.argv[1:])  # one line where Hydra would answer in many
    except ConfigError as exc:
        print(f"memsweep: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CODES["bad input"])
    main()
