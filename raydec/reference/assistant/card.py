"""The model card of a shipped LLaVA assistant, written from its run log.

``write_model_card`` writes ``MODEL_CARD.md``: usage, architecture, the distillation command,
data and recipe, the held-out agreement, the measured HF assisted generation and the tuning
grid, keeping a hand-written ``## History`` section of the card it replaces.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from raydec.reference.assistant.settings import DistillLog


def card_temperatures(settings: dict) -> tuple[float, ...]:
    """The answer temperatures of a run's logged settings (logs from before the field: greedy)."""
    raw = str(settings.get("temperatures", "(0.0,)")).strip("()[] ")
    return tuple(float(t) for t in raw.split(",") if t.strip()) or (0.0,)


def answers_kind(settings: dict) -> str:
    """'greedy outputs', or 'answers, greedy and sampled at T=1', for the card's first line."""
    sampled = [t for t in card_temperatures(settings) if t > 0]
    if not sampled:
        return "greedy outputs"
    return "answers, greedy and sampled at " + ", ".join(f"T={t:g}" for t in sampled)


def data_answers(settings: dict, log: dict) -> str:
    """How the card's data line says the answers were drawn."""
    temperatures = card_temperatures(settings)
    if temperatures == (0.0,):
        return "Greedy answers by HF `generate`, its logits recorded"
    cycle = ", ".join(f"{t:g}" for t in temperatures)
    sampled = log.get("caption_sampled", 0)
    return (f"Temperatures ({cycle}) cycled over the seeds (`--temperatures {cycle.replace(' ', '')}`): "
            f"{log['captions'] - sampled} answers greedy by HF `generate` (its logits recorded), {sampled} sampled by "
            "raydec's AR decoder from a generator seeded by the image's seed (the drafts' rule), their logits from one "
            "teacher-forced target forward")


def kept_section(card: Path, heading: str) -> list[str]:
    """The lines of an existing card's hand-written ``heading`` section (up to the next ``## ``), or []."""
    if not card.is_file():
        return []
    lines = card.read_text().splitlines()
    if heading not in lines:
        return []
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    section = lines[start:end]
    while section and not section[-1].strip():
        section.pop()
    return section


def _introduction(settings: dict[str, Any], log: dict[str, Any], text: dict[str, Any], size: int) -> list[str]:
    """The card's title, usage and architecture."""
    return [
        "# LLaVA assistant for the reference VLM (HF assisted generation)",
        "",
        "A small `LlavaForConditionalGeneration` that shares the reference VLM's tokenizer, processor, vision tower",
        f"and vocabulary, distilled on the reference VLM's own {answers_kind(settings)}, for Hugging Face's assisted "
        "generation:",
        "",
        "```python",
        "from transformers import LlavaForConditionalGeneration, LlavaProcessor",
        'target = LlavaForConditionalGeneration.from_pretrained("raydec/reference/weights/vlm")',
        'assistant = LlavaForConditionalGeneration.from_pretrained("raydec/reference/weights/vlm-drafts/assistant")',
        'processor = LlavaProcessor.from_pretrained("raydec/reference/weights/vlm-drafts/assistant")',
        'inputs = processor(text=["USER: <image> describe the image . ASSISTANT:"], images=[image], return_tensors="pt")',
        "out = target.generate(**inputs, max_new_tokens=96, do_sample=False, assistant_model=assistant)",
        "```",
        "",
        "## Architecture",
        "",
        f"- Same as the target (`raydec/reference/weights/vlm`) except the language model: {text['num_hidden_layers']} "
        f"Llama layers (hidden {text['hidden_size']}, MLP {text['intermediate_size']}, {text['num_attention_heads']} heads) "
        f"instead of 8.",
        f"- Initialised from the target (sha256 `{log['target_sha256'][:16]}…` of its model.safetensors): vision tower, "
        f"projector, token embeddings, final norm and lm_head copied; assistant layers = target layers "
        f"{settings['layers']}.",
        f"- Parameters: {log['parameters'] / 1e6:.2f}M ({log['trainable_parameters'] / 1e6:.2f}M trained; the vision "
        f"tower stays the target's, frozen). Shipped folder {size / 2**20:.1f} MB.",
        "",
    ]


