"""The advice rules, one per module, each a `base.Rule`; registry.py lists them in the order they
are tried. Adding one: docs/architecture.md, "Adding an advice rule"."""
