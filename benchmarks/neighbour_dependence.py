"""How much a random image token moves the target's prediction of the next one.

    python benchmarks/neighbour_dependence.py --prompts 16

Jacobi drafts are stale: the draft for slot k+1 was drawn from P computed with the old token
at k. When the token at k changes, the draft passes with probability 1 - TV(P_{k+1}, P'_{k+1})
(for a draft drawn from the old P). This takes AR images of held-out shapes prompts; at
``--per-image`` random slots k (where the target's P for token k has entropy above
``--entropy`` nats) it swaps token k for another draw from that P and measures the total
variation between the target's P for token k+1 before and after (CFG on, the checkpoint's
sampling). Small distances mean a changed random token leaves the next drafts valid, so
adaptive continuation and proactive drafting have little to repair.
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="reference")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--per-image", type=int, default=8, help="random slots changed per image")
    parser.add_argument("--entropy", type=float, default=0.5, help="nats: a slot is random above this")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from raydec.api import generate_images, load_target
    from raydec.config import DecodeConfig
    from raydec.models.image_gen import ImagePrompt
    from raydec.reference.shapes import HELD_OUT_SEED_START, make_sample
    from raydec.speculative.engine import Engine
    from raydec.speculative.requests import RowRequest
    from raydec.speculative.proposers.oracle import OracleProposer
    from raydec.speculative.verify import verify_tree

    target = load_target(args.model, "t2i", dtype=torch.float32)
    length = int(target.num_image_tokens)
    config = DecodeConfig(method="ar", max_new_tokens=length, sampling=target.default_sampling())
    prompts = [make_sample(HELD_OUT_SEED_START + i).prompt for i in range(args.prompts)]
    images = generate_images(prompts, model=target, decode=DecodeConfig(method="ar"), seeds=list(range(len(prompts))), batch_size=1)

    def predictions(prompt: str, seed: int, tokens: list[int]) -> torch.Tensor:
        """The target's processed P for tokens[1:], each given the tokens before it: [n, V]
        (one forward over the whole image as a chain of one-hot drafts; row k predicts token k+1)."""
        seen: list[torch.Tensor] = []

        def verifier(tree, target_probs, uniforms):
            if not seen:
                seen.append(target_probs[0].clone())
            return verify_tree(tree, target_probs, uniforms)

        engine = Engine(target, OracleProposer(length, {0: tokens}), config.sampling, config.max_new_tokens, constraint=target.vocab_constraint(),
                        eos_token_ids=target.eos_token_ids, verifier=verifier)
        first = engine.generate([RowRequest(ImagePrompt(prompt, None), seed=seed, max_new_tokens=length)])[0].tokens[0]
        if first != tokens[0]:
            raise RuntimeError("the first token differs from the AR image's: not the same seed and sampling")
        return seen[0]

    generator = torch.Generator().manual_seed(args.seed)
    distances, next_random, random_share = [], [], []
    for index, (prompt, image) in enumerate(zip(prompts, images)):
        tokens = list(image.tokens)
        p = predictions(prompt, index, tokens)  # p[k]: P of token k+1
        entropy = -(p * p.clamp_min(1e-12).log()).sum(dim=-1)
        random_slots = [k for k in range(1, length - 1) if entropy[k - 1] > args.entropy]
        random_share.append(len(random_slots) / (length - 2))
        for j in torch.randperm(len(random_slots), generator=generator)[: args.per_image].tolist():
            k = random_slots[j]
            others = p[k - 1].clone()
            others[tokens[k]] = 0.0
            swapped = tokens[:k] + [int(torch.multinomial(others, 1, generator=generator))] + tokens[k + 1 :]
            p_swapped = predictions(prompt, index, swapped)
            distances.append(0.5 * float((p[k] - p_swapped[k]).abs().sum()))
            next_random.append(bool(entropy[k] > args.entropy))
    if not distances:
        print(f"neighbour dependence: {args.model}: no slot above {args.entropy} nats in {len(prompts)} AR images; nothing to swap")
        return
    tv = torch.tensor(distances)
    print(f"neighbour dependence: {args.model}, {len(prompts)} AR images, {len(tv)} random tokens swapped; "
          f"random slots (H > {args.entropy} nats) {100 * sum(random_share) / len(random_share):.0f}% of each image on average")
    follows = torch.tensor(next_random)
    for name, chosen in (("all", torch.ones_like(follows)), ("next slot random too", follows), ("next slot near-deterministic", ~follows)):
        t = tv[chosen]
        if len(t):
            q = t.quantile(torch.tensor([0.25, 0.5, 0.75, 0.9])).tolist()
            print(f"  {name:28} n={len(t):4}  TV mean {t.mean():.3f}  quartiles {q[0]:.3f} / {q[1]:.3f} / {q[2]:.3f}  90% {q[3]:.3f}  "
                  f"(a stale draft passes with prob {1 - t.mean():.3f} on average)")


if __name__ == "__main__":
    main()