def _distillation(settings: dict[str, Any], log: dict[str, Any], last: list[float]) -> list[str]:
    """The distillation section: command, data, image input, loss, optimiser, figures, held-out agreement."""
    lines = [
        "## Distillation",
        "",
        "```",
        settings.get("command") or "python -m raydec.reference.train assistant",
        "```",
        "",
        f"- Data: the target's answers to {log['captions']} held-in shapes-world images (seeds "
        f"{settings['first_seed']}..{int(settings['first_seed']) + int(settings['num_captions']) - 1}, < 1,000,000): "
        f"`describe the image .` or, for a seeded {float(settings['question_share']):.0%}, one question of "
        f"`shapes.question_answers`; batches of {settings['caption_batch_size']}, max {settings['max_new_tokens']} new "
        f"tokens; {log['caption_tokens']} answer tokens; generated in {log['caption_seconds'] / 60:.1f} min. "
        f"{data_answers(settings, log)}.",
        ("- Image input: **none** (`--image-input none`). HF assisted generation in transformers 5.24 never gives the "
         "assistant the image: `generate()` runs the assistant's prefill with `is_first_iteration=False` "
         "(`is_assistant`), which drops `pixel_values`, so the assistant sees the prompt with its 64 `<image>` token "
         "embeddings only (checked with a forward hook). The assistant is therefore trained exactly so: teacher "
         "forcing without `pixel_values`; it drafts from the prompt, the chat format and the caption so far. The copied "
         "vision tower and projector stay in the checkpoint (stock class, same processor) but HF does not run them."
         if settings.get("image_input", "none") == "none" else
         "- Image input: pixels (the assistant is trained with `pixel_values`; note that HF assisted generation in "
         "transformers 5.24 does not pass them to the assistant)."),
        f"- Loss (answer positions only, teacher forcing on prompt + target answer): cross-entropy on the target's answer "
        f"tokens + {settings['kl_weight']} x KL(target || assistant) of the full next-token distribution (the target's "
        f"logits: recorded during greedy generation, or from a teacher-forced forward on a sampled answer).",
        f"- AdamW (betas 0.9 / 0.95, weight decay {settings['weight_decay']} on matrices), peak lr {settings['lr']}, "
        f"{settings['warmup']} warm-up steps then cosine to {settings['min_lr_ratio']} x peak"
        f"{' (progress = max(step / steps, elapsed / time cap))' if settings.get('anneal_on_time') == 'True' else ''}, grad clip "
        f"{settings['grad_clip']}, batch {settings['batch_size']}, float32, seed {settings['seed']}, "
        f"`torch.set_num_threads({settings['threads']})`.",
        f"- Steps: {log['steps_done']} of {settings['steps']}{' (stopped at the time cap)' if log['stopped_early'] else ''}; "
        f"training wall time {log['wall_seconds'] / 60:.1f} min on one thread of a shared 2-core CPU (other jobs running).",
        f"- Final loss (mean of the last {len(last)} steps): {np.mean(last):.4f} (CE {np.mean(log['ce'][-100:]):.4f}, "
        f"KL {np.mean(log['kl'][-100:]):.4f}); first step {log['losses'][0]:.4f}. Training argmax agreement with the "
        f"target's answer token (last {len(last)} steps; a sampled token is often not the argmax): "
        f"{np.mean(log['agreement'][-100:]):.3f}.",
        "- Curve: `loss_curve.png`; per-step losses: `train_log.json`.",
    ]
    if log["heldout"]:
        lines += ["", "Held-out argmax agreement with the target's greedy token (teacher forcing on the target's greedy "
                  f"captions of {settings['heldout_n']} held-out images, seeds 1010000..):", "",
                  "| step | agreement | CE |", "|---:|---:|---:|"]
        lines += [f"| {h['step']} | {h['agreement']:.3f} | {h['ce']:.4f} |" for h in log["heldout"]]
    return lines


