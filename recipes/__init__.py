"""The recipes: the project's entry points, each a script too.

`gatt-train` runs `recipes.train_gatt` and `gatt-demo` runs `recipes.demo` (pyproject.toml's
`[project.scripts]`); `python recipes/train_gatt.py`, `accelerate launch -m recipes.train_gatt` and
`python recipes/demo.py` run the same code. The other recipes run as scripts: `python recipes/NAME.py`.
"""
