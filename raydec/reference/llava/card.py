"""Write ``MODEL_CARD.md`` for a trained reference VLM from its ``train_log.json`` and an evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def _architecture(config: dict[str, Any]) -> list[str]:
    """Bullet lines describing the saved config."""
    vision, text = config["vision_config"], config["text_config"]
    return [
        f"- `LlavaForConditionalGeneration` (transformers {config.get('transformers_version', '?')}), float32.",
        f"- Vision tower: `CLIPVisionModel`, {vision['num_hidden_layers']} layers, hidden {vision['hidden_size']}, "
        f"MLP {vision['intermediate_size']}, {vision['num_attention_heads']} heads, "
        f"{vision['image_size']}x{vision['image_size']} input, patch {vision['patch_size']} "
        f"-> {config['image_seq_length']} image tokens (CLS dropped, `vision_feature_select_strategy="
        f"\"{config['vision_feature_select_strategy']}\"`, layer {config['vision_feature_layer']}).",
        f"- Projector: Linear -> {config['projector_hidden_act'].upper()} -> Linear ({vision['hidden_size']} -> "
        f"{text['hidden_size']}).",
        f"- Language model: `LlamaForCausalLM`-style, {text['num_hidden_layers']} layers, hidden {text['hidden_size']}, "
        f"MLP {text['intermediate_size']}, {text['num_attention_heads']} heads (head dim "
        f"{text['hidden_size'] // text['num_attention_heads']}), vocab {text['vocab_size']}, untied lm_head, "
        f"RoPE, max {text['max_position_embeddings']} positions.",
        f"- `<image>` token id {config['image_token_index']}.",
    ]


def _relative(path: str) -> str:
    """``path`` relative to the repository root when it lies inside it."""
    root = str(Path(__file__).resolve().parents[3]) + "/"
    return path[len(root):] if path.startswith(root) else path


def _commands(log: dict[str, Any]) -> list[str]:
    """The ``python -m raydec.reference.train vlm`` command of every training phase."""
    lines = []
    for phase in log.get("phases") or [log["settings"]]:
        flags = (
            f"--vlm-steps {phase['steps']} --vlm-batch-size {phase['batch_size']} --vlm-lr {phase['lr']} "
            f"--vlm-warmup {phase['warmup']} --vlm-seed {phase['seed']} --vlm-patch-loss "
            f"{phase.get('patch_loss_weight', '0')} \\\n    --vlm-eval-every {phase['eval_every']} "
            f"--vlm-eval-n {phase['eval_n']} --vlm-max-minutes {float(phase['max_minutes']):g} --vlm-out {_relative(phase['out_dir'])}"
        )
        if float(phase.get("question_share", 0.25)) != 0.25:
            flags += f" --vlm-question-share {phase['question_share']}"
        if phase.get("focus_questions", "False") == "True":
            flags += " --vlm-focus-questions"
        if float(phase.get("vision_lr_mult", 1.0)) != 1.0:
            flags += f" --vlm-vision-lr-mult {phase['vision_lr_mult']}"
        if float(phase.get("projector_in_lr_mult", 1.0)) != 1.0:
            flags += f" --vlm-projector-in-lr-mult {phase['projector_in_lr_mult']}"
        if phase.get("revive_projector", "False") == "True":
            flags += " --vlm-revive-projector"
        if float(phase.get("projector_probe_weight", 0)) > 0:
            flags += f" --vlm-projector-probe {phase['projector_probe_weight']}"
        if int(phase.get("stop_after", 0)) > 0:
            flags += f" --vlm-stop-after {phase['stop_after']}"
        if phase.get("init_from", "None") != "None":
            flags += f" \\\n    --vlm-init-from {_relative(phase['init_from'])} --vlm-first-step {phase['first_step']}"
        if int(phase.get("refine_patches", 0)) > 0:
            flags += f" --vlm-refine-patches {phase['refine_patches']}"
        lines.append(f"python -m raydec.reference.train vlm {flags}")
    return lines


def _introduction(config: dict[str, Any], log: dict[str, Any], size_mb: float) -> list[str]:
    """The card's title, usage and architecture."""
    return [
        "# raydec reference VLM: a small LLaVA for the shapes world",
        "",
        "A real `LlavaForConditionalGeneration` checkpoint (CLIP vision tower + Llama language model), trained",
        "from scratch on CPU to describe images of raydec's seeded shapes world (`raydec/reference/shapes/`)",
        "and to answer short questions about them. It is the target model for ViSpec / EAGLE-2 speculative",
        "decoding tests and benchmarks. Load it with the stock classes:",
        "",
        "```python",
        "from transformers import LlavaForConditionalGeneration, LlavaProcessor",
        "model = LlavaForConditionalGeneration.from_pretrained(\"raydec/reference/weights/vlm\")",
        "processor = LlavaProcessor.from_pretrained(\"raydec/reference/weights/vlm\")",
        "inputs = processor(text=[\"USER: <image> describe the image . ASSISTANT:\"], images=[image], return_tensors=\"pt\")",
        "out = model.generate(**inputs, max_new_tokens=96, do_sample=False)",
        "```",
        "",
        "## Architecture",
        "",
        *_architecture(config),
        f"- Parameters: {log['parameters'] / 1e6:.2f}M; shipped folder {size_mb:.1f} MB.",
        "- Tokenizer: word-level (`tokenizers` WordLevel), lower-casing, whitespace split with `,` `.` `?` as",
        "  separate tokens (same as `shapes.words`), `<bos>` prepended; special tokens `<pad> <bos> <eos> <unk>",
        "  <image> USER: ASSISTANT:`.",
        "- Processor: `LlavaProcessor` + `CLIPImageProcessorPil` at 64x64 (no crop; rescale to [0, 1], normalise",
        f"  with mean 0.5 / std 0.5); each `<image>` expands to {config['image_seq_length']} image tokens.",
        "- Chat format: `USER: <image> describe the image . ASSISTANT:` -> description + `<eos>`; questions",
        "  such as `USER: <image> what colour is the circle? ASSISTANT:` -> `red` + `<eos>`.",
        "",
    ]


