"""Rewards: verl's GSM8K and MATH scorers number for number, dispatch by data_source, custom functions,
the reward model, the toy task.

The expected values below are what verl's own verl/utils/reward_score/{gsm8k,math_reward}.py return.
"""

import pytest
from conftest import FIXTURES

from verl_runtime.errors import ModelError, RewardFunctionError
from verl_runtime.rewards import RewardModelScorer, default_compute_score, gsm8k, load_reward_fn, math_reward, toy

GSM8K_CASES = [
    # solution, ground truth, method, score, score with format_score=0.1
    ("She has 72. #### 72", "72", "strict", 1.0, 1.0),
    ("#### 1,200", "1200", "strict", 1.0, 1.0),  # commas dropped
    ("#### $72", "72", "strict", 0.0, 0.0),  # a number must follow "#### "
    ("####72", "72", "strict", 0.0, 0.0),
    ("#### 5 wait, no: #### 72", "72", "strict", 1.0, 1.0),  # the last marker counts
    ("#### 71", "72", "strict", 0.0, 0.1),
    ("#### 72.", "72", "strict", 0.0, 0.1),  # the trailing dot is part of the number
    ("#### 72" + "x" * 300, "72", "strict", 0.0, 0.0),  # only the last 300 characters are read
    ("so she has 72 apples.", "72", "strict", 0.0, 0.0),
    ("so she has 72 apples.", "72", "flexible", 1.0, 1.0),  # a lone "." is skipped
    ("a total of 1,200.", "1200", "flexible", 0.0, 0.1),  # flexible keeps commas
    ("-6 degrees", "-6", "flexible", 1.0, 1.0),
    ("no numbers", "72", "flexible", 0.0, 0.0),
]


@pytest.mark.parametrize("solution, truth, method, score, with_format_score", GSM8K_CASES)
def test_gsm8k_scorer_matches_verl(solution, truth, method, score, with_format_score):
    assert gsm8k.compute_score(solution, truth, method=method) == score
    assert gsm8k.compute_score(solution, truth, method=method, format_score=0.1) == with_format_score


