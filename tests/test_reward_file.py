"""A reward function file on the caller's host reaches the trainer wherever it runs: mounted read-only beside the
config in a container, carried in the ConfigMap on Kubernetes, used in place by a local run."""

import yaml
from launch_support import QUICKSTART, cli

REWARD = "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"


def _config(tmp_path):
    (tmp_path / "my_reward.py").write_text(REWARD)
    config = tmp_path / "job.yaml"
    config.write_text(QUICKSTART.read_text() + "\nreward:\n  function: my_reward.py:score\n")
    return config


def test_docker_mounts_the_host_reward_file_and_points_the_trainer_at_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config names the file relative to where the user runs the CLI
    result = cli("run", _config(tmp_path), "--dry-run", "--image", "img", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    assert f"{tmp_path}/my_reward.py:/etc/verl-deploy/my_reward.py:ro" in result.output
    assert "reward.function=/etc/verl-deploy/my_reward.py:score" in result.output


def test_kubernetes_carries_the_reward_file_in_the_config_map(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("run", _config(tmp_path), "--dry-run", "--image", "reg.io/img", "--target", "k8s",
                 "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]  # stderr: the tag's warning
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    assert config_map["data"]["my_reward.py"] == REWARD
    assert "reward.function=/etc/verl-deploy/my_reward.py:score" in result.output


def test_a_local_run_uses_the_file_where_it_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("run", _config(tmp_path), "--dry-run", "--target", "local", "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    assert "/etc/verl-deploy" not in result.output
