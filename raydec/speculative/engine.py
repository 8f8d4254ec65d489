"""The decoding loop shared by every method.

    prefill -> x_1 ~ P_0
    repeat: tree = propose()                       # rooted at each row's last token
            P = process(target.forward(tree))      # one forward, tree mask, ragged cache
            result = verify(tree, P)               # lossless, per row
            commit(result); proposer.observe(...)  # keep accepted KV, drop the rest

Rows are logical requests. Under CFG each row owns two model rows, side by side (conditional,
then unconditional), that share one window and one acceptance decision. Rows accept different
numbers of tokens; finished rows leave the batch. A ``DecodeSession`` takes requests while it
runs (continuous batching): queued requests take the places of finished or cancelled rows, when
the empty places have cost what a refill wastes (``raydec.speculative.refill``);
their prefill runs on its own and its cache joins the batch's behind the active rows (written in
place: the batch's cache has room for ``batch_size`` rows, and a leaving row's place takes a row
from the end), so a drafted batch stays full instead of draining to its slowest row.
``Engine.generate`` is a loop over a session.

Where a step's work runs: on the target's device. P stays there; the verifier returns
tensors; one read-back per step brings the committed tokens and counts to the host
(``_read_commit``), where length caps, stop tokens and statistics are applied to Python ints.
Randomness is counter-based (``raydec.speculative.random``): a row's numbers depend on its
seed and step only.

Captured steps (``compile``, see ``raydec.speculative.capture``): the step's pure tensor work
(the proposer's window or draft tree, processing the logits, the verification with its keep mask
and packed read-back, the proposer's carry-over) runs as graphs compiled per batch bucket; the
target forward, the cache's masks and bookkeeping stay eager.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, ContextManager, Literal, Sequence

import torch

from raydec.config import SamplingConfig
from raydec.speculative.admission import Admission, AdmitsRows
from raydec.speculative.buffers import KeptBuffer
from raydec.speculative.capture import CompileMode, StepGraph, resolve_compile
from raydec.speculative.cache import DEFAULT_LAYOUT, CacheLayout, RaggedCache
from raydec.speculative.live_proposer import FollowsPolicy
from raydec.speculative.refill import RefillPolicy
from raydec.speculative.proposers.base import DecodeState, Proposer
from raydec.speculative.random import RowRandom
from raydec.speculative.requests import COUPLINGS, Coupling, RowOutput, RowRequest, RowState
from raydec.speculative.sampling import VocabConstraint, process_logits
from raydec.speculative.session import SessionRows, fill_from_the_end
from raydec.speculative.target import DecodingTarget, ForwardOutput, PromptInputs
from raydec.speculative.tree import DraftTree
from raydec.speculative.verify import VerifyResult, verify_tree
from raydec.speculative.verify_step import Verifier, tree_facts, tree_tensors, verify_step



class Engine:
    """Decode rows with one target, one proposer and the shared verifier.

    sampling:       the distribution every row samples from, unless its request brings its own
                    (``RowRequest.sampling``; classifier-free guidance is the engine's alone)
    max_new_tokens: a row's length cap, unless its request sets one
    constraint:     the token ids the output may take, and the tokens its layout forces
    eos_token_ids:  tokens that end a row (a request may add stop tokens of its own)
    verifier:       the lossless verifier (``verify_tree``)
    max_positions:  the model's positions: a row stops where they end (None: no limit)
    compaction:     when the ragged KV cache drops rejected slots physically
    cache_layout:   how its layers store keys and values ("slots": written in place; "concat":
                    appended by concatenation, a copy of the whole cache per forward)
    compile:        capture the step's tensor work per batch bucket (``resolve_compile``: auto is
                    on for CUDA); a verifier other than ``verify_tree`` always runs eagerly
    coupling:       how a row's samples follow from its seed, unless its request says
                    (``RowRequest.coupling``): "rejection", or "gumbel" (drafter-invariant:
                    ``verify_coupled``). The engine's own default is rejection; the entry
                    points pass ``DecodeConfig.coupling``, whose default is gumbel
    """

    def __init__(
        self,
        target: DecodingTarget,
        proposer: Proposer,
        sampling: SamplingConfig,
        max_new_tokens: int,
        *,
        constraint: VocabConstraint | None = None,
        eos_token_ids: Sequence[int] = (),
        verifier: Verifier = verify_tree,
        max_positions: int | None = None,
        compaction: Literal["auto", "always", "never"] = "auto",
        cache_layout: CacheLayout = DEFAULT_LAYOUT,
        compile: CompileMode = "auto",
        coupling: Coupling = "rejection",
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: {max_new_tokens} must be >= 1")
        if coupling not in COUPLINGS:
            raise ValueError(f"coupling: {coupling!r} is not one of {', '.join(COUPLINGS)}")
        self.coupling = coupling
        self.target = target
        self.proposer = proposer
        self.sampling = sampling
        self.max_new_tokens = max_new_tokens
        self.constraint = constraint
        self.eos_token_ids = set(int(t) for t in eos_token_ids)
        self.verifier = verifier
        self.max_positions = max_positions
        self.compaction = compaction
        self.cache_layout = cache_layout
        self.captured = resolve_compile(compile, target.device)
        self.verify_graph = StepGraph(verify_step, "verify", self.captured and verifier is verify_tree, target.device)
        self.process_graph = StepGraph(_process_rows, "process", self.captured, target.device)
        proposer.capture(self.captured, target.device)
        if sampling.repetition_penalty != 1.0 and sampling.uses_cfg:
            raise ValueError(
                f"sampling.repetition_penalty={sampling.repetition_penalty} is not supported with "
                f"classifier-free guidance (sampling.cfg_scale={sampling.cfg_scale})"
            )
        if sampling.uses_cfg and proposer.wants_hidden:
            raise ValueError(f"sampling.cfg_scale={sampling.cfg_scale}: classifier-free guidance needs a proposer without a draft "
                             f"model ({type(proposer).__name__} drafts from the conditional rows' hidden states alone); use ar or a "
                             f"Jacobi method, or cfg_scale 1")

    def step_graphs(self) -> list[StepGraph]:
        """Every captured function of this engine's step: the verification, the processing, the proposer's."""
        return [self.verify_graph, self.process_graph, *self.proposer.step_graphs()]

    @property
    def streams(self) -> int:
        return 2 if self.sampling.uses_cfg else 1

    def session(self, batch_size: int | None = None, on_finish: Callable[[int, RowOutput], None] | None = None) -> "DecodeSession":
        """A session that takes requests while it runs (see ``DecodeSession``)."""
        return DecodeSession(self, batch_size, on_finish)

    @torch.inference_mode()
    def generate(
        self,
        requests: Sequence[RowRequest],
        batch_size: int | None = None,
        on_finish: Callable[[int, RowOutput], None] | None = None,
    ) -> list[RowOutput]:
        """Decode every request to EOS or its length cap: submit them all, step until done.

        batch_size: at most this many rows decode together (None: all). A finished row's place
        goes to the next queued request (continuous batching) when the proposer can admit rows
        mid-run (``Proposer.admits_rows``); otherwise requests run in consecutive batches.
        on_finish(index, output): called as each request finishes, in finishing order.
        """
        session = self.session(batch_size if batch_size is not None else max(1, len(requests)), on_finish)
        handles = [session.submit(request) for request in requests]
        while session.busy:
            session.step()
        return [session.output(handle) for handle in handles]


class DecodeSession(AdmitsRows, SessionRows, FollowsPolicy):
    """An engine run that takes requests while it decodes.

        handle = session.submit(request)   # queued; joins the batch between steps
        finished = session.step()          # admit queued rows, or decode one step
        session.cancel(handle)             # a queued row never starts; a decoding row leaves

    ``step`` returns the handles that finished in it (EOS, length cap or cancel) and those
    cancelled while queued since the last step (each once; not one released meanwhile); their
    ``output(handle)`` is final, and ``release(handle)`` drops them. So a loop that releases what
    ``step`` returns holds no row once ``busy`` is False. Handles count from 0 in submission
    order. A session is single-threaded: a scheduler (behind a Serve replica) or a batch worker drives it from one loop.
    ``follow(policy)`` takes the proposer from a policy before each decode step (``raydec.speculative.live_proposer``).
    The rows' record (``submit``, ``cancel``, ``release``, ``output``, ``busy``) is ``SessionRows``'s
    (``raydec.speculative.session``); this class adds the device work: the cache, admission, the steps.
    """

    def __init__(self, engine: Engine, batch_size: int | None = None, on_finish: Callable[[int, RowOutput], None] | None = None) -> None:
        super().__init__(engine, batch_size, on_finish)
        self.cache: RaggedCache | None = None
        self.random: RowRandom | None = None  # the active rows' streams, in batch order, on the device
        self.prob_dtype = torch.float32
        self.steps = 0  # decode steps run
        self.refill = RefillPolicy()  # when queued rows join (raydec.speculative.refill)
        # prompt tokens one step prefills at most (the left-padded window: model rows x the longest prompt; a longer prompt
        # joins alone and is prefilled in chunks), with a decode step after each admission step while rows decode;
        # None: every queued row that has a place joins in one prefill, and admissions may follow each other
        self.prefill_budget: int | None = None
        self._prompts: dict[int, PromptInputs] = {}  # queued rows' prefixes, made early when the budget needs their lengths
        self._admitted_last = False  # the last step admitted rows: under a budget, the next one decodes the batch (when it has rows)
        self._admission: Admission | None = None  # rows being prefilled (in chunks under a budget): no other admission starts
        self._admission_running = False  # rows were decoding when it started (the refill policy's record)
        self._admission_seconds = 0.0  # its steps' seconds so far
        self._probs = KeptBuffer()  # this step's P: lives until the proposer's ``observe``

    # -- the steps -------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, decode_scope: Callable[[], ContextManager] | None = None) -> list[int]:
        """Admit queued rows (their prefill) if there is room, else decode one step of the batch.

        Returns the handles that finished (see the class docstring).
        decode_scope: a decode step runs inside ``decode_scope()``, admission and the rows leaving
        outside it (a timer or profiler sees the step's own work alone; not entered when the
        call admits rows).
        """
        finished = self._held_unreported() + self._retire()
        self._unreported = []
        if not (self.active or self.queue or self._admission):
            return finished
        batch_size = self.batch_size or max(1, len(self.active) + len(self.queue))
        room = batch_size - len(self.active)
        start = time.perf_counter()
        # under a budget, rows decoding never wait out two admission steps in a row: one, then a decode step
        may_admit = not self.active or (self.engine.proposer.admits_rows and not (self._admitted_last and self.prefill_budget is not None))
        if self._admission is not None and may_admit:  # a prefill in chunks goes on
            self._admission_seconds += self._prefill_step(self._admission, start)
            self._admitted_last = True
        elif self._admission is None and self.refill.should_admit(len(self.active), len(self.queue), batch_size) and may_admit:
            joining = self._joining(room)
            taken = set(joining)
            self.queue = [handle for handle in self.queue if handle not in taken]
            self._admission_running = bool(self.active)
            self._admission_seconds = 0.0
            self._admission = self._begin_admission(joining)
            self._admission_seconds += self._prefill_step(self._admission, start)
            self._admitted_last = True
        else:
            with decode_scope() if decode_scope is not None else contextlib.nullcontext():
                self._decode_step()
            self.refill.stepped(time.perf_counter() - start, len(self.active), len(self.queue), batch_size)
            self._admitted_last = False
        return finished + self._retire()

    @property
    def busy(self) -> bool:
        """``step`` has work: rows decoding, queued or being prefilled, or a cancelled row yet to be reported."""
        return super().busy or self._admission is not None

    @property
    def occupancy(self) -> float | None:
        """Mean share of ``batch_size`` decoding over the steps run while rows were queued (None: no row waited)."""
        return self.refill.occupancy

    # -- one decode step -------------------------------------------------------------------------

    def _coupling(self, row: RowState) -> Coupling:
        return row.request.coupling or self.engine.coupling

    def _couplings(self) -> str:
        """The active rows' coupling: "rejection", "gumbel", or "mixed" (host facts, no read-back)."""
        modes = {self._coupling(self.rows[h]) for h in self.active}
        return modes.pop() if len(modes) == 1 else "mixed"

    @torch.inference_mode()  # the step writes into tensors it made in inference mode (its buffers)
    def _decode_step(self) -> None:
        engine = self.engine
        generated = [self.rows[h].generated for h in self.active]
        coupling = self._couplings()
        if coupling != "rejection":  # the noise is indexed by generated position: one host-to-device copy
            self.random = self.random.at_positions(torch.tensor([len(tokens) for tokens in generated], dtype=torch.long))
        state = DecodeState(list(self.active), generated, self.random, engine.target.vocab_size, engine.constraint, self.prob_dtype,
                            coupling)
        self._take_proposer(state)  # a session that follows a policy (``follow``) may swap its proposer here
        tree = engine.proposer.propose(state)
        target_probs, output = self._score(tree)
        tree = tree.to(target_probs.device)
        result, keep, packed = self._verify(tree, target_probs)
        result.accepted_counts = self._commit(result, keep, packed)
        engine.proposer.observe(state, tree, target_probs, result, output)
        self.random = self.random.advanced()
        self.steps += 1

    def _context(self, handles: list[int], vocab: int, tree: DraftTree | None = None) -> torch.Tensor | None:
        """[B, N, V] bool: the tokens in each position's context (None without a repetition penalty).

        A row's context is its prompt and generated tokens; a tree node's adds the tokens on
        its path (its ancestors and itself), as plain decoding would have generated them.
        Without a tree: [B, 1, V], the context of the next token.
        """
        if not self._penalised(handles):
            return None
        seen = torch.zeros(len(handles), vocab, dtype=torch.bool)
        for i, handle in enumerate(handles):
            row = self.rows[handle]
            ids = row.context_ids
            if ids is None:
                penalty = (row.sampling or self.engine.sampling).repetition_penalty
                raise ValueError(
                    f"sampling.repetition_penalty={penalty}: "
                    f"{type(self.engine.target).__name__} does not report its prompts' token ids"
                )
            ids = ids.cpu()
            seen[i, ids[(ids >= 0) & (ids < vocab)]] = True
            seen[i, torch.tensor(row.generated, dtype=torch.long)] = True
        seen = seen.to(self.engine.target.device)
        if tree is None:
            return seen.unsqueeze(1)
        context = seen.unsqueeze(1).repeat(1, tree.num_nodes, 1)  # [B, N, V]
        b, n, m = tree.ancestor_mask().to(seen.device).nonzero(as_tuple=True)  # node n's path holds node m
        context[b, n, tree.tokens.to(seen.device)[b, m]] = True
        return context

    def _score(self, tree: DraftTree) -> tuple[torch.Tensor, ForwardOutput]:
        """One target forward over every row's tree -> processed P [B, N, V] (on the target's device)."""
        engine, cache = self.engine, self.cache
        batch = tree.batch_size
        device = cache.device
        depth = tree.depth().to(device)  # [B, N]
        window = tree.ancestor_mask().to(device)  # [B, N, N]
        repeat = engine.streams
        tokens_m, window_m, depth_m = tree.tokens.to(device), window, depth
        if repeat > 1:  # CFG: both model rows of a request share its tree
            tokens_m, window_m, depth_m = (t.repeat_interleave(repeat, dim=0) for t in (tokens_m, window_m, depth_m))
        mask = cache.attention_mask(window_m, engine.target.dtype)
        positions = cache.window_positions(depth_m)
        output = engine.target.forward(None, tokens_m, positions, mask, cache.kv, want_hidden=engine.proposer.wants_hidden)
        gen_index = None  # only forced tokens need it: node at depth d predicts generated token len(generated) + d
        if engine.constraint is not None and engine.constraint.forced is not None:
            lengths = torch.tensor([len(self.rows[h].generated) for h in self.active], device=device)
            gen_index = lengths.unsqueeze(1) + depth
        context = self._context(self.active, output.logits.shape[-1], tree)
        sampling = self._sampling_of(self.active, output.logits.device)
        if engine.process_graph.enabled and context is None and isinstance(sampling, SamplingConfig):
            rows = output.logits.view(batch, repeat, *output.logits.shape[1:])  # [B, streams, N, V]
            (probs,) = engine.process_graph(batch, (rows,) + ((gen_index,) if gen_index is not None else ()),
                                            sampling=sampling, constraint=engine.constraint)
            return probs, output
        probs = process_logits(output.logits, sampling, batch, engine.constraint, gen_index, context, out=self._probs_buffer(output.logits))
        return probs, output

    def _verify(self, tree: DraftTree, target_probs: torch.Tensor) -> tuple[VerifyResult, torch.Tensor, torch.Tensor]:
        """The verification (``verify_step``; captured when the engine captures its step) ->
        the result, keep [B, N] and the packed read-back [B, N + 2]."""
        engine, random = self.engine, self.random
        coupling = self._couplings()
        positions = random.positions if random.positions is not None else torch.zeros_like(random.steps)
        path, num_accepted, next_token, stop_node, rejected, keep, packed = engine.verify_graph(
            tree.batch_size, (*tree_tensors(tree), target_probs, random.seeds, random.steps, positions, random.flags()),
            verifier=engine.verifier, coupling=coupling, **tree_facts(tree),
        )
        return VerifyResult(path, num_accepted, next_token, stop_node, rejected), keep, packed

    def _probs_buffer(self, logits: torch.Tensor) -> torch.Tensor:
        """This step's [B, N, V] P buffer, float64 for float64 logits and float32 otherwise."""
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        return self._probs.get((len(self.active), *logits.shape[1:]), dtype, logits.device)

    def _commit(self, result: VerifyResult, keep: torch.Tensor, packed: torch.Tensor) -> list[int]:
        """Bring the step's outcome to the host in one read-back (``packed``), apply caps and stop
        tokens, keep the accepted KV (``keep`` [B, N]). Returns each row's accepted draft count
        (as the verifier decided)."""
        engine = self.engine
        outcome = _read_commit(packed)
        accepted_counts = []
        for handle, (num_accepted, stop_node, tokens) in zip(self.active, outcome):
            row = self.rows[handle]
            new_tokens = tokens[: row.limit - len(row.generated)]
            for j, token in enumerate(new_tokens):
                if token in row.stop:
                    new_tokens = new_tokens[: j + 1]
                    break
            row.generated.extend(new_tokens)
            row.stats.target_forwards += 1
            row.stats.accepted_lengths.append(len(new_tokens))
            accepted_counts.append(num_accepted)
        kept = [n + 1 for n in accepted_counts]
        last_kept = max((stop for _, stop, _ in outcome), default=0)
        if engine.streams > 1:  # a request's model rows keep the same slots
            keep, kept = keep.repeat_interleave(engine.streams, dim=0), [n for n in kept for _ in range(engine.streams)]
        self.cache.commit(keep, kept, last_kept)
        return accepted_counts

    # -- rows leaving ----------------------------------------------------------------------------

    def _retire(self) -> list[int]:
        """Drop finished and cancelled rows from the batch and the cache; returns their handles.
        A staying row's place may change (``fill_from_the_end``); its tokens never do."""
        finished, leaving = self._leaving()
        if finished:
            index = fill_from_the_end(len(self.active), leaving)
            streams = self.engine.streams
            self.cache.select_rows([i * streams + s for i in index for s in range(streams)])
            self.random = self.random.select(torch.tensor(index, dtype=torch.long))
            self.active = [self.active[i] for i in index]
        return finished


def _read_commit(packed: torch.Tensor) -> list[tuple[int, int, list[int]]]:
    """The step's one device-to-host transfer: per row (accepted drafts, stop node, committed
    tokens: the accepted drafts then the final token). packed: [B, N + 2] (``verify_step``)."""
    return [(n, stop, tokens[: n + 1]) for n, stop, *tokens in packed.tolist()]


def _process_rows(logits: torch.Tensor, *gen_index: torch.Tensor, sampling: SamplingConfig, constraint: VocabConstraint | None) -> tuple[torch.Tensor]:
    """``process_logits`` over rows that lead: logits [B, streams, N, V] (CFG: conditional, then
    unconditional), gen_index [B, N] when the constraint forces tokens -> (P [B, N, V],)"""
    batch, repeat = logits.shape[:2]
    model_rows = logits.reshape(batch * repeat, *logits.shape[2:])  # each request's model rows side by side
    return (process_logits(model_rows, sampling, batch, constraint, gen_index[0] if gen_index else None, in_place=False),)