MATH_CASES = [
    ("so \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\dfrac12}", "\\frac{1}{2}", 1.0),
    ("The answer is \\boxed 5$.", "5", 1.0),
    ("\\boxed{x = 5}", "5", 1.0),
    ("\\boxed{10\\%}", "10", 1.0),
    ("\\boxed{10 \\text{ cm}}", "10", 1.0),
    ("\\boxed{3/4}", "\\frac{3}{4}", 1.0),
    ("\\boxed{\\sqrt2}", "\\sqrt{2}", 1.0),
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
    ("\\boxed{.5}", "0.5", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{1} then \\boxed{2}", "2", 1.0),
    ("\\boxed{1} then \\boxed{2}", "1", 0.0),
    ("\\boxed{7}", "8", 0.0),
    ("\\boxed{5", "5", 0.0),  # unclosed
    ("\\fbox{5}", "5", 0.0),  # found but not removable: verl scores it 0
    ("no box 5", "5", 0.0),
]


@pytest.mark.parametrize("solution, truth, score", MATH_CASES)
def test_math_boxed_scorer_matches_verl(solution, truth, score):
    assert math_reward.compute_score(solution, truth) == score


def test_boxed_helpers():
    assert math_reward.last_boxed_only_string("a \\boxed{\\frac{1}{2}} b") == "\\boxed{\\frac{1}{2}}"
    assert math_reward.remove_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert math_reward.strip_string("\\dfrac{1}{2}") == "\\frac{1}{2}"
    assert math_reward.strip_string("k = 3/4") == "\\frac{3}{4}"


@pytest.mark.parametrize(
    "data_source, solution, truth, score",
    [
        ("openai/gsm8k", "#### 72", "72", 1.0),
        ("lighteval/MATH", "\\boxed{72}", "72", 1.0),
        ("DigitalLearningGmbH/MATH-lighteval", "\\boxed{7}", "72", 0.0),
        ("math", "\\boxed{\\frac12}", "0.5", -1.0),  # verl sends "math" to DAPO's scorer: exact box, wrong is -1
        ("math", "so \\boxed{0.5}", "0.5", 1.0),
        ("aime2024", "Answer: 204", "204", 1.0),
        ("toy/letter", "aaab", "a", 0.75),
    ],
)
def test_default_compute_score_dispatches_by_data_source(data_source, solution, truth, score):
    result = default_compute_score(data_source, solution, truth, extra_info={"index": 0})
    assert result == score and isinstance(result, float)


def test_a_source_verl_scores_elsewhere_says_so():
    with pytest.raises(RewardFunctionError, match="verl scores it with prime_math"):
        default_compute_score("numina_olympiads", "x", "y")


def test_strip_string_drops_percent_signs_as_verl():
    assert math_reward.strip_string("50\\%") == "50"
    assert math_reward.is_equiv("50\\%", "50")


def test_unknown_data_source_says_what_to_do():
    with pytest.raises(RewardFunctionError, match="no built-in reward for data_source 'my/data'.*reward.function="):
        default_compute_score("my/data", "x", "y")


@pytest.mark.parametrize(
    "response, score",
    [("aaaa", 1.0), ("aabb", 0.5), ("a a\na", 1.0), ("AaAa", 1.0), ("", 0.0), ("   ", 0.0), ("xyz", 0.0)],
)
def test_toy_letter_score(response, score):
    assert toy.letter_score(response, "a") == score


# --- custom reward functions ------------------------------------------------------------------------------


def test_no_spec_is_the_default_scorer():
    assert load_reward_fn(None) is default_compute_score


def test_custom_function_with_verls_signature(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def by_length(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return len(solution_str) / 10\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str == ground_truth)\n"
    )
    fn = load_reward_fn(f"{path}:by_length")
    assert fn("my/data", "hello", "x", {"index": 3}) == 0.5
    # as in verl, the function name defaults to compute_score
    assert load_reward_fn(str(path))("my/data", "yes", "yes", None) == 1.0


def test_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import re\n\ndef compute_score(data_source, solution_str\n    return 1.0\n")
    with pytest.raises(RewardFunctionError) as err:
        load_reward_fn(f"{path}:compute_score")
    message = str(err.value)
    assert f"{path}, line " in message and "SyntaxError" in message and "\n" not in message


def test_error_while_importing_names_file_and_line(tmp_path):
    path = tmp_path / "raises.py"
    path.write_text("import os\n\nTABLE = {}\nLIMIT = TABLE['limit']\n")
    with pytest.raises(RewardFunctionError, match=rf"{path}, line 4: KeyError: 'limit'"):
        load_reward_fn(f"{path}:compute_score")


def test_missing_module_import_names_the_line(tmp_path):
    path = tmp_path / "needs_pkg.py"
    path.write_text("import re\nimport no_such_package_here\n")
    with pytest.raises(RewardFunctionError, match=rf"{path}, line 2: ModuleNotFoundError"):
        load_reward_fn(f"{path}:compute_score")


def test_missing_function_lists_what_the_file_defines(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text("def score_it(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    with pytest.raises(RewardFunctionError, match=r"has no function 'compute_score' \(it defines: score_it\)"):
        load_reward_fn(f"{path}:compute_score")


def test_missing_file(tmp_path):
    with pytest.raises(RewardFunctionError, match="reward function file .*absent.py not found"):
        load_reward_fn(f"{tmp_path / 'absent.py'}:fn")
    with pytest.raises(RewardFunctionError, match="must look like path/to/file.py:function_name"):
        load_reward_fn("not-a-python-file")


# --- reward model -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    """A tiny random Qwen2 sequence-classification model beside the byte-level test tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    out = tmp_path_factory.mktemp("reward_model")
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "data" / "tiny_tokenizer")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_reward_model_scores_each_text_as_if_alone(reward_model_dir):
    scorer = RewardModelScorer(reward_model_dir, micro_batch_size=2)
    texts = ["a short answer", "a much longer answer with more words in it", "42", "aaaa"]
    scores = scorer.score(texts)
    assert len(scores) == 4 and all(isinstance(s, float) for s in scores)
    assert len(set(scores)) == 4  # a random model still tells the texts apart
    # padding in a batch does not change a text's score
    assert scores == pytest.approx([scorer.score([t])[0] for t in texts], abs=1e-5)


def test_reward_model_reads_chats_through_its_template(reward_model_dir):
    scorer = RewardModelScorer(reward_model_dir)
    prompt = [{"role": "user", "content": "Say a."}]
    (chat_score,) = scorer.score_chats([prompt], ["aaa"])
    text = scorer.tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": "aaa"}], tokenize=False)
    assert text.startswith("<|bos|>") and text.count("<|bos|>") == 1
    # the template writes BOS itself; plain scoring adds it, so the same text minus BOS scores the same
    assert chat_score == pytest.approx(scorer.score([text.removeprefix("<|bos|>")])[0], abs=1e-5)


def test_missing_reward_model_directory(tmp_path):
    with pytest.raises(ModelError, match="reward model directory .* not found"):
        RewardModelScorer(tmp_path / "absent")
