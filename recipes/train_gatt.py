"""Train a chat model with Ghost Attention (or plain SFT): the loop lives in `gatt.training.trainer`.

  gatt-train --config recipes/configs/smoke.yaml [key=value ...] [--resume]
  gatt-train --config recipes/configs/smoke.yaml --max-steps 200
  accelerate launch -m recipes.train_gatt --config recipes/configs/smoke.yaml [key=value ...] [--resume]

`gatt-train` is the installed command; `python recipes/train_gatt.py` and `python -m recipes.train_gatt` run the
same code. Under `accelerate launch` (several processes or GPUs, `accelerate config`'s settings) it runs as a module
(`-m recipes.train_gatt`) or as this script, by its path (below).

Every key of the YAML config is a field of `gatt.training.trainer.TrainConfig`, and a flag: `key=value` overrides one (the
value read as YAML: `max_steps=200`, `packing=false`), and so does its flag (`--max-steps 200`, `--no-packing`).
`--resume` continues from the newest checkpoint in `output_dir/checkpoints`.
"""

import argparse
from pathlib import Path

from gatt.io.cli import exit_on_bad_input
from gatt.io.config import config_parser, override_keys, read_yaml_config
from gatt.training.trainer import TrainConfig, train


def accelerate_hint() -> str:
    """How to run this recipe under `accelerate launch`: as a module, or as this script by its path."""
    script = Path(__file__).resolve()
    return (
        "under accelerate launch:\n"
        "  accelerate launch -m recipes.train_gatt --config FILE.yaml [key=value ...] [--resume]\n"
        f"  accelerate launch {script} --config FILE.yaml [key=value ...] [--resume]"
    )


def main() -> None:
    parser = config_parser(
        TrainConfig,
        description=__doc__,
        epilog=accelerate_hint(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a config key")
    given = vars(parser.parse_intermixed_args())  # key=value overrides may come before or after the flags
    file, overrides, resume = given.pop("config", None), given.pop("overrides"), given.pop("resume")
    with exit_on_bad_input():
        if overrides and not file:
            raise ValueError("key=value overrides need a --config file (or give the flags: --max-steps 200)")
        values = {**(read_yaml_config(file, overrides) if file else {}), **given}
        config = TrainConfig.from_dict(values, str(file or "the command line"), override_keys(overrides))
        train(config, resume=resume)


if __name__ == "__main__":
    main()
