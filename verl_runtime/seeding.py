"""One seed for Python's, NumPy's and torch's random streams: the controller and every worker process call it
before building their roles, so that a run is the same in one process or across Ray actors."""

import random

import torch


def seed_everything(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
