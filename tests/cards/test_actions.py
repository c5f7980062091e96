import pytest

from cards import actions


def test_callback_carries_the_action_and_drops_missing_fields() -> None:
    behaviors = actions.callback(actions.MEMORY_OPEN, path="MEMORY.md", offset=None)
    assert behaviors == [
        {"type": "callback", "value": {"action": "memory.open", "path": "MEMORY.md"}}
    ]


def test_unknown_action_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        actions.callback("memory.explode")


def test_owner_only_actions_are_part_of_the_vocabulary() -> None:
    assert actions.OWNER_ONLY <= actions.ALL


def test_vocabulary_is_documented_in_the_module_docstring() -> None:
    doc = actions.__doc__ or ""
    for name in actions.ALL:
        assert f"``{name}``" in doc
