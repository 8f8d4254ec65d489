"""Data-parallel draft model training with Ray Train's ``TorchTrainer`` (gloo on CPU, NCCL on GPU).

Every worker loads the whole (small) dataset and the target's frozen ``lm_head``; global step
s uses the sample indices ``batch_indices(s)``, of which rank r takes ``[r::world]``. The loss
is the mean of per-sample losses, and gradients are all-reduced and averaged by hand, so a step
is the same computation for any worker count (up to float summation order). Rank 0 logs
progress and reports checkpoints (``VispecDraft.save_pretrained`` + ``train_log.json``);
``train_draft_model`` copies the last one to ``output_dir`` and draws the loss curve.
``train_draft_model_in_process`` runs the same loop as one worker in the calling process, without Ray Train.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from raydec.models.registry import load_vlm_target, resolve_vlm_path
from raydec.models.sources import folder_identity
from raydec.models.vispec_draft import DraftConfig, VispecDraft
from raydec.runtime.cluster import connect_ray
from raydec.train.card import CARD_NAME
from raydec.train.datagen import read_manifest
from raydec.train.dataset import batch_indices, load_samples
from raydec.train.step import build_pairs, rollout_losses
from raydec.validation import check_folder
from raydec.train.config import DraftTrainConfig

logger = logging.getLogger(__name__)

LOG_NAME = "train_log.json"
CURVE_NAME = "loss_curve.png"
_SEED_LOCK = threading.Lock()
_PLOT_LOCK = threading.Lock()  # pyplot (and its mathtext parser) is not thread-safe; draft models train in threads


def learning_rate(step: int, config: DraftTrainConfig, time_fraction: float = 0.0) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr``; the decay follows the larger of
    the step fraction and ``time_fraction`` (the share of ``max_minutes`` used, with ``anneal_on_time``)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    progress = max(progress, time_fraction)
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def build_draft_model(target_text_config: Any, lm_head: torch.nn.Module, config: DraftTrainConfig) -> Any:
    """A fresh draft model for the target (seeded), attached to a frozen copy of its lm_head."""
    with _SEED_LOCK:  # torch's global generator: draft models built in threads of one process get their seed's weights
        torch.manual_seed(config.seed)
        draft_config = DraftConfig.for_target(target_text_config, vision=config.vision, num_q=config.num_q)
        return VispecDraft(draft_config, embed=torch.nn.Identity(), lm_head=lm_head)


def _frozen_head(target: Any, device: torch.device) -> torch.nn.Module:
    head = torch.nn.Linear(target.head.in_features, target.head.out_features, bias=target.head.bias is not None)
    head.load_state_dict(target.head.state_dict())
    return head.to(device=device, dtype=torch.float32).requires_grad_(False)


def _all_reduce_mean_(tensors: list[torch.Tensor], world: int) -> None:
    """Average ``tensors`` over workers in place (one flat buffer)."""
    import torch.distributed as dist

    if world == 1:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train worker body. loop_config: {"config": DraftTrainConfig JSON, "target": path, "data_dir": path}."""
    import ray.train
    import ray.train.torch

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = DraftTrainConfig.model_validate_json(loop_config["config"])
    torch.set_num_threads(config.threads_per_worker)
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device() if config.use_gpu else torch.device("cpu")
    _train_loop(config, loop_config["target"], loop_config["data_dir"], rank, world, device, _report)


