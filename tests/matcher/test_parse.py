import pytest

from cupid.matcher import parse
from cupid.matcher.parse import ParseError

ITEMS = ["Is the tone stern?", "Is the tone direct?", "Are deadlines stated?"]


def test_preference_first_line_after_header():
    answer = (
        "### Analysis\n\nThe user wants brevity.\n\n### Most Likely Preference\n\n  Keep it short and blunt.  \n"
        "Extra line."
    )
    assert parse.preference(answer) == "Keep it short and blunt."


@pytest.mark.parametrize("answer", ["The user likes short answers.", "### Most Likely Preference\n\n   \n"])
def test_preference_missing_or_empty_is_a_typed_error_with_the_raw_answer(answer):
    with pytest.raises(ParseError) as e:
        parse.preference(answer)
    assert e.value.raw == answer


def test_checklist_fenced_with_prose_around():
    answer = (
        "**Analysis**\n\nTwo aspects.\n\n**Checklist**\n\n"
        '```json\n{\n  "checklist": ["Is it stern?", "Is it direct?"]\n}\n```\nHope this helps!'
    )
    assert parse.checklist(answer) == ["Is it stern?", "Is it direct?"]


def test_a_bare_json_checklist_is_read_with_its_items_stripped():
    assert parse.checklist('{"checklist": [" Is it stern? "]}') == ["Is it stern?"]


def test_an_empty_checklist_in_a_fenced_block_is_an_empty_list():
    assert parse.checklist('```json\n{"checklist": []}\n```') == []


@pytest.mark.parametrize(
    "answer, message",
    [
        ('{"checklist": ["a?", "b?", "c?", "d?", "e?"]}', "at most 4"),
        ('```json\n{"checklist": ["a?", }\n```', "no valid JSON"),
        ('{"items": ["a?"]}', "checklist"),
        ('{"checklist": ["a?", 3]}', "non-empty strings"),
        ("no json here", "no valid JSON"),
    ],
)
def test_checklist_errors(answer, message):
    with pytest.raises(ParseError, match=message) as e:
        parse.checklist(answer)
    assert e.value.raw == answer


def test_matches_results_dialect_fenced_with_reasoning():
    answer = """```json
{
  "results": [
    {"index": 1, "entry": "Is the tone stern?", "reasoning": "yes", "label": "Fully Covered"},
    {"index": 2, "entry": "Is the tone direct?", "reasoning": "partly", "label": "Partially Covered"},
    {"index": 3, "entry": "Are deadlines stated?", "reasoning": "no", "label": "Not Covered"}
  ]
}
```"""
    labels = [m.label for m in parse.matches(answer, ITEMS)]
    assert labels == ["Fully Covered", "Partially Covered", "Not Covered"]


def test_matches_bare_list_with_trailing_explanation_wrong_case_and_order():
    answer = (
        '[{"index": 3, "entry": "x", "label": "not covered"}, {"index": 1, "entry": "y", "label": "FULLY  COVERED"},'
        ' {"index": 2, "entry": "z", "label": "Partially covered"}]\n\nThe first item is covered because...'
    )
    result = parse.matches(answer, ITEMS)
    assert [(m.index, m.entry, m.label) for m in result] == [
        (1, ITEMS[0], "Fully Covered"),
        (2, ITEMS[1], "Partially Covered"),
        (3, ITEMS[2], "Not Covered"),
    ]


def test_matches_without_index_fall_back_to_position():
    answer = '[{"label": "Fully Covered"}, {"label": "Not Covered"}, {"label": "Not Covered"}]'
    assert parse.matches(answer, ITEMS)[0].label == "Fully Covered"


@pytest.mark.parametrize(
    "answer, message",
    [
        ('[{"index": 1, "label": "Fully Covered"}]', "expected 3 labels, got 1"),
        (
            (
                '[{"index": 1, "label": "Fully Covered"}, {"index": 2, "label": "Not Covered"}, '
                '{"index": 3, "label": "Not Covered"}, {"index": 4, "label": "Not Covered"}]'
            ),
            "expected 3 labels, got 4",
        ),
        (
            (
                '[{"index": 1, "label": "Covered"}, {"index": 2, "label": "Not Covered"}, '
                '{"index": 3, "label": "Not Covered"}]'
            ),
            "not one of",
        ),
        (
            (
                '[{"index": 1, "label": "Not Covered"}, {"index": 1, "label": "Not Covered"}, '
                '{"index": 3, "label": "Not Covered"}]'
            ),
            "repeated",
        ),
        ('[{"index": 1, "label": "Not Covered"}, {"index": 2}, {"index": 3, "label": "Not Covered"}]', "no label"),
        ('```json\n[{"index": 1, "label": "Not Covered"},\n```', "no valid JSON"),
        ('{"verdict": "yes"}', "expected a list"),
    ],
)
def test_matches_errors(answer, message):
    with pytest.raises(ParseError, match=message) as e:
        parse.matches(answer, ITEMS)
    assert e.value.raw == answer


@pytest.mark.parametrize(
    "tail, expected",
    [("8", 8), ("8/10", 8), ("**8**", 8), ("8.0", 8), ("Score: 8", 8), ("**10/10**", 10), ("1", 1), ("7.5", 7.5)],
)
def test_judge_score_forms(tail, expected):
    answer = (
        f"### Evaluation of AI Assistant's Response\n\n1. **Item**: fine. 3 points.\n\n### Evaluation Score\n\n{tail}\n"
    )
    assert parse.score(answer) == expected


@pytest.mark.parametrize(
    "answer, message",
    [
        ("### Evaluation Score\n\n11", "outside 1-10"),
        ("### Evaluation Score\n\n0/10", "outside 1-10"),
        ("### Evaluation Score\n\n-3", "outside 1-10"),
        ("### Evaluation Score\n\nExcellent", "no number"),
        ("Score: 8", "no '### Evaluation Score' header"),
    ],
)
def test_judge_score_rejections_are_parse_failures_never_zero(answer, message):
    with pytest.raises(parse.ParseError, match=message) as e:
        parse.score(answer)
    assert e.value.raw == answer


def test_session_summary():
    answer = (
        'Here:\n```json\n{"summaries": [{"session_id": 1, "analysis": "x", "context": [" a "], '
        '"preferences": ["b"]}]}\n```'
    )
    assert parse.session_summary(answer) == {"context": ["a"], "preferences": ["b"]}
    with pytest.raises(parse.ParseError, match="'preferences' must be a non-empty list"):
        parse.session_summary('{"summaries": [{"context": ["a"], "preferences": []}]}')
    with pytest.raises(parse.ParseError, match="summaries"):
        parse.session_summary('{"summary": "a"}')
