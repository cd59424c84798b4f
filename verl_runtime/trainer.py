"""SingleControllerTrainer: one controller process drives the actor, critic, reference and reward roles.

``fit()`` is the whole RL loop and reads top to bottom: sample, score, (reference log-probs, values, old
log-probs), advantages, update critic and actor, log, validate, checkpoint. ``step(samples)`` is one policy
update on samples the caller already has (the tutorial's API). The roles run in this process, or with
trainer.n_workers > 1 (or a Ray cluster to join) on Ray actors that train data-parallel (controller/ray_backend.py);
the loop is the same either way.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from verl_runtime import oom, rundir, validation
from verl_runtime.algorithms import apply_kl_penalty, compute_advantage, get_kl_controller, sequence_scores_to_token_level
from verl_runtime.checkpoint import latest_checkpoint, load_newest, rng_state, save_checkpoint, set_rng_state
from verl_runtime.config import Config, diff_configs, mini_batch_size, rollout_world_size, to_yaml, validate, world_size
from verl_runtime.controller import WorkerGroup
from verl_runtime.controller.ray_backend import start_rollout_group, start_worker_groups, uses_ray
from verl_runtime.data import Prompt, batch_indices, encode_prompts, load_rows, make_toy_rows, prompt_token_ids
from verl_runtime.errors import TrainingError, UserError
from verl_runtime.metrics import MetricsWriter, StepClock, format_console_line, format_validation_line
from verl_runtime.trackers import open_trackers
from verl_runtime.models import load_tokenizer, position_ids_from_mask
from verl_runtime.rollout import SamplingParams
from verl_runtime.rollout.base import left_pad
from verl_runtime.rollout_correction import compute_rollout_correction_and_rejection_mask
from verl_runtime.seeding import seed_everything
from verl_runtime.workers import ROLE_CLASSES, build_roles
from verl_runtime.workers.optim import learning_rate
from verl_runtime.workers.reward import decode_responses


OPTIMAL_TOKEN_BASELINES = ("optimal_token_baseline", "tir_optimal_token_baseline")


class SingleControllerTrainer:
    def __init__(self, config: Config, services: dict[str, str] | None = None):
        """services: where the run's services (config.services) serve, {name: base URL}, as
        services.running.running() yields them; None: the URLs the config or the launcher gives."""
        print("[INFO] Initializing SingleControllerTrainer...", flush=True)
        oom.reset()  # an earlier trainer's notes in this process say nothing of this one
        validate(config)
        resolve_world_size(config)
        self.config = config
        print(f"[INFO] Loading pretrained model from {config.model.path}", flush=True)
        roles = ["actor", "reward"] + ["critic"] * (config.algorithm.adv_estimator == "gae") + ["ref"] * needs_ref_worker(config)
        ray = uses_ray(config)  # then the workers are Ray actors and batches leave this process on the CPU
        self.device = torch.device("cpu") if ray else pick_device(config.trainer.device)
        seed_everything(config.trainer.seed)
        self.tokenizer = load_tokenizer(config.model.path)  # builds builtin:tiny first, which the workers load
        self.rollout_workers = self.pipeline = None
        if config.trainer.mode == "separate_async" and not ray:  # processes beside this one, loading as it does
            from verl_runtime.async_rollout import start_rollout_workers

            self.rollout_workers = start_rollout_workers(config, self.device)
        # With Ray, a rule-based reward stays here: scoring costs less than a round trip to the workers.
        local = [role for role in roles if not ray or (role == "reward" and not config.reward.model_path)]
        workers = build_roles(config, local, self.tokenizer, self.device)
        groups = {role: WorkerGroup([worker]) for role, worker in workers.items()}
        if ray:
            remote = [role for role in roles if role not in local]
            groups.update(start_worker_groups(config, remote, build_roles, ROLE_CLASSES))
            if config.trainer.mode == "separate_async":  # a Ray pool of its own, beside the trainer's
                self.rollout_workers = start_rollout_group(config, rollout_world_size(config), build_roles,
                                                           ROLE_CLASSES["rollout"])
        self.actor, self.reward = groups["actor"], groups["reward"]
        self.critic, self.ref = groups.get("critic"), groups.get("ref")
        # With LoRA the reference is the actor with its adapters disabled (verl's ref_in_actor): no second model.
        self.ref_policy = self.actor if needs_reference(config) and self.ref is None else self.ref
        # Who generates: the actor's own engine, or with trainer.mode=separate_async the rollout's own workers
        # (async_rollout.py), started before the roles above are built so that both load side by side.
        self.generator = self.rollout_workers or self.actor
        self.tool_loop = tool_loop(config, self.generator.generate, self.tokenizer, services)  # None: one response per sample
        self.kl_ctrl = get_kl_controller(config.algorithm.kl_ctrl)
        self.global_step = 0
        # The run's length, which a cosine or ratio warm-up schedule needs: fit() knows it; step() callers set it.
        self.total_steps = config.trainer.total_training_steps

    # --- the tutorial's API: one update on given samples ------------------------------------------------------

    def step(self, samples: list[dict]) -> dict[str, float]:
        """One policy update on ``{"prompt", "response", "reward"}`` samples; returns ``loss`` and metrics.

        Samples with the same prompt form a group (GRPO, RLOO). ``loss`` is what was minimised: the actor's
        loss plus, with a critic, the value loss.
        """
        if not samples:
            raise TrainingError("step() needs at least one {'prompt', 'response', 'reward'} sample")
        if len(samples) % self.actor.world_size:
            raise TrainingError(f"step() on {self.actor.world_size} workers needs a multiple of "
                                f"{self.actor.world_size} samples (each trains on an equal share), got {len(samples)}")
        batch = self._encode_samples(samples)
        scores = torch.tensor([float(sample["reward"]) for sample in samples])
        with oom.translated(self.config):
            metrics = self._update(batch, scores, timing={}, mini_batch_size=len(samples))
        self.global_step += 1
        metrics["loss"] = metrics["actor/loss"] + metrics.get("critic/vf_loss", 0.0)
        return metrics

    # --- the whole loop ---------------------------------------------------------------------------------------

    def fit(self) -> None:
        """Train for trainer.num_epochs over data.train_files (or trainer.total_training_steps steps)."""
        cfg = self.config
        run_dir = cfg.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        # Resume first: a refused one (every checkpoint unusable) leaves the run's config.yaml as it was.
        start = self.resume(run_dir) if cfg.trainer.resume == "auto" else 0
        if cfg.trainer.resume == "auto":
            report_config_changes(run_dir, cfg)
        rundir.replace_text(run_dir / rundir.CONFIG_FILE, to_yaml(cfg))
        train = self.load_prompts(cfg.data.train_files, "train")
        val = self.load_prompts(cfg.data.val_files, "val") if cfg.data.val_files else []
        steps_per_epoch = len(batch_indices(len(train), cfg.data.batch_size, cfg.trainer.seed, 0, cfg.data.shuffle))
        total = steps_per_epoch * cfg.trainer.num_epochs
        total = min(total, cfg.trainer.total_training_steps or total)
        self.total_steps = total
        sampling = SamplingParams(
            n=cfg.rollout.n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
            max_new_tokens=cfg.data.max_response_length, do_sample=cfg.rollout.do_sample,
        )
        mini = mini_batch_size(cfg) * cfg.rollout.n  # samples per optimizer step
        if start >= total:
            print(f"[INFO] {run_dir} already finished step {start} of {total}: nothing to do (to train again, set "
                  "trainer.resume=disable or another trainer.experiment_name)", flush=True)
            return
        print(f"[INFO] {len(train)} training prompts, {steps_per_epoch} steps per epoch; steps {start + 1}..{total}"
              f" -> {run_dir}", flush=True)
        trackers = open_trackers(cfg.trainer.trackers, run_dir, cfg.trainer.project_name, cfg.trainer.experiment_name,
                                 cfg.to_dict())
        writer = MetricsWriter(run_dir, tensorboard=cfg.trainer.tensorboard, truncate_after=start, trackers=trackers)

        def prompts_at(step: int) -> list[Prompt]:
            epoch, position = divmod(step - 1, steps_per_epoch)
            rows = batch_indices(len(train), cfg.data.batch_size, cfg.trainer.seed, epoch, cfg.data.shuffle)
            return [train[i] for i in rows[position]]

        def generate(step: int) -> tuple[dict, dict[str, float]]:
            return self._rollout(prompts_at(step), sampling)

        try:
            self.pipeline = self._start_pipeline(start)
            with stop_requests() as stop, oom.translated(cfg):
                if val and cfg.trainer.val_before_train and start == 0:
                    writer.log(0, *self._generating(self._validate_and_show, val, 0))
                clock = StepClock()  # this process's steps: the ETA's
                length_warned = False  # the plan's safe response length passed: said once
                for step in range(start + 1, total + 1):
                    timing: dict[str, float] = {}
                    generations: list[tuple] = []  # validation samples for the trackers (trainer.log_val_generations)
                    started, compute_before = time.perf_counter(), self.compute_s()
                    epoch = (step - 1) // steps_per_epoch
                    prompts = prompts_at(step)
                    off_policy: dict[str, float] = {}

                    with stopped_at(step, run_dir):
                        with timer("gen", timing):
                            if self.pipeline is None:
                                batch, loop_metrics = self._rollout(prompts, sampling)
                            else:  # generated while the step before trained (async_rollout.py); the next ones
                                self.pipeline.fill(step, total, generate)  # start now, to run while this one trains
                                batch, loop_metrics, off_policy = self.pipeline.take(step, generate)
                                timing["wait_prev_gen"] = off_policy.pop("timing_s/wait_prev_gen")
                        batch.update(prompt_fields(prompts, cfg.rollout.n))
                        with timer("reward", timing):
                            scores = self.reward.score(batch)
                        if cfg.algorithm.adv_estimator == "remax":
                            with timer("gen_max", timing):
                                batch["reward_baselines"] = self._generating(self.greedy_baselines, prompts)
                        metrics = self._update(batch, scores, timing, mini)
                        metrics.update(loop_metrics)
                        metrics.update(off_policy)
                        if self.pipeline is not None:  # queued behind the generations handed over: cuts none short
                            with timer("sync_rollout_weights", timing):
                                self.pipeline.push(self.actor.policy_state()[0], step)
                    if val and cfg.trainer.test_freq > 0 and (step % cfg.trainer.test_freq == 0 or step == total):
                        with timer("testing", timing):
                            val_metrics, generations = self._generating(self._validate_and_show, val, step)
                            metrics.update(val_metrics)

                    timing["step"] = time.perf_counter() - started
                    timing["controller"] = timing["step"] - (self.compute_s() - compute_before)  # outside the workers
                    metrics.update(step_metrics(step, epoch, batch, timing))
                    if self.pipeline is not None:
                        metrics.update(self.pipeline.idle_ratios(started, started + timing["step"],
                                                                 timing["wait_prev_gen"]))
                    if not length_warned and (warning := oom.length_warning(metrics.get("response_length/mean"), step, cfg)):
                        print(warning, flush=True)
                        length_warned = True
                    writer.log(step, metrics, generations)
                    print(format_console_line(step, total, metrics, *clock.lap(total - step)), flush=True)
                    self.global_step = step
                    if step == total or stop.signum or (cfg.trainer.save_freq > 0 and step % cfg.trainer.save_freq == 0):
                        self.save(run_dir, step)
                    if stop.signum and step < total:
                        stop.exit_after(step, run_dir)
                if stop.signum:  # it came during the last step, which completed: the run is finished, not stopped
                    print(f"[INFO] {signal.Signals(stop.signum).name} came during the last step, which completed: "
                          "finishing the run", flush=True)
        finally:
            writer.close()
            if self.pipeline is not None:  # its thread stops; its workers too when the loop failed (none waits)
                self.pipeline.close(stop_workers=sys.exc_info()[0] is not None)
                self.pipeline = None
        if cfg.trainer.save_hf:
            self.save_hf(run_dir, total)
        print(f"[INFO] Training finished at step {total}; run directory {run_dir}", flush=True)

    def _start_pipeline(self, version: int):
        """With trainer.mode=separate_async, the rollout thread over the rollout's workers, given the trainer's
        weights (`version` updates into the run) and random stream; else None."""
        if self.rollout_workers is None:
            return None
        from verl_runtime.async_rollout import AsyncRollout

        sampler, ahead = self.config.trainer.sampler, self.config.trainer.separate_async.num_warmup_batches
        threshold = sampler.max_off_policy_threshold
        if sampler.max_off_policy_strategy == "drop" and threshold and ahead > threshold:
            print(f"[WARN] trainer.separate_async.num_warmup_batches={ahead} generates batches {ahead} versions "
                  f"behind, more than trainer.sampler.max_off_policy_threshold={threshold}: each is dropped and "
                  "generated again (max_off_policy_strategy=wait generates fewer ahead instead)", flush=True)
        pipeline = AsyncRollout(self.rollout_workers, ahead, threshold, sampler.max_off_policy_strategy, version)
        pipeline.start(self.actor.policy_state()[0], torch.get_rng_state())
        return pipeline

    def _generating(self, fn, *args):
        """fn(*args), which generates: on the rollout thread with separate_async (behind the generations handed
        over, with the newest weights), else here."""
        return fn(*args) if self.pipeline is None else self.pipeline.run(fn, *args)

    def _rollout(self, prompts: list[Prompt], sampling: SamplingParams) -> tuple[dict, dict[str, float]]:
        """The step's samples (each prompt rollout.n times), and the tool loop's metrics (none without it)."""
        ids = [p.input_ids for p in prompts]
        if self.tool_loop is None:
            return self.generator.generate(ids, sampling), {}
        return self.tool_loop.rollout(ids, [p.extra_info.get("tools_kwargs") or {} for p in prompts], sampling)

    def _update(self, batch: dict, scores: torch.Tensor, timing: dict, mini_batch_size: int) -> dict[str, float]:
        """From scored samples to one policy update (several, with PPO epochs or mini-batches)."""
        cfg = self.config
        if not torch.isfinite(scores).all():
            bad = int((~torch.isfinite(scores)).sum())
            source = self.config.reward.function or self.config.reward.model_path or "the built-in scorer"
            raise TrainingError(f"the reward is not finite for {bad} of {len(scores)} samples: check {source}")
        mask = batch["response_mask"]
        token_level_scores = sequence_scores_to_token_level(scores.to(mask.device, torch.float32), mask)
        if self.ref_policy is not None:
            with timer("ref", timing):
                batch["ref_log_prob"] = self.ref_policy.compute_ref_log_prob(batch)
        if self.critic is not None:
            with timer("values", timing):
                batch["values"] = self.critic.compute_values(batch)
        # verl's on-policy shortcut: with one epoch over one mini-batch the "old" policy is the current one, so the
        # actor takes its old log-probs from its own forward pass instead of a separate one here.
        on_policy = cfg.actor.ppo_epochs == 1 and mini_batch_size >= len(mask) and not cfg.algorithm.use_kl_in_reward
        correction = cfg.algorithm.rollout_correction
        correcting = correction.enabled and cfg.rollout.calculate_log_probs and "rollout_log_probs" in batch
        if correcting and correction.bypass_mode:  # verl's bypass mode: the rollout's log-probs are the old ones
            batch["old_log_prob"] = batch["rollout_log_probs"]
        elif cfg.algorithm.adv_estimator in OPTIMAL_TOKEN_BASELINES:  # they need the old log-probs and sum p^2
            with timer("old_log_prob", timing):
                batch.update(self.actor.compute_log_prob_and_sum_pi_squared(batch))
        elif not on_policy or correcting:  # decoupled correction: weights from the old policy before the update
            with timer("old_log_prob", timing):
                batch["old_log_prob"] = self.actor.compute_log_prob(batch)

        metrics: dict[str, float] = {}
        token_level_rewards = token_level_scores
        if cfg.algorithm.use_kl_in_reward:
            token_level_rewards, current_kl = apply_kl_penalty(
                token_level_scores, batch["old_log_prob"], batch["ref_log_prob"], mask,
                self.kl_ctrl.value, cfg.algorithm.kl_penalty,
            )
            metrics["actor/reward_kl_penalty"] = current_kl
            metrics["actor/reward_kl_penalty_coeff"] = self.kl_ctrl.value
            self.kl_ctrl.update(current_kl, n_steps=cfg.data.batch_size)
        if correcting and not correction.bypass_mode:  # as verl: after the KL reward, before the advantages
            weights, mask, corrected = compute_rollout_correction_and_rejection_mask(
                batch["old_log_prob"], batch["rollout_log_probs"], mask, correction.rollout_is,
                correction.rollout_is_threshold, correction.rollout_is_batch_normalize, correction.rollout_rs,
                correction.rollout_rs_threshold,
            )
            batch["response_mask"] = mask  # rejected tokens leave the advantages and the loss
            if weights is not None:
                batch["rollout_is_weights"] = weights
            metrics.update(corrected)
        with timer("adv", timing):
            batch["advantages"], batch["returns"] = compute_advantage(
                cfg.algorithm.adv_estimator, token_level_rewards, mask, index=batch["uid"], values=batch.get("values"),
                gamma=cfg.algorithm.gamma, lam=cfg.algorithm.lam, norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo,
                reward_baselines=batch.get("reward_baselines"), old_log_probs=batch.get("old_log_prob"),
                sum_pi_squared=batch.get("sum_pi_squared"), rollout_is_weights=batch.get("rollout_is_weights"),
            )
        if self.critic is not None:
            with timer("update_critic", timing):
                metrics.update(self.critic.update(batch, mini_batch_size, self._learning_rate("critic")))
        with timer("update_actor", timing):
            metrics.update(self.actor.update(batch, mini_batch_size, self._learning_rate("actor")))
        # verl logs the learning rate after its scheduler's step: the next update's
        metrics["actor/lr"] = self._learning_rate("actor", after=1)
        if self.critic is not None:
            metrics["critic/lr"] = self._learning_rate("critic", after=1)
        metrics.update(data_metrics(batch, token_level_scores, token_level_rewards, cfg.data.max_prompt_length))
        return metrics

    def greedy_baselines(self, prompts: list[Prompt]) -> torch.Tensor:
        """ReMax's baselines, as verl's trainer makes them: the reward of one greedy response per prompt, repeated for
        the prompt's rollout.n samples."""
        greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=self.config.data.max_response_length)
        baseline, _ = self._rollout(prompts, greedy)
        baseline.update(prompt_fields(prompts, 1))
        return self.reward.score(baseline).float().repeat_interleave(self.config.rollout.n)

    def _learning_rate(self, role: str, after: int = 0) -> float:
        """The role's learning rate for this update (its schedule at the steps done so far), or `after` steps later."""
        return learning_rate(getattr(self.config, role), self.global_step + after, self.total_steps)

    # --- validation, data, checkpoints -------------------------------------------------------------------------

    def validate(self, prompts: list[Prompt], samples: list | None = None) -> dict[str, float]:
        """rollout.val_kwargs.n responses per validation prompt (greedy at temperature 0, else sampled), scored;
        verl's val-core/ and val-aux/ metrics per data source (verl_runtime/validation.py). `samples`, when given,
        gets every (prompt text, response text, score)."""
        cfg = self.config
        kwargs = cfg.rollout.val_kwargs
        sampling = SamplingParams(n=kwargs.n, temperature=kwargs.temperature, top_p=kwargs.top_p, top_k=kwargs.top_k,
                                  do_sample=kwargs.temperature > 0, max_new_tokens=cfg.data.max_response_length)
        sources, uids, rewards, extra = [], [], [], []
        size = cfg.data.val_batch_size or max(len(prompts), 1)
        for start in range(0, len(prompts), size):
            chunk = prompts[start : start + size]
            batch, _ = self._rollout(chunk, sampling)
            batch.update(prompt_fields(chunk, kwargs.n))
            scored = self.reward.score_details(batch)
            rewards += scored["scores"].tolist()
            extra += scored["infos"]
            if samples is not None:
                inputs = self.tokenizer.batch_decode([p.input_ids for p in chunk], skip_special_tokens=True)
                outputs = decode_responses(self.tokenizer, batch)
                samples += zip([text for text in inputs for _ in range(kwargs.n)], outputs, scored["scores"].tolist())
            sources += batch["data_source"]
            uids += [start + uid for uid in batch["uid"]]  # one uid per prompt across chunks
        # verl's reward_extra_infos_dict: the reward, then one list per extra key (None where a sample lacks it)
        keys = dict.fromkeys(key for info in extra for key in info)
        infos = {"reward": rewards, **{key: [info.get(key) for info in extra] for key in keys}}
        return validation.validation_metrics(sources, uids, infos)

    def _validate_and_show(self, prompts: list[Prompt], step: int) -> tuple[dict[str, float], list[tuple]]:
        """The validation metrics, shown, and the samples trainer.log_val_generations sends the trackers."""
        count = self.config.trainer.log_val_generations
        samples = [] if count > 0 else None
        scores = self.validate(prompts, samples)
        print(format_validation_line(step, {k: v for k, v in scores.items() if k.startswith("val-core/")}), flush=True)
        return scores, validation.generations_to_log(*zip(*samples), count) if samples else []

    def load_prompts(self, files: list[str], split: str) -> list[Prompt]:
        """Tokenized prompts of data files, or of a generated toy task ("toy:<task>")."""
        cfg = self.config.data
        rows = []
        for name in files:
            if name.startswith("toy:"):
                size = cfg.toy_size if split == "train" else max(cfg.toy_size // 4, 1)
                rows += make_toy_rows(name.removeprefix("toy:"), size, self.config.trainer.seed + (split != "train"))
            else:
                rows += load_rows(name)
        schemas = self.tool_loop.schemas if self.tool_loop else None
        return encode_prompts(rows, self.tokenizer, cfg.max_prompt_length, cfg.truncation, cfg.apply_chat_template,
                              cfg.filter_overlong_prompts, schemas)

    def save(self, run_dir, step: int) -> None:
        state = {
            "step": step,
            "actor": self.actor.state_dict()[0],  # rank 0's: the whole state, loadable into any worker count
            "critic": self.critic.state_dict()[0] if self.critic is not None else None,
            "kl_coef": self.kl_ctrl.value,
            "rng": rng_state(),
        }
        path = save_checkpoint(run_dir, step, state, keep_last=self.config.trainer.keep_last)
        print(f"[INFO] Saved checkpoint {path}", flush=True)

    def save_hf(self, run_dir, step: int) -> None:
        """Step's checkpoint as a Hugging Face model directory, <run_dir>/hf/step_<N> (trainer.save_hf)."""
        from verl_runtime.export import export_checkpoint

        out = run_dir / rundir.EXPORTS_DIR / rundir.step_dir_name(step)
        _, path = export_checkpoint(run_dir, out, step=step, replace=True)
        print(f"[INFO] Saved Hugging Face model {path} (transformers and vLLM load it)", flush=True)

    def resume(self, run_dir) -> int:
        """Restore the newest usable checkpoint of run_dir, if any; the step to continue after (0: from the start).
        Newer ones that are incomplete or damaged are passed over, one warning line each; where every checkpoint
        is unusable the run is refused (UserError) rather than silently trained again from step 1."""
        path, state, unusable = load_newest(run_dir)
        if path is None and unusable:
            reasons = "; ".join(f"{bad.name}: {why}" for bad, why in unusable)
            raise UserError(f"every checkpoint of {run_dir} is unusable ({reasons}), so it cannot be resumed and "
                            "nothing was trained: to start over deliberately, set trainer.resume=disable (its metrics "
                            "restart) or train under another trainer.experiment_name")
        for bad, why in unusable:
            print(f"[WARN] checkpoint {bad} is unusable ({why}): resuming from {path.name}", flush=True)
        if path is None:
            return 0
        self.actor.load_state_dict(state["actor"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self.kl_ctrl.value = state["kl_coef"]
        set_rng_state(state["rng"])
        self.global_step = state["step"]
        print(f"[INFO] Resumed from {path} (step {state['step']}): run {run_dir} continues (to start over instead: "
              "trainer.resume=disable, or another trainer.experiment_name)", flush=True)
        return state["step"]

    def compute_s(self) -> float:
        """Seconds spent inside worker methods so far (each call counted once, at its slowest rank)."""
        return sum(group.compute_s for group in self.groups())

    def groups(self) -> list:
        """The training roles' worker groups (the rollout's own workers run beside them, not inside a step's time)."""
        return [group for group in (self.actor, self.critic, self.ref, self.reward) if group is not None]

    def close(self) -> None:
        """Stop the Ray workers and the rollout's own (in-process workers need nothing)."""
        for group in [*self.groups(), self.rollout_workers]:
            if hasattr(group, "close"):
                group.close()

    def _encode_samples(self, samples: list[dict]) -> dict:
        """Tensors for given samples: prompt (chat template when configured) + response + EOS, grouped by prompt."""
        tok = self.tokenizer
        prompts, responses, uids = [], [], {}
        for sample in samples:
            prompt = sample["prompt"]
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            prompts.append(prompt_token_ids(messages, tok, self.config.data.apply_chat_template))
            eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
            responses.append(tok.encode(sample["response"], add_special_tokens=False) + eos)
            uids.setdefault(str(prompt), len(uids))
        prompt_ids, prompt_mask = left_pad(prompts, tok.pad_token_id)
        width = max(len(r) for r in responses)
        response_ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in responses])
        response_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in responses])
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
        batch = {
            "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
            "responses": response_ids,
            "response_mask": response_mask,
        }
        batch = {key: value.to(self.device) for key, value in batch.items()}
        batch["uid"] = [uids[str(sample["prompt"])] for sample in samples]
        return batch