def _projector_notes(phases: list[dict[str, Any]]) -> list[str]:
    """Bullets on projector revival and the projector probe, for phases that used them."""
    return [
        *(
            [
                "- Projector revival (phases with `--vlm-revive-projector`): before the phase starts, every hidden unit of",
                "  the projector's first layer that is positive on < 1% of the image patches of the phase's first batch",
                "  (a dead GELU unit) gets a fresh seeded random input row (pre-activation mean 0, std 2 on those patches)",
                "  and a zero output column, so the model's function is unchanged (`llava.train.revive_projector`).",
            ]
            if any(p.get("revive_projector") == "True" for p in phases)
            else []
        ),
        *(
            [
                "- Projector probe (phases with `--vlm-projector-probe W`; training only, not saved): a linear layer reads",
                "  each image patch's attribute words from the projector's output (sigmoid cross-entropy against the same",
                "  patch-word targets, weight W), so the projector keeps colour, shape and fill apart before the language",
                "  model sees them (`llava.train`). Weight per phase: "
                + ", ".join(str(p.get("projector_probe_weight", "0")) for p in phases) + ".",
            ]
            if any(float(p.get("projector_probe_weight", 0)) > 0 for p in phases)
            else []
        ),
    ]


def _training(log: dict[str, Any], settings: dict[str, Any], phases: list[dict[str, Any]], losses: np.ndarray,
              tail: np.ndarray) -> list[str]:
    """The training section: the commands of every phase, the data, losses and optimiser, quick evaluations."""
    lines = [
        "## Training",
        "",
        "```",
        *_commands(log),
        "```",
        "",
        "(A later phase continues from a copy of the earlier phase's output folder, with a fresh optimizer,",
        "its own warm-up + cosine schedule and the data stream resuming at `--vlm-first-step`.)",
        "",
        "To retrain from scratch, replay all the phases above in one command (each continues from the previous",
        "one's folder, stopping at the step where the recorded phase ended; about "
        f"{log['wall_seconds'] / 3600:.1f} h of CPU):",
        "",
        "```",
        "python -m raydec.reference.train vlm --vlm-recipe raydec/reference/weights/vlm/train_log.json --vlm-out DIR",
        "```",
        "",
        "The replay equals a phase-by-phase run exactly (a test checks this on a tiny model); the full",
        "replay has not been run end to end, and the early phases ran on earlier revisions of the training code.",
        "",
        "- Data: fresh samples every step (global step s uses seeds `s*B .. s*B+B-1`, all < 1,000,000); a seeded",
        "  share of samples is one question from `shapes.question_answers`, the rest full descriptions; share per "
        "phase: " + ", ".join(
            f"{float(p.get('question_share', 0.25)):.0%}"
            + (" (only questions about an object's colour, shape or fill)" if p.get("focus_questions") == "True" else "")
            for p in phases
        ) + ". Teacher forcing; cross-entropy on answer tokens (and the final `<eos>`) only.",
        "- Auxiliary patch loss (training only; the model is the stock class): at every image-token position",
        "  the LM head's logits of 27 attribute words (colours, shapes, sizes, fills, background kind / colour,",
        "  position words) are trained with a sigmoid cross-entropy against the words of the object (or",
        "  background) covering that 8x8 patch, weight per phase: "
        + ", ".join(str(p.get("patch_loss_weight", "0")) for p in phases) + ". Without it the first run "
        "captioned from the language prior alone for 900+ steps (colour tokens ignored the image).",
        *_projector_notes(phases),
        f"- AdamW (betas 0.9 / 0.95, weight decay {settings['weight_decay']} on matrices), linear warm-up then cosine "
        f"decay to {settings['min_lr_ratio']} x peak, grad clip {settings['grad_clip']}, batch {settings['batch_size']}, "
        "float32 (bf16 autocast was 2x slower on this CPU), "
        f"torch threads per phase {', '.join(str(p.get('threads', 1)) for p in phases)}, seed {settings['seed']}. Peak learning rate per phase: "
        + ", ".join(
            f"{p['lr']} ({p['steps']} steps, {p['warmup']} warm-up"
            + (f"; vision tower and projector at {float(p['vision_lr_mult']):g} x" if float(p.get("vision_lr_mult", 1.0)) != 1.0 else "")
            + (f"; projector first layer at {float(p['projector_in_lr_mult']):g} x" if float(p.get("projector_in_lr_mult", 1.0)) != 1.0 else "")
            + (f"; stopped after {p['stop_after']} steps" if int(p.get("stop_after", 0)) > 0 else "")
            + ")"
            for p in phases
        ) + ".",
        f"- Steps done: {log['steps_done']} in {len(phases)} phase(s)"
        + (" (the last stopped early by its wall-time cap)" if log.get("stopped_early") else "")
        + f"; {log['tokens_seen'] / 1e6:.2f}M tokens (image + text, unpadded); training wall time "
        f"{log['wall_seconds'] / 60:.1f} min on a shared 2-core CPU (other jobs running).",
        f"- Final loss (mean of the last {len(tail)} steps): {float(np.mean(tail)):.4f}; first step "
        f"{float(losses[0]) if len(losses) else float('nan'):.3f}. Curve: `loss_curve.png`; per-step losses and "
        "quick evaluations: `train_log.json`.",
    ]
    if log.get("evals"):
        lines += ["", "Quick evaluations during training (greedy, first held-out images):", "",
                  "| step | caption accuracy |", "|---:|---:|"]
        lines += [f"| {e['step']} | {e['accuracy']:.3f} |" for e in log["evals"]]
    return lines


