"""Train a chat model with Ghost Attention (or plain SFT): the loop lives in `gatt.train`.

  accelerate launch recipes/train_gatt.py --config recipes/configs/smoke.yaml [key=value ...] [--resume]
  python recipes/train_gatt.py --config recipes/configs/smoke.yaml --max-steps 200

Every key of the YAML config is a field of `gatt.train.TrainConfig`, and a flag: `key=value` overrides one (the
value read as YAML: `max_steps=200`, `packing=false`), and so does its flag (`--max-steps 200`, `--no-packing`).
`--resume` continues from the newest checkpoint in `output_dir/checkpoints`.
"""

import argparse

from gatt.cli import exit_on_bad_input
from gatt.config import config_parser, read_yaml_config
from gatt.train import TrainConfig, train


def main() -> None:
    parser = config_parser(TrainConfig, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a config key")
    given = vars(parser.parse_intermixed_args())  # key=value overrides may come before or after the flags
    file, overrides, resume = given.pop("config", None), given.pop("overrides"), given.pop("resume")
    with exit_on_bad_input():
        if overrides and not file:
            raise ValueError("key=value overrides need a --config file (or give the flags: --max-steps 200)")
        values = {**(read_yaml_config(file, overrides) if file else {}), **given}
        train(TrainConfig.from_dict(values, source=str(file or "the command line")), resume=resume)


if __name__ == "__main__":
    main()