# --- helpers ---------------------------------------------------------------------------------------------------


def report_config_changes(run_dir, config: Config) -> dict:
    """Say which keys differ from the config the run last started with (run_dir/config.yaml), and append them to
    run_dir/config-changes.jsonl: a resumed run may train on other settings than its checkpoints did."""
    previous = run_dir / rundir.CONFIG_FILE
    if not previous.is_file():
        return {}
    changes = diff_configs(previous.read_text(encoding="utf-8", errors="replace"), config)
    for key, (old, new) in changes.items():
        print(f"[INFO] config changed since the run's last start: {key}: {_shown(old)} -> {_shown(new)}", flush=True)
    if changes:
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        with open(run_dir / rundir.CONFIG_CHANGES_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"time": now, "changes": changes}) + "\n")
    return changes


def _shown(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)  # YAML's spelling of null, true, lists


def needs_reference(config: Config) -> bool:
    """A reference policy is loaded only when a KL term uses it."""
    return config.actor.use_kl_loss or config.algorithm.use_kl_in_reward


def needs_ref_worker(config: Config) -> bool:
    """A reference model of its own: not with LoRA, where the actor without its adapters is the reference."""
    return needs_reference(config) and not config.model.uses_lora


def resolve_world_size(config: Config) -> None:
    """trainer.n_workers unset: one worker per visible GPU on CUDA, else one; the sizes are then checked again."""
    if config.trainer.n_workers is not None:
        return
    cuda = config.trainer.device != "cpu" and torch.cuda.is_available()
    config.trainer.n_workers = world_size(config.trainer, torch.cuda.device_count() if cuda else 0)
    validate(config)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
        if name == "cpu" and torch.version.cuda:
            _warn_once(f"[WARN] torch here is built for CUDA {torch.version.cuda} but no GPU is visible (give the "
                       "container GPUs: --gpus; a pod: nvidia.com/gpu limits): training on the CPU")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainingError("trainer.device=cuda but no CUDA GPU is visible: set trainer.device=cpu (or auto)")
    return torch.device(name)


