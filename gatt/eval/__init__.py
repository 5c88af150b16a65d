"""The evaluation wing: roll out dialogues, score each turn against the instruction (the checks and the answer
gate), write the report (`python -m gatt.eval.evaluate`)."""
