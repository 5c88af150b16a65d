"""Train a chat model with Ghost Attention (or plain SFT): the loop lives in `gatt.train`.

  accelerate launch recipes/train_gatt.py --config recipes/configs/smoke.yaml [key=value ...] [--resume]
  python recipes/train_gatt.py --config recipes/configs/smoke.yaml

Every key of the YAML config is a field of `gatt.train.TrainConfig`; `key=value` overrides one
(the value is read as YAML: `max_steps=200`, `packing=false`). `--resume` continues from the newest
checkpoint in `output_dir/checkpoints`.
"""

import argparse

from gatt.cli import exit_on_bad_input
from gatt.train import load_config, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML file mirroring gatt.train.TrainConfig")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a config key")
    args = parser.parse_args()
    with exit_on_bad_input():
        train(load_config(args.config, args.overrides), resume=args.resume)


if __name__ == "__main__":
    main()
