"""MODEL_CARD.md of a trained draft model: what it is, how it was trained, what it accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raydec.models.registry import REFERENCE_DRAFT_DIRS, REFERENCE_VLM_DIR
from raydec.train.config import DraftTrainConfig, EvalConfig

CARD_NAME = "MODEL_CARD.md"


def _table(acceptance: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| method | tokens per target forward | mean per row | tau (no bonus) | target forwards | tokens | wall s | same as AR |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for method, r in acceptance.items():
        same = "-" if r["same_as_ar"] is None else ("yes" if r["same_as_ar"] else "NO")
        lines.append(
            f"| {method} | {r['tokens_per_forward']:.3f} | {r['mean_row_tokens_per_forward']:.3f} | {r['tau']:.3f} | "
            f"{r['target_forwards']} | {r['tokens']} | {r['wall_s']:.1f} | {same} |"
        )
    return lines


def _usage(target: str, method: str, output_dir: Path) -> tuple[str, str, str]:
    """(model argument, the target's name in prose, draft_model argument) of the card's snippet:
    the shipped draft models of the reference VLM need no draft_model, any other draft model does."""
    if Path(target).resolve() != REFERENCE_VLM_DIR.resolve():
        return target, f"the VLM at `{target}`", f", draft_model={str(output_dir)!r}"
    shipped = output_dir.resolve() == REFERENCE_DRAFT_DIRS[method].resolve()
    return "reference", "the reference LLaVA (`raydec/reference/weights/vlm`)", "" if shipped else f", draft_model={str(output_dir)!r}"


def _answers(manifest: dict[str, Any]) -> str:
    """How the data's answers were drawn: 'greedily', or the temperatures cycled over the samples."""
    temperatures = (manifest.get("config") or {}).get("temperatures") or [0.0]
    if all(t == 0 for t in temperatures):
        return "greedily"
    named = ", ".join("greedy" if t == 0 else f"T={t:g}" for t in temperatures)
    return f"with answers cycling over {named} (one temperature per sample, in seed order)"


def _objective(config: DraftTrainConfig) -> str:
    """The card's objective line: the losses in the order the steps use them, then rollout and noise."""
    loss = config.loss
    stage1 = (
        f"stage 1 (EAGLE): {loss.feature_weight:g}·SmoothL1(feature) + "
        f"{loss.ce_weight:g}·(CE + {loss.listmle_weight:g}·ListMLE_top{loss.listmle_top})"
    )
    stage2 = (
        f"stage 2: {loss.l1_weight:g}·L1(softmax(draft logits) − target probs) + "
        f"{loss.listmle_weight:g}·ListMLE_top{loss.listmle_top}"
    )
    if config.stage1_steps >= config.steps:
        stages = f"{stage1}, every step (no stage 2)"
    elif config.stage1_steps:
        stages = f"{stage1} for the first {config.stage1_steps} steps, then {stage2}"
    else:
        stages = stage2
    rollout = f"self-rollout mtp_steps={config.mtp_steps}" if config.mtp_steps else "no self-rollout"
    return f"{stages}; {rollout}, uniform feature noise width {config.feature_noise:g}."


def write_model_card(
    config: DraftTrainConfig, summary: dict[str, Any], manifest: dict[str, Any], acceptance: dict[str, dict[str, Any]],
    evaluation: EvalConfig, command: str, parallel: bool = False, notes: str = "",
) -> Path:
    """Write ``config.output_dir/MODEL_CARD.md`` for the draft model ``config`` trained."""
    method = "vispec" if config.vision else "eagle"
    kind = (
        f"ViSpec draft (EAGLE-2 layer + vision adaptor with num_q={config.num_q} + global feature through img_fc)"
        if config.vision else "text-only EAGLE-2 draft (no vision modules; the ablation)"
    )
    tree = evaluation.draft_tree
    model, model_name, draft_arg = _usage(manifest["target"], method, Path(config.output_dir))
    lines = [
        f"# raydec VLM draft: {method}",
        "",
        f"A {kind} for {model_name}. Only the draft's own weights are",
        "stored; the target's token embedding and lm_head are attached at load time:",
        "",
        "```python",
        "from raydec.api import caption_images",
        "from raydec.config import DecodeConfig",
        f'caption_images(images, model={model!r}, decode=DecodeConfig(method="{method}"{draft_arg}))',
        "```",
        "",
        "## Training",
        "",
        "```",
        command or "(see train_log.json: config)",
        "```",
        "",
        f"- Data: {manifest['num_samples']} samples generated {_answers(manifest)} by the target (prompt `{manifest.get('prompt')}`, "
        f"shapes-world seeds {manifest['seeds'][0]}..{manifest['seeds'][1] - 1}), {manifest['num_tokens']} tokens of which "
        f"{manifest['num_generated_tokens']} generated; data generation {manifest.get('wall_s', '?')} s. The same data and budget "
        "train the vispec and eagle drafts.",
        f"- Objective: {_objective(config)}",
        f"- AdamW betas {config.betas}, lr {config.lr:g} (warm-up {config.warmup_steps}, cosine to {config.min_lr_ratio:g}× over "
        f"{config.steps} steps{' or %g minutes, whichever comes first' % config.max_minutes if config.anneal_on_time and config.max_minutes else ''}), "
        f"weight decay {config.weight_decay:g}, clip {config.grad_clip:g}, global batch {config.batch_size}, "
        f"{config.num_workers} Ray Train worker(s) × {config.threads_per_worker} thread(s), seed {config.seed}.",
        f"- Steps: {summary['steps']}; training wall time {summary['train_s'] / 60:.1f} min "
        f"({summary['wall_s'] / 60:.1f} min with Ray Train start-up){'; trained at the same time as the other draft' if parallel else ''}.",
        f"- Losses: first step {summary['first_loss']:.3f}, final (mean of the last 10% of steps) {summary['final_loss']:.4f}; "
        "top-1 agreement with the target per rollout pass (last 10%): "
        + ", ".join(f"pass {k[len('final_acc'):]} {v:.3f}" for k, v in summary.items() if k.startswith("final_acc"))
        + ". Curve: `loss_curve.png`.",
        "",
        "## Acceptance",
        "",
        f"`caption_images` greedy (temperature 0), {evaluation.num_images} held-out images (seeds "
        f"{evaluation.seed_start}..{evaluation.seed_start + evaluation.num_images - 1}), prompt `{evaluation.prompt}`, "
        f"max {evaluation.max_new_tokens} new tokens, batch {evaluation.batch_size}, float32, tree depth {tree.depth}, "
        f"top_k {tree.top_k}, total_tokens {tree.total_tokens}. Tokens per target forward count the prefill as a forward.",
        "",
        *_table(acceptance),
    ]
    if notes:
        lines += ["", notes.strip()]
    path = Path(config.output_dir) / CARD_NAME
    path.write_text("\n".join(lines) + "\n")
    return path
