"""The decoding loop shared by every method.

    prefill -> x_1 ~ P_0
    repeat: tree = propose()                       # rooted at each row's last token
            P = process(target.forward(tree))      # one forward, tree mask, ragged cache
            result = verify(tree, P)               # lossless, per row
            commit(result); proposer.observe(...)  # keep accepted KV, drop the rest

Rows are logical requests. Under CFG each row owns two model rows (conditional first, then
unconditional) that share one window and one acceptance decision. Rows accept different
numbers of tokens; finished rows leave the batch. With ``max_batch`` (continuous batching)
queued requests take their places: their prefill runs on its own and its cache joins the
batch's, so a drafted batch stays full instead of draining to its slowest row.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from raydec.config import DecodeConfig
from raydec.models.base import DecodingTarget, ForwardOutput, PromptInputs, decoding_attention, stack_prompts
from raydec.spec.cache import RaggedCache
from raydec.spec.proposers.base import DecodeState, Prefill, Proposer
from raydec.spec.sampling import VocabConstraint, process_logits, row_generators, sample_rows
from raydec.spec.tree import DraftTree, identity_mask
from raydec.spec.verify import VerifyResult, verify_tree

logger = logging.getLogger(__name__)

Verifier = Callable[[DraftTree, torch.Tensor, Sequence[torch.Generator]], VerifyResult]


@dataclass
class RowRequest:
    """One generation request: an adapter-specific prompt, a seed, an optional length cap."""

    prompt: Any
    seed: int
    max_new_tokens: int | None = None


@dataclass
class RowStats:
    """Per-row decoding statistics. ``target_forwards`` includes the prefill."""

    target_forwards: int = 0
    accepted_lengths: list[int] = field(default_factory=list)  # tokens committed per decode forward
    wall_time_s: float = 0.0
    finish_reason: str = ""

    @property
    def tokens_per_forward(self) -> float:
        tokens = 1 + sum(self.accepted_lengths)
        return tokens / max(1, self.target_forwards)


@dataclass
class RowOutput:
    tokens: list[int]
    stats: RowStats


@dataclass
class _Run:
    """Per-request state of one ``generate`` call, indexed by request."""

    requests: Sequence[RowRequest]
    generators: list[torch.Generator]
    limits: list[int]
    stats: list[RowStats]
    generated: list[list[int]]
    admitted_at: list[float]  # perf_counter when the row was prefilled (its latency starts)
    on_finish: Callable[[int, RowOutput], None] | None
    context_ids: list[torch.Tensor | None] = field(default_factory=list)  # prompt token ids (repetition penalty)


def _left_pad(prompts: Sequence[PromptInputs], target: DecodingTarget) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad per-row prefixes into one prefill window.

    returns inputs_embeds [M, L, H], position_ids [M, L] (or [P, M, L]), valid [M, L] bool,
    next_position [M], image_index [M, L] (-1 = text or padding)
    """
    rows, width = len(prompts), max(p.length for p in prompts)
    lengths = torch.tensor([p.length for p in prompts])
    valid = torch.arange(width).unsqueeze(0) >= (width - lengths).unsqueeze(1)  # [M, L]
    if prompts[0].input_ids is not None:
        ids = torch.zeros(rows, width, dtype=torch.long)
        ids[valid] = torch.cat([p.input_ids.long() for p in prompts])
        embeds = target.embed_prompt_tokens(ids)
    else:
        first = prompts[0].inputs_embeds
        embeds = torch.zeros(rows, width, first.shape[-1], dtype=target.dtype, device=target.device)
        embeds[valid.to(embeds.device)] = torch.cat([p.inputs_embeds.to(embeds) for p in prompts])
    if all(p.position_ids is None for p in prompts):
        position_ids = (torch.arange(width).unsqueeze(0) - (width - lengths).unsqueeze(1)).clamp(min=0)
    else:
        positions = []
        for p in prompts:
            pos = p.position_ids if p.position_ids is not None else torch.arange(p.length)
            pad = torch.zeros(*pos.shape[:-1], width - p.length, dtype=torch.long)
            positions.append(torch.cat([pad, pos.long()], dim=-1))
        position_ids = torch.stack(positions, dim=-2)  # [M, L] or [P, M, L]
    next_position = torch.tensor([p.next_position if p.next_position is not None else p.length for p in prompts])
    image_index = torch.full((rows, width), -1, dtype=torch.long)
    for i, p in enumerate(prompts):
        if p.image_index is not None:
            image_index[i, width - p.length :] = p.image_index
    return embeds, position_ids, valid, next_position, image_index


