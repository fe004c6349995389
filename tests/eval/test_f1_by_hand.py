"""Exact figures worked out by hand: a run end to end over real HTTP, the instant server in every role, on two
hand-made instances whose every matcher label and judge score follows from the instant server's rules
(cupid.serving.servers.instant). The expected numbers below are arithmetic on those labels, not the scoring code's
output.

What the instant server answers (serving/servers/instant.py):
- candidate, inference: the fixed preference P = "Updates should be brief, use bullet points, and end with a clear
  question." (generation: "Here is a short update. " + P);
- decomposer: P split at commas and "and", one item per part, "Does the response satisfy: <part>?";
- matcher: an item's words (lowercase, over 2 letters, stop words out: does, the, response, should, with, use,
  clear, ...) against the preference's words: at least half of them in it -> Fully Covered (1), some -> Partially
  Covered (0.5), none -> Not Covered (0);
- judge: 1 + round(9 * share of the ground-truth preference's words found in the response).

P's words: {updates, brief, bullet, points, end, question}. Its checklist (the inferred one, the same for every
instance), each item's words, "satisfy" always among them:
  i1 "Does the response satisfy: Updates should be brief?"        {satisfy, updates, brief}
  i2 "Does the response satisfy: use bullet points?"              {satisfy, bullet, points}
  i3 "Does the response satisfy: end with a clear question?"      {satisfy, end, question}
"""

import json

import pytest

from cupid.eval.benchmark.runner import RunConfig, run
from tests.helpers import write_endpoints

INFERRED = [
    "Does the response satisfy: Updates should be brief?",
    "Does the response satisfy: use bullet points?",
    "Does the response satisfy: end with a clear question?",
]

# Instance A. Its preference's words: {updates, brief, end, question}.
#   precision (inferred items against A's preference): i1 2/3 Fully (1), i2 0/3 Not (0), i3 2/3 Fully (1): 2 of 3
#   recall (A's items against P): "Is it brief?" {brief} 1/1 Fully (1); "Does it end with a question?"
#     {end, question} 2/2 Fully (1); "Is it written in French?" {written, french} 0 Not (0); "Does it cite three
#     sources?" {cite, three, sources} 0 Not (0): 2 of 4
#   P 2/3, R 1/2, F1 2*(2/3)*(1/2) / (2/3 + 1/2) = (2/3) / (7/6) = 4/7
A = {
    "persona_id": "hand-01",
    "instance_type": "consistent",
    "current_request": "Can you write today's update for the team?",
    "current_context_factor": "the team",
    "current_contextual_preference": "Updates should be brief and end with a question.",
    "current_checklist": [
        "Is it brief?",
        "Does it end with a question?",
        "Is it written in French?",
        "Does it cite three sources?",
    ],
}
# Instance B. Its preference's words: {reports, bullet, points, cite, sources}.
#   precision: i1 0/3 Not (0), i2 2/3 Fully (1), i3 0/3 Not (0): 1 of 3
#   recall: "Does it use bullet points?" {bullet, points} 2/2 Fully (1); "Does it end with three citations?"
#     {end, three, citations} 1/3 Partially (0.5): 1.5 of 2
#   P 1/3, R 3/4, F1 2*(1/3)*(3/4) / (1/3 + 3/4) = (1/2) / (13/12) = 6/13
B = {
    "persona_id": "hand-02",
    "instance_type": "changing",
    "current_request": "Can you write the monthly report?",
    "current_context_factor": "the monthly report",
    "current_contextual_preference": "Reports should use bullet points and cite sources.",
    "current_checklist": ["Does it use bullet points?", "Does it end with three citations?"],
}
# Micro (sums over both): P (2 + 1) / (3 + 3) = 1/2; R (2 + 1.5) / (4 + 2) = 7/12;
#   F1 2*(1/2)*(7/12) / (1/2 + 7/12) = (7/12) / (13/12) = 7/13 = 0.538462
# Macro (means of A's and B's): P (2/3 + 1/3) / 2 = 1/2; R (1/2 + 3/4) / 2 = 5/8 = 0.625;
#   F1 (4/7 + 6/13) / 2 = (52 + 42) / 182 = 47/91 = 0.516484
# Micro and macro differ in recall and F1 (precision alike: both instances have 3 inferred items, as every instance
# of an instant candidate does); precision and recall differ, so swapping the directions (recall from the inferred
# items, precision from the ground truth's) gives micro P 7/12 and R 1/2, and fails. The F1 of macro P and R,
# 2*(1/2)*(5/8) / (1/2 + 5/8) = 5/9 = 0.5556, is not the macro F1 either.
#
# Generation (standard): the response "Here is a short update. " + P has the words {here, short, update, updates,
# brief, bullet, points, end, question}. A's preference: 4 of its 4 words -> 1 + round(9 * 1) = 10; B's: 2 of 5
# (bullet, points) -> 1 + round(3.6) = 5. Mean (10 + 5) / 2 = 7.5.