def _measurement(m: dict[str, Any], log: dict[str, Any]) -> list[str]:
    """The measured section (HF assisted vs plain generation) and earlier measurements; empty without one."""
    lines: list[str] = []
    if m:
        lines += [
            "",
            "## Measured: HF assisted generation vs plain generation",
            "",
            f"{m['images']} held-out images (seeds {m['first_seed']}..{m['first_seed'] + m['images'] - 1}), prompt "
            f"`describe the image .`, greedy, batch 1, max {m['max_new_tokens']} new tokens, the assistant's shipped "
            f"generation config (up to {m['num_assistant_tokens']} draft tokens per round, assistant confidence threshold "
            f"{m['assistant_confidence_threshold']}), one untimed warm-up, plain then assisted per image, same CPU thread"
            + (f", each pair run {m['repeats']} times and each side's fastest time kept (the shared CPU stalls "
               "runs at random)" if m.get("repeats", 1) > 1 else "") + ":",
            "",
            f"- **Outputs identical: {m['identical']}/{m['images']}.**",
            f"- **Mean wall-time ratio assisted / plain: {m['mean_time_ratio']:.3f}** (median {m['median_time_ratio']:.3f}; "
            f"totals {m['total_assisted_s']:.1f} s vs {m['total_plain_s']:.1f} s).",
            f"- Target forwards (forward hook): {m['target_forwards']} for {m['new_tokens']} new tokens = "
            f"**{m['tokens_per_target_forward']:.2f} tokens per target forward** (plain greedy: 1.00).",
            f"- Assistant draft acceptance: (new tokens - verification rounds) / assistant forwards = "
            f"{m['new_tokens'] - m['target_forwards']} / {m['assistant_forwards']} = **{m['acceptance']:.3f}**.",
            "- Re-measure: `python -m raydec.reference.assistant.command measure --n 50 --repeats 3 --write-card`.",
        ]
        for e in log.get("earlier_measurements") or []:
            lines.append(f"- Earlier measurement on the same images ({e.get('repeats', 1)} run(s) per pair, at the end of "
                         f"the distillation run): {e['identical']}/{e['images']} identical, mean time ratio "
                         f"{e['mean_time_ratio']:.3f} (median {e['median_time_ratio']:.3f}), "
                         f"{e['tokens_per_target_forward']:.2f} tokens per target forward, acceptance {e['acceptance']:.3f}.")
    return lines


def _tuning(log: dict[str, Any]) -> list[str]:
    """How the draft length and confidence threshold were picked; empty without a tuning."""
    lines: list[str] = []
    tuning = log.get("tuning") or {}
    if tuning:
        lines += ["", f"Draft length and confidence threshold (read by HF from the assistant's `generation_config.json`) "
                  f"were picked by total assisted wall time on {tuning['images']} held-in images (seeds "
                  f"{tuning['first_seed']}..), not the measured ones; HF's defaults are 20 / 0.4:", "",
                  "| num_assistant_tokens | assistant_confidence_threshold | seconds |", "|---:|---:|---:|"]
        lines += [f"| {r['num_assistant_tokens']} | {r['assistant_confidence_threshold']} | {r['seconds']:.2f} |"
                  for r in tuning["grid"]]
    return lines


def write_model_card(out_dir: Path, log: DistillLog | dict) -> Path:
    """``MODEL_CARD.md`` of a shipped assistant from its log (figures, command, measurement); a
    hand-written ``## History`` section of the card it replaces is kept."""
    log = asdict(log) if isinstance(log, DistillLog) else log
    config = json.loads((out_dir / "config.json").read_text())
    settings = log["settings"]
    text = config["text_config"]
    size = sum(p.stat().st_size for p in out_dir.iterdir() if p.is_file() and p.name != "MODEL_CARD.md")
    last = log["losses"][-100:]
    m = log.get("measurement") or {}
    lines = _introduction(settings, log, text, size) + _distillation(settings, log, last)
    lines += _measurement(m, log)
    lines += _tuning(log)
    history = kept_section(out_dir / "MODEL_CARD.md", "## History")
    if history:
        lines += ["", *history]
    lines += [
        "",
        "## Limits",
        "",
        "- Only useful with this target (same tokenizer, processor and shapes world); retrain it when the target changes.",
        "- On this tiny target, one assistant forward costs a sizeable share of a target forward on CPU (the Python",
        "  overhead of each forward dominates), so wall-time gains are far below the tokens-per-forward figure.",
        "",
    ]
    path = out_dir / "MODEL_CARD.md"
    path.write_text("\n".join(lines))
    return path