_warned: set[str] = set()


def _warn_once(line: str) -> None:
    if line not in _warned:
        _warned.add(line)
        print(line, flush=True)


def tool_loop(config: Config, generate, tokenizer, services: dict[str, str] | None = None):
    """rollout.multi_turn's tool loop over the actor's generate (its tools loaded from the tool config, those that
    call a service of the run given its URL), or None."""
    multi_turn = config.rollout.multi_turn
    if not multi_turn.enable:
        return None
    from verl_runtime.agent.loop import ToolLoop
    from verl_runtime.agent.tools import load_tools
    from verl_runtime.services.running import given_urls

    urls = given_urls(config) if services is None else services
    return ToolLoop(generate, tokenizer, load_tools(multi_turn.tool_config_path, urls), multi_turn,
                    config.data.max_response_length)


def prompt_fields(prompts: list[Prompt], n: int) -> dict[str, list]:
    """Per-sample fields of prompts repeated n times (samples of one prompt adjacent, as the rollout returns them)."""
    repeated = [(i, p) for i, p in enumerate(prompts) for _ in range(n)]
    return {
        "uid": [i for i, _ in repeated],
        "data_source": [p.data_source for _, p in repeated],
        "ground_truth": [p.ground_truth for _, p in repeated],
        "extra_info": [p.extra_info for _, p in repeated],
        "raw_prompt": [p.raw_prompt for _, p in repeated],
    }