def session(preference: str) -> dict:
    return {
        "context_factor": "work",
        "contextual_preference": preference,
        "dialogue": [
            {"role": "user", "content": "Please draft a note."},
            {"role": "assistant", "content": "Here is a note."},
        ],
    }


def test_exact_figures_worked_out_by_hand(tmp_path, instant_url, cupid_home):
    data = tmp_path / "hand.jsonl"
    rows = [{**row, "prior_interactions": [session(row["current_contextual_preference"])]} for row in (A, B)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    endpoints = write_endpoints(
        tmp_path / "ep.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
    )
    cfg = RunConfig(
        data=str(data),
        endpoints=str(endpoints),
        candidate="instant",
        decomposer="instant",
        matcher="pm",
        judge="instant",
        tasks=["inference", "generation"],
        settings=["standard"],
        out=str(tmp_path / "run"),
        cache=str(tmp_path / "cache.sqlite"),
    )
    summary = run(cfg).summary
    assert (summary.n_runs, summary.n_scored, summary.n_failed) == (4, 4, 0)

    units = {
        (r["persona_id"], r["task"]): r
        for r in map(json.loads, (tmp_path / "run" / "instances.jsonl").read_text().splitlines())
    }
    a, b = units[("hand-01", "inference")], units[("hand-02", "inference")]
    assert a["inferred_checklist"] == b["inferred_checklist"] == INFERRED

    def labels(unit: dict, direction: str) -> list[str]:
        return [m["label"] for m in unit[direction]]

    assert labels(a, "infer_to_gt") == ["Fully Covered", "Not Covered", "Fully Covered"]
    assert labels(a, "gt_to_infer") == ["Fully Covered", "Fully Covered", "Not Covered", "Not Covered"]
    assert labels(b, "infer_to_gt") == ["Not Covered", "Fully Covered", "Not Covered"]
    assert labels(b, "gt_to_infer") == ["Fully Covered", "Partially Covered"]
    assert a["counts"] == {"predicted_matched": 2.0, "n_predicted": 3, "true_matched": 2.0, "n_true": 4}
    assert b["counts"] == {"predicted_matched": 1.0, "n_predicted": 3, "true_matched": 1.5, "n_true": 2}
    assert a["scores"] == pytest.approx({"precision": 2 / 3, "recall": 0.5, "f1": 4 / 7})
    assert b["scores"] == pytest.approx({"precision": 1 / 3, "recall": 0.75, "f1": 6 / 13})

    inference = summary.tasks["inference"].overall
    assert inference.micro.precision == pytest.approx(0.5, abs=1e-9)
    assert inference.micro.recall == pytest.approx(0.583333, abs=1e-6)  # 7/12
    assert inference.micro.f1 == pytest.approx(0.538462, abs=1e-6)  # 7/13
    assert inference.macro.precision == pytest.approx(0.5, abs=1e-9)
    assert inference.macro.recall == pytest.approx(0.625, abs=1e-9)  # 5/8
    assert inference.macro.f1 == pytest.approx(0.516484, abs=1e-6)  # 47/91
    by_type = summary.tasks["inference"].settings["standard"].by_type  # one instance each: its own P/R/F1
    assert by_type["consistent"].micro.f1 == pytest.approx(0.571429, abs=1e-6)  # 4/7
    assert by_type["changing"].macro.recall == pytest.approx(0.75, abs=1e-9)
    assert by_type["contrastive"].n_scored == 0 and by_type["contrastive"].micro is None

    assert (units[("hand-01", "generation")]["score"], units[("hand-02", "generation")]["score"]) == (10, 5)
    assert summary.tasks["generation"].overall.mean_score == 7.5
