"""The single-controller tutorial's example (section 4), with `verl` -> `verl_runtime` and a local model directory.

    python examples/seed_api.py [MODEL_DIR]

MODEL_DIR: any local Hugging Face causal-LM directory (the tutorial uses facebook/opt-125m); default
$VERL_MODEL_PATH, else the built-in tiny model's directory (built offline on first use).
"""

import os
import sys

from verl_runtime import trainer
from verl_runtime.models import BUILTIN_TINY, resolve_model_path
from verl_runtime.utils.config import get_default_config
import torch

model_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("VERL_MODEL_PATH") or resolve_model_path(BUILTIN_TINY)

# 获取默认配置
config = get_default_config(algo='ppo')  # 使用PPO算法
config.data.batch_size = 8
config.train.num_epochs = 1
config.model.pretrained_model_name_or_path = model_dir  # 本地模型目录

# 初始化训练器（单控制器模式）
single_controller_trainer = trainer.SingleControllerTrainer(config)

# 模拟生成一批数据
dummy_data = [
    {
        "prompt": "Hello, how are you?",
        "response": "I'm fine, thank you!",
        "reward": torch.tensor(0.8)
    }
] * 4

# 执行一次训练步
output = single_controller_trainer.step(dummy_data)
print("Training step completed.")
print(f"Loss: {output['loss']:.4f}")