def data_metrics(batch: dict, scores: torch.Tensor, rewards: torch.Tensor, max_prompt_length: int) -> dict[str, float]:
    """verl's compute_data_metrics: scores, rewards, advantages, returns, values, lengths, aborted samples.

    As in verl, lengths come from the attention mask, and score/reward statistics leave out aborted (empty)
    responses; when every response is empty those statistics are left out (verl logs NaN). One device sync.
    """
    mask = batch["response_mask"].bool()
    max_response_length = mask.shape[1]
    response_length = batch["attention_mask"][:, -max_response_length:].sum(-1).float()
    prompt_length = batch["attention_mask"][:, :-max_response_length].sum(-1).float()
    non_aborted = response_length > 0
    stats: dict[str, torch.Tensor] = {}

    def describe(name: str, values: torch.Tensor) -> None:
        if values.numel():
            values = values.float()
            stats.update({f"{name}/mean": values.mean(), f"{name}/max": values.max(), f"{name}/min": values.min()})

    describe("critic/score", scores.sum(-1)[non_aborted])
    describe("critic/rewards", rewards.sum(-1)[non_aborted])
    describe("critic/advantages", batch["advantages"][mask])
    describe("critic/returns", batch["returns"][mask])
    if "values" in batch:
        values, returns = batch["values"][mask], batch["returns"][mask]
        describe("critic/values", values)
        stats["critic/vf_explained_var"] = 1 - (returns - values).var() / (returns.var() + 1e-5)
    for name, lengths in (("response_length", response_length), ("response_length_non_aborted", response_length[non_aborted])):
        describe(name, lengths)
        if lengths.numel():
            stats[f"{name}/clip_ratio"] = (lengths == max_response_length).float().mean()
    stats["response/aborted_ratio"] = (~non_aborted).float().mean()
    describe("prompt_length", prompt_length)
    stats["prompt_length/clip_ratio"] = (prompt_length == max_prompt_length).float().mean()
    return dict(zip(stats, torch.stack([v.float().to(mask.device) for v in stats.values()]).tolist()))


