"""``posgeom recipes``: the training recipes and accelerate configs shipped with the package."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("recipes", help="list the shipped training recipes and accelerate configs")
    p.add_argument("--show", metavar="NAME", default=None, help="print one recipe's YAML")


def run(args: argparse.Namespace) -> int:
    import yaml

    from ..app.recipe import accelerate_configs, find_recipe, shipped_recipes

    if args.show:
        print(find_recipe(args.show).read_text(), end="")
        return 0
    recipes = shipped_recipes()
    width = max(len(name) for name in recipes)
    print("recipes (posgeom train --recipe NAME; --set key=value overrides any key):")
    for name, entry in recipes.items():
        values = yaml.safe_load(entry.read_text()) or {}
        print(
            f"  {name:{width}s}  {values.get('model', '?')} on {values.get('data') or 'synthetic'}, "
            f"{values.get('epochs', '?')} epochs, {values.get('img_size', '?')} px"
        )
    print("accelerate configs (posgeom study --preset in100, or accelerate launch --config_file PATH):")
    for name, entry in accelerate_configs().items():
        print(f"  {name:{width}s}  {entry}")
    return 0