def _prefill_mask(valid: torch.Tensor) -> torch.Tensor:
    """[M, L] valid -> [M, L, L] bool: causal over real tokens; padding sees only itself."""
    width = valid.shape[1]
    causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
    allowed = causal.unsqueeze(0) & valid.unsqueeze(1)
    return allowed | identity_mask(width).unsqueeze(0)


class Engine:
    """Decode a batch of rows with one target, one proposer and the shared verifier."""

    def __init__(
        self,
        target: DecodingTarget,
        proposer: Proposer,
        config: DecodeConfig,
        constraint: VocabConstraint | None = None,
        eos_token_ids: Sequence[int] = (),
        verifier: Verifier = verify_tree,
        max_positions: int | None = None,
    ) -> None:
        self.target = target
        self.proposer = proposer
        self.config = config
        self.constraint = constraint
        self.eos_token_ids = set(int(t) for t in eos_token_ids)
        self.verifier = verifier
        self.max_positions = max_positions  # the model's positions: a row stops where they end
        if config.sampling.repetition_penalty != 1.0 and config.sampling.uses_cfg:
            raise ValueError(
                f"sampling.repetition_penalty={config.sampling.repetition_penalty} is not supported with "
                f"classifier-free guidance (sampling.cfg_scale={config.sampling.cfg_scale})"
            )

    @property
    def streams(self) -> int:
        return 2 if self.config.sampling.uses_cfg else 1

    def _model_rows(self, rows: torch.Tensor, batch: int) -> torch.Tensor:
        """Logical rows -> their model rows (cond block, then uncond block)."""
        return torch.cat([rows + s * batch for s in range(self.streams)])

    @torch.inference_mode()
    def generate(
        self,
        requests: Sequence[RowRequest],
        max_batch: int | None = None,
        on_finish: Callable[[int, RowOutput], None] | None = None,
    ) -> list[RowOutput]:
        """Decode every request to EOS or its length cap.

        max_batch: at most this many rows decode together (None: all). A finished row's place
        goes to the next queued request (continuous batching) when the proposer can admit rows
        mid-run (``Proposer.admits_rows``); otherwise requests run in consecutive batches.
        on_finish(index, output): called as each request finishes, in finishing order.
        """
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        with decoding_attention(self.target.device):
            return self._generate(requests, max_batch or max(1, len(requests)), on_finish)

    def _generate(self, requests: Sequence[RowRequest], max_batch: int, on_finish: Callable[[int, RowOutput], None] | None) -> list[RowOutput]:
        for index, request in enumerate(requests):
            if request.max_new_tokens is not None and request.max_new_tokens < 1:
                raise ValueError(f"requests[{index}].max_new_tokens: {request.max_new_tokens} must be >= 1 (None: the config's)")
        run = _Run(
            requests=requests,
            generators=row_generators([r.seed for r in requests]),
            limits=[r.max_new_tokens if r.max_new_tokens is not None else self.config.max_new_tokens for r in requests],
            stats=[RowStats() for _ in requests],
            generated=[[] for _ in requests],
            admitted_at=[0.0] * len(requests),
            on_finish=on_finish,
            context_ids=[None] * len(requests),
        )
        generated = run.generated
        queue = list(range(len(requests)))
        active: list[int] = []
        cache: RaggedCache | None = None
        prob_dtype = torch.float32

        group = max(1, max_batch // 4)  # rows admitted together: one prefill and one cache copy for several
        while active or queue:
            room = max_batch - len(active)
            if queue and room >= min(group, len(queue)) and (not active or self.proposer.admits_rows):
                rows, queue = queue[:room], queue[room:]
                cache, prob_dtype = self._admit(run, rows, active, cache if active else None)  # an empty batch starts afresh
                active = self._retire(run, active + rows, cache)
                continue
            state = self._state(active, generated, run.generators, prob_dtype)
            tree = self.proposer.propose(state)
            target_probs, output = self._score(tree, cache, run, active)
            result = self.verifier(tree, target_probs, state.generators)
            self._commit(tree, result, cache, active, generated, run.limits, run.stats)
            self.proposer.observe(state, tree, target_probs, result, output)
            active = self._retire(run, active, cache)

        return [RowOutput(tokens=generated[row], stats=run.stats[row]) for row in range(len(requests))]

    def _admit(self, run: "_Run", rows: list[int], active: list[int], cache: RaggedCache | None) -> tuple[RaggedCache, torch.dtype]:
        """Prefill ``rows`` (request indices); P_0 gives each its first token. Their cache
        becomes the batch's, or joins it behind the ``active`` rows (model-row order kept:
        every conditional row, then every unconditional one)."""
        now = time.perf_counter()
        for row in rows:
            run.admitted_at[row] = now
        batch = len(rows)
        prompts = [self.target.prompt_inputs(run.requests[r].prompt) for r in rows]
        for row, prompt in zip(rows, prompts):
            run.context_ids[row] = prompt.token_ids
            self._fit_positions(run, row, prompt)
        if self.streams == 2:
            prompts += [self.target.prompt_inputs(run.requests[r].prompt, unconditional=True) for r in rows]
        prompts = stack_prompts(prompts)

        # prefill: every model row's prefix, left-padded
        joining = RaggedCache(len(prompts), compaction=self.config.compaction)
        embeds, positions, valid, next_position, image_index = _left_pad(prompts, self.target)
        mask = joining.attention_mask(_prefill_mask(valid), self.target.dtype)
        output = self.target.forward(embeds, None, positions, mask, joining.kv, want_hidden=self.proposer.wants_hidden)
        joining.start(valid, next_position)
        first_probs = process_logits(
            output.logits[:, -1:], self.config.sampling, batch, self.constraint, torch.zeros(batch, 1, dtype=torch.long),
            self._context(run, rows, output.logits.shape[-1]),
        )[:, 0].cpu()  # proposer and verifier state lives on the CPU
        first = sample_rows(first_probs, [run.generators[r] for r in rows]).tolist()
        for row, token in zip(rows, first):
            run.generated[row].append(int(token))
            run.stats[row].target_forwards = 1

        state = self._state(rows, run.generated, run.generators, first_probs.dtype)
        prefill = Prefill(output, embeds, valid, image_index)
        if cache is None:
            self.proposer.start(state, first_probs, prefill)
            return joining, first_probs.dtype
        self.proposer.admit(state, first_probs, prefill)
        cache.append_rows(joining, blocks=self.streams)  # cond(active), cond(new), uncond(active), uncond(new)
        return cache, first_probs.dtype

    def _fit_positions(self, run: "_Run", row: int, prompt: PromptInputs) -> None:
        """Cap a row's new tokens where the model's positions end (a prompt that fills them is an error)."""
        if self.max_positions is None:
            return
        start = prompt.next_position if prompt.next_position is not None else prompt.length  # M-RoPE: fewer than tokens
        room = self.max_positions - start
        if room < 1:
            raise ValueError(f"requests[{row}]: its prompt takes positions up to {start}, the model has {self.max_positions}")
        if run.limits[row] > room:
            logger.warning("requests[%d]: the prompt leaves %d of the model's %d positions; the row stops at %d new tokens "
                           "unless EOS comes first", row, room, self.max_positions, room)
            run.limits[row] = room

    # -- steps ---------------------------------------------------------------------------------

    def _state(self, active: list[int], generated: list[list[int]], generators: list[torch.Generator], dtype: torch.dtype) -> DecodeState:
        return DecodeState(
            row_ids=list(active),
            generated=[generated[r] for r in active],
            generators=[generators[r] for r in active],
            vocab_size=self.target.vocab_size,
            constraint=self.constraint,
            prob_dtype=dtype,
        )

    def _context(self, run: "_Run", rows: list[int], vocab: int, tree: DraftTree | None = None) -> torch.Tensor | None:
        """[B, N, V] bool: the tokens in each position's context (None without a repetition penalty).

        A row's context is its prompt and generated tokens; a tree node's adds the tokens on
        its path (its ancestors and itself), as plain decoding would have generated them.
        Without a tree: [B, 1, V], the context of the next token.
        """
        if self.config.sampling.repetition_penalty == 1.0:
            return None
        seen = torch.zeros(len(rows), vocab, dtype=torch.bool)
        for i, row in enumerate(rows):
            ids = run.context_ids[row]
            if ids is None:
                raise ValueError(
                    f"sampling.repetition_penalty={self.config.sampling.repetition_penalty}: "
                    f"{type(self.target).__name__} does not report its prompts' token ids"
                )
            seen[i, ids[(ids >= 0) & (ids < vocab)]] = True
            seen[i, torch.tensor(run.generated[row], dtype=torch.long)] = True
        if tree is None:
            return seen.unsqueeze(1)
        context = seen.unsqueeze(1).repeat(1, tree.num_nodes, 1)  # [B, N, V]
        b, n, m = tree.ancestor_mask().nonzero(as_tuple=True)  # node n's path holds node m
        context[b, n, tree.tokens[b, m]] = True
        return context

    def _score(self, tree: DraftTree, cache: RaggedCache, run: "_Run", active: list[int]) -> tuple[torch.Tensor, ForwardOutput]:
        """One target forward over every row's tree -> processed P [B, N, V]."""
        batch = tree.batch_size
        depth = tree.depth()  # [B, N]
        window = tree.ancestor_mask()  # [B, N, N]
        repeat = self.streams
        tokens_m, window_m, depth_m = tree.tokens, window, depth
        if repeat > 1:  # CFG: every model row of a request shares its tree
            tokens_m, window_m, depth_m = tokens_m.repeat(repeat, 1), window_m.repeat(repeat, 1, 1), depth_m.repeat(repeat, 1)
        mask = cache.attention_mask(window_m, self.target.dtype)
        positions = cache.window_positions(depth_m)
        output = self.target.forward(None, tokens_m, positions, mask, cache.kv, want_hidden=self.proposer.wants_hidden)
        gen_index = None  # only forced tokens need it: node at depth d predicts generated token len(generated) + d
        if self.constraint is not None and self.constraint.forced is not None:
            gen_index = torch.tensor([len(run.generated[r]) for r in active]).unsqueeze(1) + depth
        context = self._context(run, active, output.logits.shape[-1], tree)
        probs = process_logits(output.logits, self.config.sampling, batch, self.constraint, gen_index, context)
        return probs.cpu(), output

    def _commit(self, tree: DraftTree, result: VerifyResult, cache: RaggedCache, active: list[int], generated: list[list[int]], limits: list[int], stats: list[RowStats]) -> None:
        batch, width = tree.tokens.shape
        path = result.path.clamp(min=0)  # [B, N] padding -> the root, which every path holds
        keep = torch.zeros(batch, width, dtype=torch.bool).scatter_(1, path, True)  # root and accepted nodes
        path_tokens = tree.tokens.gather(1, path).tolist()  # root first
        num_accepted = result.num_accepted.tolist()
        next_tokens = result.next_token.tolist()
        for i, row in enumerate(active):
            n = num_accepted[i]
            new_tokens = path_tokens[i][1 : n + 1] + [next_tokens[i]]
            new_tokens = new_tokens[: limits[row] - len(generated[row])]
            for j, token in enumerate(new_tokens):
                if token in self.eos_token_ids:
                    new_tokens = new_tokens[: j + 1]
                    break
            generated[row].extend(new_tokens)
            stats[row].target_forwards += 1
            stats[row].accepted_lengths.append(len(new_tokens))
        cache.commit(keep.repeat(self.streams, 1) if self.streams > 1 else keep)

    def _retire(self, run: "_Run", active: list[int], cache: RaggedCache) -> list[int]:
        """Drop finished rows from the batch and the cache."""
        still = []
        for row in active:
            tokens, stats = run.generated[row], run.stats[row]
            if tokens and tokens[-1] in self.eos_token_ids:
                stats.finish_reason = "eos"
            elif len(tokens) >= run.limits[row]:
                stats.finish_reason = "length"
            else:
                still.append(row)
                continue
            stats.wall_time_s = time.perf_counter() - run.admitted_at[row]
            if run.on_finish is not None:
                run.on_finish(row, RowOutput(tokens=tokens, stats=stats))
        if len(still) != len(active):
            position = {row: i for i, row in enumerate(active)}
            index = torch.tensor([position[r] for r in still], dtype=torch.long)
            cache.select_rows(self._model_rows(index, len(active)))
        return still