# verl's compute_timing_metrics: per-token milliseconds of these phases, over response tokens (gen) or all tokens
_TOKENS_TIMED = {"gen": "response", "ref": "all", "values": "all", "adv": "all", "update_critic": "all", "update_actor": "all"}


def step_metrics(step: int, epoch: int, batch: dict, timing: dict[str, float]) -> dict[str, float]:
    """Timings, throughput and position of one step (verl's timing_s/*, perf/*, training/*).

    timing_s/controller (the step's time outside the workers) is ours; verl has no such phase.
    """
    tokens = int(batch["attention_mask"].sum())
    return {
        **{f"timing_s/{name}": seconds for name, seconds in timing.items()},
        **timing_per_token_metrics(batch, timing),
        "training/global_step": step,
        "training/epoch": epoch,
        "perf/total_num_tokens": tokens,
        "perf/time_per_step": timing["step"],
        "perf/throughput": tokens / timing["step"],
    }


# verl's compute_timing_metrics: per-token milliseconds of these phases, over response tokens (gen) or all tokens
_TOKENS_TIMED = {"gen": "response", "ref": "all", "values": "all", "adv": "all", "update_critic": "all", "update_actor": "all"}


def timing_per_token_metrics(batch: dict, timing: dict[str, float]) -> dict[str, float]:
    """verl's timing_per_token_ms/* for the phases timed."""
    response_width = batch["response_mask"].shape[1]
    counts = {"response": int(batch["attention_mask"][:, -response_width:].sum()), "all": int(batch["attention_mask"].sum())}
    return {
        f"timing_per_token_ms/{name}": timing[name] * 1000 / counts[kind] if counts[kind] else 0.0
        for name, kind in _TOKENS_TIMED.items()
        if name in timing
    }