def _train_loop(config: DraftTrainConfig, target_path: str, data_dir: str, rank: int, world: int, device: torch.device,
                report: Callable[[Any, list[dict[str, Any]], DraftTrainConfig, int, bool], None]) -> None:
    """The training steps of worker ``rank`` of ``world``; ``report(draft_model, log, config, rank, last)``
    hands over a checkpoint (the last one with ``last``)."""
    target = load_vlm_target(target_path)
    head = _frozen_head(target, device)
    draft_model = build_draft_model(target.text_config, head, config).to(device)
    del target
    samples = load_samples(data_dir)
    params = [p for p in draft_model.parameters() if p.requires_grad]
    if world > 1:  # identical start on every worker (already equal by seed; made certain)
        import torch.distributed as dist

        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, src=0)
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    per_worker = config.batch_size // world
    log: list[dict[str, Any]] = []
    start = time.time()
    if rank == 0:
        logger.info("[%s] %d samples, %d workers, %d draft parameters, %d steps of %d",
                    config.name, len(samples), world, sum(p.numel() for p in params), config.steps, config.batch_size)
    step, time_fraction = 0, 0.0
    while step < config.steps:
        lr = learning_rate(step, config, time_fraction)
        for group in optimizer.param_groups:
            group["lr"] = lr
        indices = batch_indices(len(samples), config.batch_size, step, config.seed)[rank::world][:per_worker]
        batch = [samples[i] for i in indices]
        draft_model.train()
        pairs = build_pairs(draft_model, batch, step, config, device)
        per_sample, stats = rollout_losses(draft_model, head, pairs, config, stage1=step < config.stage1_steps)
        loss = per_sample.sum() / config.batch_size * world  # mean over this worker's share
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        for p in params:  # a module unused this step (e.g. no image in the batch) gets zero gradients
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        scalars = torch.tensor([float(per_sample.detach().mean())] + [stats[k] for k in sorted(stats)], device=device)
        _all_reduce_mean_(grads + [scalars], world)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip) if config.grad_clip > 0 else torch.tensor(0.0)
        optimizer.step()
        step += 1
        record = {"step": step, "loss": round(float(scalars[0]), 5), "lr": lr, "grad_norm": round(float(grad_norm), 4),
                  "elapsed_s": round(time.time() - start, 2)}
        record.update({k: round(float(v), 4) for k, v in zip(sorted(stats), scalars[1:].tolist())})
        log.append(record)
        stop = config.max_minutes > 0 and time.time() - start > 60 * config.max_minutes
        if config.anneal_on_time and config.max_minutes > 0:
            time_fraction = (time.time() - start) / (60 * config.max_minutes)
        if world > 1:  # every worker stops, and anneals, in step with rank 0
            import torch.distributed as dist

            flag = torch.tensor([float(stop), time_fraction], device=device)
            dist.broadcast(flag, src=0)
            stop, time_fraction = bool(flag[0].item()), float(flag[1].item())
        if rank == 0 and (step % config.log_every == 0 or step == 1 or stop or step == config.steps):
            logger.info("[%s] step %d/%d loss %.4f acc0 %.3f lr %.2e %.1f s", config.name, step, config.steps,
                        record["loss"], record.get("acc0", 0.0), lr, record["elapsed_s"])
        last = stop or step == config.steps
        if last or (config.checkpoint_every and step % config.checkpoint_every == 0):
            report(draft_model, log, config, rank, last)
        if stop:
            break


def _report(draft_model: Any, log: list[dict[str, Any]], config: DraftTrainConfig, rank: int, last: bool) -> None:
    import ray.train

    metrics = dict(log[-1], done=last)
    if rank != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as folder:
        draft_model.save_pretrained(folder)
        (Path(folder) / LOG_NAME).write_text(json.dumps({"config": json.loads(config.model_dump_json()), "steps": log}) + "\n")
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))


def check_training_inputs(config: DraftTrainConfig) -> str:
    """Check a draft model's training data and target before Ray starts; returns the target to train against.

    The dataset must be a raydec draft dataset with samples, of the target's width and, where the
    manifest records them, made by the target's current weights.
    """
    if config.data_dir is None:
        raise ValueError(f"draft {config.name!r}: data_dir is not set")
    check_folder(config.output_dir, f"draft {config.name!r}: output_dir")
    manifest = read_manifest(config.data_dir)
    target = str(config.target or manifest["target"])
    target_path = resolve_vlm_path(target)
    text_config = json.loads((target_path / "config.json").read_text())
    text_config = text_config.get("text_config", text_config)
    width = int(text_config["hidden_size"])
    if width != int(manifest["hidden_size"]):
        raise ValueError(
            f"draft {config.name!r}: target {target} has hidden_size {width}, the data at {config.data_dir} "
            f"was made by a target of hidden_size {manifest['hidden_size']}"
        )
    made_by = (manifest.get("identity") or {}).get("target_weights")
    if made_by is not None and made_by != folder_identity(target_path):
        raise ValueError(
            f"draft {config.name!r}: the data at {config.data_dir} was made by other target weights ({made_by}) "
            f"than {target} holds now ({folder_identity(target_path)}); regenerate the data"
        )
    return target


