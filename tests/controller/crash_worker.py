"""Run one controller cycle on the tiny target and SIGKILL this process at a stage.

Usage, from the repository root: ``python -m tests.controller.crash_worker DATABASE_URL
POLICY_FILE STAGE`` (the caller's ``AUTOSPEC_DATA_DIR`` is inherited). Prints
``reached STAGE`` just before dying.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

from autospec import store
from autospec.controller.cycle import Controller
from autospec.controller.policy import load_policy
from tests.tiny import tiny_target


def main(url: str, policy_file: str, stage: str) -> None:
    torch.set_num_threads(1)

    def die() -> None:
        print(f"reached {stage}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    target = tiny_target(vocab_size=64, hidden_size=32, num_layers=2, seed=0)
    engine = store.open_store(url)
    Controller(engine, load_policy(policy_file), target, hooks={stage: die}).run_cycle()
    print("finished without reaching the stage", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