def _evaluation(evaluation: dict[str, Any] | None) -> list[str]:
    """The evaluation section's lines (after its heading)."""
    lines: list[str] = []
    if evaluation:
        lines += [
            f"Greedy captions (HF `generate(do_sample=False)`, batched) of {evaluation['n']} held-out images "
            f"(seeds {evaluation['first_seed']}..{evaluation['first_seed'] + evaluation['n'] - 1}), scored by "
            "`raydec.reference.judge.score_caption(caption, image)`:",
            "",
            f"- **Attribute accuracy: {evaluation['accuracy']:.4f}** (perfect captions: "
            f"{evaluation['perfect']}/{evaluation['n']}).",
            f"- Against the generator's ground-truth scenes instead of the judge's reading of the image: "
            f"{evaluation['truth_accuracy']:.4f}.",
            f"- Evaluation time: {evaluation['seconds']:.0f} s. Command: "
            f"`python -m raydec.reference.llava.evaluate --n {evaluation['n']}`.",
        ]
        if evaluation["accuracy"] < 0.9:
            lines += ["- **Below the >= 0.9 target** of `specs/reference-models.md`."]
        if evaluation.get("note"):
            lines += [f"- {evaluation['note']}"]
        for example in evaluation.get("examples", []):
            lines += [f"- seed {example['seed']} (score {example['score']:.2f}): \"{example['caption']}\""]
    else:
        lines += ["Not evaluated yet: run `python -m raydec.reference.llava.evaluate --n 200 --write-card`."]
    return lines


def write_model_card(out_dir: Path, evaluation: dict[str, Any] | None = None) -> Path:
    """Render the card into ``out_dir/MODEL_CARD.md``; ``evaluation`` comes from ``llava.evaluate``."""
    log = json.loads((out_dir / "train_log.json").read_text())
    config = json.loads((out_dir / "config.json").read_text())
    settings, losses = log["settings"], np.asarray(log["losses"])
    phases = log.get("phases") or [settings]
    tail = losses[-100:] if len(losses) else np.asarray([float("nan")])
    size_mb = sum(p.stat().st_size for p in out_dir.iterdir() if p.is_file() and p.name != "MODEL_CARD.md") / 2**20
    lines = _introduction(config, log, size_mb) + _training(log, settings, phases, losses, tail)
    lines += ["", "## Evaluation", ""]
    lines += _evaluation(evaluation)
    lines += [
        "",
        "## Limits",
        "",
        "- Only knows the shapes world (5 shapes, 6 colours, 2 sizes, 9 positions, 3 fills, 3 backgrounds and",
        "  3 background colours, 1-3 objects) and this one chat format; one image per prompt.",
        "- Sampling at temperature 1 gives varied phrasings (the training descriptions are varied on purpose).",
    ]
    path = out_dir / "MODEL_CARD.md"
    path.write_text("\n".join(lines) + "\n")
    return path
