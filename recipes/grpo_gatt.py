"""GAtt followed by RL on the checks: TRL's GRPO from a GAtt model (or any chat model); the run lives in `gatt.training.grpo`.

  accelerate launch recipes/grpo_gatt.py --config recipes/configs/grpo_gatt.yaml [key=value ...] [--resume]
  python recipes/grpo_gatt.py --config recipes/configs/grpo_gatt.yaml --max-steps 10

Prompts: the start model's own rollouts of instructed dialogues (the instruction in turn one only), cut at turns
2..prompt_turns; reward: the share of the instruction's checks a reply passes, 0 for a reply the answer gate fails.
Every key of the YAML config is a field of `gatt.training.grpo.GRPOGattConfig`, and a flag: `key=value` overrides one (the
value read as YAML), and so does its flag. `--resume` continues from the newest checkpoint in
`output_dir/checkpoints`. Without `user_turns`, the prompts use data_gen's built-in training messages, never the
report's.
"""

import argparse

from data_gen.eval_set import training_turns
from gatt.eval.inputs import load_eval_turns
from gatt.io.cli import exit_on_bad_input
from gatt.io.config import config_parser, dataclass_from_dict, override_keys, read_yaml_config
from gatt.training.grpo import GRPOGattConfig, train_grpo


def main() -> None:
    parser = config_parser(GRPOGattConfig, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a config key")
    given = vars(parser.parse_intermixed_args())
    file, overrides, resume = given.pop("config", None), given.pop("overrides"), given.pop("resume")
    with exit_on_bad_input():
        if overrides and not file:
            raise ValueError("key=value overrides need a --config file (or give the flags: --max-steps 10)")
        values = {**(read_yaml_config(file, overrides) if file else {}), **given}
        config = dataclass_from_dict(GRPOGattConfig, values, str(file or "the command line"), override_keys(overrides))
        config.validate(str(file or "the command line"))
        turns = load_eval_turns(config.user_turns) if config.user_turns else training_turns(config.seed)
        summary = train_grpo(config, turns, resume=resume)
    if summary:
        print(
            f"GRPO: {summary['steps']} steps, {summary['seconds_per_step']} s a step "
            f"({summary['generation_share']:.0%} generating); final model: {config.output_dir}/final"
        )


if __name__ == "__main__":
    main()
