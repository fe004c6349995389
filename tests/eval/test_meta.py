"""Meta-evaluation: Krippendorff's alpha and Pearson r on cases computed by hand, the paper's
r = 0.997 from the spec §6 table, and label pairing across run directories and label files."""

import math

import pytest
from typer.testing import CliRunner

from cupid.cli import app
from cupid.common.config import ConfigError
from cupid.eval.results.meta import (
    agree,
    canonical_label,
    correlate,
    f1_table,
    krippendorff_alpha,
    read_table,
    run_labels,
)
from tests.run_records import inference, scoring, write_run

cli = CliRunner()


def last_line(result) -> str:
    return result.output.strip().splitlines()[-1]


def test_alpha_on_krippendorffs_binary_example():
    # Krippendorff (2011), "Computing Krippendorff's alpha-reliability", two observers, ten units:
    # o_01 = 4 disagreeing units, n_0 = 14, n_1 = 6, n = 20: alpha = 1 - (n-1) o_01 / (n_0 n_1) = 1 - 76/84.
    a = ["No", "Yes", "No", "No", "No", "No", "No", "No", "Yes", "No"]
    b = ["Yes", "Yes", "Yes", "No", "No", "Yes", "No", "No", "No", "No"]
    for level in ("nominal", "ordinal", "interval"):  # two values: every level is the same
        assert krippendorff_alpha(a, b, level) == pytest.approx(1 - 76 / 84)


def test_krippendorffs_alpha_equals_its_hand_computation_on_three_labels():
    # Units (Y,Y) (P,P) (N,N) (Y,P) (P,N). Coincidences: o_YY = o_PP = o_NN = 2, o_YP = o_PY = o_PN = o_NP = 1;
    # n_N = 3, n_P = 4, n_Y = 3, n = 10.
    # Ordinal: d2(N,P) = d2(P,Y) = ((3+4)/2)^2 = 12.25, d2(N,Y) = (3+4+3 - (3+3)/2)^2 = 49.
    #   D_o = 4 * 12.25 / 10 = 4.9; D_e = 2 (12*12.25 + 12*12.25 + 9*49) / (10*9) = 1470/90; alpha = 1 - 441/1470 = 0.7.
    # Nominal: D_o = 4/10, D_e = 2 (12 + 12 + 9) / 90 = 66/90; alpha = 1 - 36/66 = 5/11.
    a, b = ["Yes", "Partial", "No", "Yes", "Partial"], ["Yes", "Partial", "No", "Partial", "No"]
    assert krippendorff_alpha(a, b, "ordinal") == pytest.approx(0.7)
    assert krippendorff_alpha(a, b, "nominal") == pytest.approx(5 / 11)
    assert krippendorff_alpha(["Yes", "Yes"], ["Yes", "Yes"]) is None  # one label only: undefined, not 1 or 0


def test_labels_in_every_spelling():
    assert [canonical_label(x) for x in ("Fully Covered", "partial", "NO", 1, "0.5", 0.0)] == [
        "Yes",
        "Partial",
        "No",
        "Yes",
        "Partial",
        "No",
    ]
    with pytest.raises(ValueError, match="'Maybe'"):
        canonical_label("Maybe")


def _two_matcher_runs(tmp_path):
    """Same candidate answers and checklists, two matchers: the hand case above on five pairs, plus
    one pair on another item (a different decomposition) and one instance B failed on."""
    a = write_run(
        tmp_path / "a",
        [
            inference("p1/consistent", "YP", "N"),
            inference("p2/consistent", "Y", "P"),
            inference("p3/changing", "Y", "Y"),  # B failed here: A-only pairs
        ],
        {"candidate": "m", "matcher": "A"},
    )
    b_second = inference("p2/consistent", "P", "N")
    b_second["infer_to_gt"][0]["entry"] = "another decomposition"
    b = write_run(
        tmp_path / "b",
        [
            inference("p1/consistent", "YP", "N"),
            b_second,
            inference("p3/changing", failed="match_gt_to_infer"),
        ],
        {"candidate": "m", "matcher": "B"},
    )
    return a, b


def test_agree_pairs_by_key_setting_direction_index_and_item(tmp_path):
    a, b = _two_matcher_runs(tmp_path)
    result = agree(run_labels(a), run_labels(b))
    # Shared and comparable: p1 i2g 1 (Y,Y), p1 i2g 2 (P,P), p1 g2i 1 (N,N), p2 g2i 1 (P,N); p2 i2g 1 is another item.
    assert result.n == 4 and len(result.mismatched) == 1 and result.only_a == 2 and result.only_b == 0
    assert result.accuracy == pytest.approx(3 / 4)
    assert result.confusion == [[1, 0, 0], [0, 1, 1], [0, 0, 1]]


