"""``python -m harness [overrides]`` — see README."""
import hydra

from harness.app import main_entry
from harness.config import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg) -> None:
    main_entry(cfg)


if __name__ == "__main__":
    main()
