"""A short demo of the library's model: SmolLM2-135M-Instruct converted to `GattForCausalLM`, chatting.

The instruction is given once, in the system message; watch whether the replies keep obeying it.
Run: python recipes/chat_demo.py [--turns N] [--instruction TEXT]
"""

import argparse
import time

import torch

from gatt.model.pretrained import load_smollm2

USER_TURNS = [
    "What is the capital of France?",
    "Can you recommend a good book?",
    "How do I boil an egg?",
    "What should I do this weekend?",
    "Tell me something about the ocean.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instruction", default="Always answer in French.", help="system instruction, given once")
    parser.add_argument("--turns", type=int, default=3, help=f"user turns (at most {len(USER_TURNS)})")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()

    start = time.perf_counter()
    model, tokenizer = load_smollm2()
    print(
        f"loaded {type(model).__name__} ({model.num_parameters() / 1e6:.0f}M parameters) in {time.perf_counter() - start:.0f}s"
    )
    messages = [{"role": "system", "content": args.instruction}]
    print(f"[system] {args.instruction}")
    for user in USER_TURNS[: args.turns]:
        messages.append({"role": "user", "content": user})
        inputs = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            output = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
        reply = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()
        messages.append({"role": "assistant", "content": reply})
        print(f"[user] {user}\n[assistant] {reply}")


if __name__ == "__main__":
    main()