def validation_metrics(scores_by_source: dict[str, list[float]]) -> dict[str, float]:
    """Validation metrics of one response per prompt and a float reward: val-core/<data_source>/reward/mean@1."""
    sources = [source for source, scores in scores_by_source.items() for _ in scores]
    rewards = [score for scores in scores_by_source.values() for score in scores]
    return validation.validation_metrics(sources, list(range(len(sources))), {"reward": rewards})


# Names we write that verl does not: the controller's own time.
LEGACY_METRICS = ("timing_s/controller",)


@contextlib.contextmanager
def stopped_at(step: int, run_dir):
    """Say at which step training stopped, and which checkpoint is left, when an update fails (e.g. a NaN loss)."""
    oom.note_step(step)
    try:
        yield
    except TrainingError as exc:
        kept = latest_checkpoint(run_dir)
        kept = f"the last checkpoint {kept} is kept" if kept else "no checkpoint was written yet"
        raise TrainingError(f"step {step}: {exc}; training stopped, {kept}") from None


@contextlib.contextmanager
def timer(name: str, timing: dict):
    started = time.perf_counter()
    with oom.phase(name):  # the phase an out-of-memory error names
        yield
    timing[name] = time.perf_counter() - started


# Signals that ask for a stop after the current step: a scheduler's SIGTERM, Ctrl-C, and SIGHUP (the terminal or
# the ssh session that started the run went away: finish cleanly rather than die mid-step).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