def test_agree_cli_run_against_human_label_csv(tmp_path):
    a, _ = _two_matcher_runs(tmp_path)
    human = tmp_path / "human.csv"
    human.write_text(
        "key,setting,direction,index,label\n"
        "p1/consistent,standard,infer_to_gt,1,Yes\n"
        "p1/consistent,standard,infer_to_gt,2,Partial\n"
        "p1/consistent,standard,gt_to_infer,1,No\n"
        "p2/consistent,standard,infer_to_gt,1,Partial\n"
        "p2/consistent,standard,gt_to_infer,1,No\n"
        "p9/consistent,standard,gt_to_infer,1,No\n"
    )
    # A's labels on these five pairs: Y P N Y P against Y P N P N: the hand case above, ordinal alpha 0.7.
    result = cli.invoke(app, ["meta", "agree", str(a), str(human)])
    assert result.exit_code == 0, result.output
    assert last_line(result) == "krippendorff_alpha=0.700 (ordinal)"
    assert "pairs=5 only_a=2 only_b=1 different_items=0" in result.output
    assert "accuracy=0.600" in result.output
    nominal = cli.invoke(app, ["meta", "agree", str(a), str(human), "--level", "nominal"])
    assert last_line(nominal) == f"krippendorff_alpha={5 / 11:.3f} (nominal)"


def test_agree_reads_a_runs_reference_scoring(tmp_path):
    run = write_run(
        tmp_path / "r",
        [
            inference("p1/consistent", "YP", "N", reference=scoring("YN", "N")),
            inference(
                "p2/consistent",
                "Y",
                "P",
                reference={
                    "status": "failed",
                    "error": {"stage": "decompose", "reason": "parse_error", "detail": "no JSON"},
                },
            ),
        ],
        {"candidate": "m", "matcher": "A", "reference": "gpt-4o"},
    )
    result = agree(run_labels(run), run_labels(run, reference=True))
    assert (result.n, result.only_a, result.confusion[1]) == (3, 2, [0, 0, 1])


def test_bad_label_files_name_the_row(tmp_path):
    a, _ = _two_matcher_runs(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"key": "p1/consistent", "direction": "infer_to_gt", "index": 1, "label": "Yes"}\n'
        '{"key": "p1/consistent", "direction": "sideways", "index": 2, "label": "No"}\n'
    )
    result = cli.invoke(app, ["meta", "agree", str(a), str(bad)])
    assert result.exit_code == 2 and f"{bad}:2" in result.output and "sideways" in result.output
    bad.write_text('{"key": "p1/consistent", "direction": "infer_to_gt", "index": 1, "label": "Maybe"}\n')
    result = cli.invoke(app, ["meta", "agree", str(a), str(bad)])
    assert result.exit_code == 2 and f"{bad}:1" in result.output and "Maybe" in result.output


def test_correlate_spec_table_gives_the_papers_r(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the shipped table, by name, from any directory
    result = cli.invoke(app, ["meta", "correlate", "--table", "paper", "--columns", "gpt4o_f1", "prefmatcher_f1"])
    assert result.exit_code == 0, result.output
    assert last_line(result) == "pearson_r=0.997"
    assert "n_models=10" in result.output
    gpt4o = next(line for line in result.output.splitlines() if "│ GPT-4o " in line)
    assert gpt4o.split("│")[2:4] == ["     43.0 ", "           42.0 "]  # one format per column: 43.0, not 43
    ambiguous = cli.invoke(app, ["meta", "correlate", "--table", "paper"])
    assert ambiguous.exit_code == 2 and "--columns" in ambiguous.output


def test_correlate_by_hand(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("model,a,b,c\nx,1,1,\ny,2,2,5\nz,3,4,6\n")
    # mean a = 2, mean b = 7/3: sum dx dy = 3, sum dx^2 = 2, sum dy^2 = 14/3.
    result = correlate(read_table(table), ("a", "b"))
    assert result.r == pytest.approx(3 / math.sqrt(2 * 14 / 3))
    with pytest.raises(ConfigError, match="at least 3 models"):  # c is empty for x
        correlate(read_table(table), ("a", "c"))
    table.write_text("model,a,b\nx,1,oops\n")
    with pytest.raises(ConfigError, match=r"t\.csv:2: column 'b' holds 'oops'"):
        read_table(table)


def test_correlate_from_run_directories_with_reference_scorings(tmp_path):
    # One instance per model. Own matcher F1: 1, 0.5, 0; reference F1: 0.5, 0.5, 0.
    # x = (1, .5, 0), y = (.5, .5, 0): sum dx dy = 1/4, sum dx^2 = 1/2, sum dy^2 = 1/6: r = sqrt(3)/2.
    runs = []
    for model, own, ref in (("m1", "Y", "P"), ("m2", "P", "P"), ("m3", "N", "N")):
        records = [
            inference("p1/consistent", own, own, reference=scoring(ref, ref)),
            inference("p2/consistent", failed="parse_preference"),
        ]
        runs.append(
            write_run(tmp_path / model, records, {"candidate": model, "matcher": "prefmatcher", "reference": "gpt-4o"})
        )
    table = f1_table(runs)
    assert table.values["m1"] == {"prefmatcher": 1.0, "gpt-4o": 0.5}  # the failed instance is not a zero
    result = cli.invoke(app, ["meta", "correlate", *map(str, runs)])
    assert result.exit_code == 0, result.output
    assert last_line(result) == f"pearson_r={math.sqrt(3) / 2:.3f}"
    twice = cli.invoke(app, ["meta", "correlate", *map(str, runs), str(runs[0])])
    assert twice.exit_code == 2 and "same model under the same matcher" in twice.output
