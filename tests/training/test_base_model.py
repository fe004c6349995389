"""Every stage's model comes in through base_model.py: the fine-tune's, the export's and the check's base, and GRPO's
policy, so that how a model is found and loaded has one home and no stage imports another for it."""

from __future__ import annotations

import ast

from tests.helpers import REPO

# What finding or loading a model is spelled with: transformers' model class, the prepared models' resolver.
LOADERS = {"AutoModelForCausalLM", "prepared_model"}


def loaders_named(source: str) -> list[str]:
    """Each use of a model loader's name in a module's code (an import of it, a call, an attribute)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.alias) and node.name in LOADERS:
            found.append(node.name)
        elif isinstance(node, ast.Name) and node.id in LOADERS:
            found.append(node.id)
    return found


def test_no_training_module_but_base_model_finds_or_loads_a_model():
    named = {
        str(path.relative_to(REPO)): found
        for path in sorted((REPO / "training").rglob("*.py"))
        if path.name != "base_model.py" and (found := loaders_named(path.read_text()))
    }
    assert named == {}
    # the check can fail: GRPO's policy as it was loaded before base_model.py held it
    before = (
        "from transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained(prepared_model(cfg.policy))\n"
    )
    assert sorted(loaders_named(before)) == ["AutoModelForCausalLM", "AutoModelForCausalLM", "prepared_model"]