# Set by verl-deploy's launchers in a run's container (launchers/jobspec.py: JobSpec.container_env).
RUN_ID_ENV = "VERL_DEPLOY_RUN_ID"


def continue_command(run_dir) -> str:
    """What continues a stopped run: `verl-deploy run --resume RUN` where verl-deploy started it (its container's
    RUN_ID_ENV, its launch record in the run directory, or the plan it passes), else the same command again."""
    run_id = os.environ.get(RUN_ID_ENV)
    if run_dir is not None and not run_id:
        launched = (Path(run_dir) / rundir.LAUNCH_RECORD).is_file() or oom.PLAN_ENV in os.environ
        run_id = Path(run_dir).name if launched else None
    if run_id:
        return f"`verl-deploy run --resume {run_id}` continues it"
    return "run the same command again to continue (trainer.resume=auto, the default, takes the checkpoint up)"


class _StopRequest:
    signum: int | None = None

    def exit_after(self, step: int, run_dir=None) -> None:
        """Leave the loop as the signal asked (its checkpoint is saved): KeyboardInterrupt, or exit 128 + signum."""
        name = signal.Signals(self.signum).name
        print(f"[INFO] {name}: stopped after step {step}; the checkpoint is saved: {continue_command(run_dir)}",
              flush=True)
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + self.signum)


@contextlib.contextmanager
def stop_requests():
    """Turn the first STOP_SIGNALS signal into a request to stop after the current step (a second one acts at once)."""
    request = _StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handle(signum, frame):
        request.signum = signum
        signal.signal(signum, previous[signum])
        # A signal that lands while the main thread writes to the same stream makes this nested write fail
        # ("reentrant call"): the notice is then lost, the stop still happens.
        with contextlib.suppress(RuntimeError):
            print(f"\n[INFO] {signal.Signals(signum).name}: finishing this step, then saving a checkpoint", flush=True)

    previous = {sig: signal.signal(sig, handle) for sig in STOP_SIGNALS}
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["SingleControllerTrainer"]