def train_draft_model(config: DraftTrainConfig) -> dict[str, Any]:
    """Train one draft model with a ``TorchTrainer`` and save it to ``config.output_dir``.

    Returns a summary: steps, wall_s, final losses (mean of the last 10% of steps), output path.
    """
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    target = check_training_inputs(config)
    out = Path(config.output_dir)
    work = Path(config.work_dir) if config.work_dir else out.parent / "_ray_train"
    connect_ray()
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": config.model_dump_json(), "target": str(target), "data_dir": str(Path(config.data_dir).resolve())},
        torch_config=TorchConfig(backend="nccl" if config.use_gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=config.num_workers, use_gpu=config.use_gpu, resources_per_worker={"CPU": config.cpus_per_worker}
        ),
        run_config=ray.train.RunConfig(name=f"{config.name}-{int(time.time())}", storage_path=str(work.resolve())),
    )
    start = time.time()
    result = trainer.fit()
    wall = time.time() - start
    if result.checkpoint is None:
        raise RuntimeError(f"draft {config.name!r}: training reported no checkpoint ({result.error})")
    out.mkdir(parents=True, exist_ok=True)
    (out / CARD_NAME).unlink(missing_ok=True)  # a card of earlier weights would describe these
    with result.checkpoint.as_directory() as folder:
        for name in ("draft_config.json", "model.safetensors", LOG_NAME):
            shutil.copy2(Path(folder) / name, out / name)
    return summarize_trained(config, wall)


def train_draft_model_in_process(config: DraftTrainConfig) -> dict[str, Any]:
    """Train one draft model here, in this process, without Ray Train, and save it to ``config.output_dir``
    as ``train_draft_model`` does: the steps of a one-worker run (same seed, batches, noise and losses;
    ``num_workers`` and ``cpus_per_worker`` are not used). For small draft models, where starting Ray
    Train's workers takes longer than the training. Returns ``train_draft_model``'s summary."""
    target = check_training_inputs(config)
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CARD_NAME).unlink(missing_ok=True)  # a card of earlier weights would describe these

    def save(draft_model: Any, log: list[dict[str, Any]], config: DraftTrainConfig, rank: int, last: bool) -> None:
        draft_model.save_pretrained(out)
        (out / LOG_NAME).write_text(json.dumps({"config": json.loads(config.model_dump_json()), "steps": log}) + "\n")

    device = torch.device("cuda") if config.use_gpu else torch.device("cpu")
    start = time.time()
    _train_loop(config, str(target), str(Path(config.data_dir).resolve()), 0, 1, device, save)
    return summarize_trained(config, time.time() - start)


def summarize_trained(config: DraftTrainConfig, wall: float) -> dict[str, Any]:
    """Plot the loss curve of the draft model saved in ``config.output_dir`` and summarise its training log."""
    out = Path(config.output_dir)
    history = json.loads((out / LOG_NAME).read_text())["steps"]
    plot_losses(history, out / CURVE_NAME, title=f"{config.name} draft")
    tail = history[-max(1, len(history) // 10) :]
    summary = {
        "name": config.name, "output_dir": str(out), "steps": len(history), "wall_s": round(wall, 1),
        "train_s": history[-1]["elapsed_s"], "final_loss": sum(r["loss"] for r in tail) / len(tail),
        "first_loss": history[0]["loss"],
    }
    for key in sorted(k for k in history[-1] if k.startswith("acc")):
        summary[f"final_{key}"] = sum(r[key] for r in tail) / len(tail)
    logger.info("[%s] trained: %s", config.name, summary)
    return summary


def plot_losses(history: list[dict[str, Any]], path: Path, title: str = "draft") -> None:
    """Loss (and greedy top-1 agreement of the first pass) per step -> PNG."""
    with _PLOT_LOCK:
        _plot_losses(history, path, title)


def _plot_losses(history: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in history]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax_loss.plot(steps, [r["loss"] for r in history], lw=0.6, alpha=0.5, label="loss")
    window = max(1, len(steps) // 50)
    if window > 1:
        smooth = torch.tensor([r["loss"] for r in history]).unfold(0, window, 1).mean(-1).tolist()
        ax_loss.plot(steps[window - 1 :], smooth, lw=1.5, label=f"mean of {window}")
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_title(f"{title}: training loss")
    ax_loss.legend()
    for key in sorted(k for k in history[0] if k.startswith("acc")):
        values = torch.tensor([r[key] for r in history])
        if window > 1:
            ax_acc.plot(steps[window - 1 :], values.unfold(0, window, 1).mean(-1).tolist(), label=f"pass {key[3:]}")
        else:
            ax_acc.plot(steps, values.tolist(), label=f"pass {key[3:]}")
    ax_acc.set_xlabel("step")
    ax_acc.set_title("top-1 agreement with the target")
    ax_acc.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
