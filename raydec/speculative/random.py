"""Counter-based per-row randomness: a uniform is a pure function of (row seed, step, stream, index).

Every random number a decode step uses is ``hash(seed, step, stream, index)`` mapped to
[0, 1): the splitmix64 finaliser in int64 tensor ops, so one batched call serves every row on
any device, draws nothing from a shared state, and gives a row the same numbers whatever batch
it is in, in any order, on any device. ``step`` is the row's own decode-step count; ``stream``
names who draws (the verifier, a proposer's fill, ...), so draws of different purposes never
share a number; ``index`` is the node or slot.

int64 arithmetic wraps modulo 2**64 on every PyTorch backend, which is what the hash needs;
right shifts are made logical by masking the sign-extended bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _signed(value: int) -> int:
    """A 64-bit unsigned constant as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX_1 = _signed(0xBF58476D1CE4E5B9)
_MIX_2 = _signed(0x94D049BB133111EB)
_STEP = _signed(0xD1B54A32D192ED03)
_STREAM = _signed(0x8CB92BA72F3D8DD7)
_MANTISSA = (1 << 53) - 1


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bits."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser: a bijection of 64-bit words with full avalanche. int64 [...] -> [...]"""
    x = (x ^ _shift_right(x, 30)) * _MIX_1
    x = (x ^ _shift_right(x, 27)) * _MIX_2
    return x ^ _shift_right(x, 31)


@torch.library.custom_op("raydec::counter_uniforms", mutates_args=())
def counter_uniforms(seeds: torch.Tensor, steps: torch.Tensor, stream: int, count: int) -> torch.Tensor:
    """Uniforms in [0, 1), float64, one row per seed.

    seeds, steps: [B] int64 (same device); stream: who draws; count: how many  -> [B, count]
    Entry (r, i) depends only on (seeds[r], steps[r], stream, i): 53 random mantissa bits.

    An operator of its own: a compiled graph (``raydec.speculative.capture``) calls these eager
    kernels as they are. Generated code may not wrap int64 products the way they do (a signed
    overflow is undefined in C++, and fused loops on this CPU gave other bits), and a row's
    numbers must not depend on whether its step was captured.
    """
    key = mix64(seeds.long() + _GOLDEN)
    key = mix64(key ^ (steps.long() * _STEP + _signed((stream * _STREAM) % (1 << 64))))  # [B]
    index = torch.arange(1, count + 1, device=seeds.device, dtype=torch.long) * _GOLDEN
    bits = mix64(key.unsqueeze(1) + index)  # [B, count]
    return _shift_right(bits, 11).to(torch.float64) * (2.0**-53)


@counter_uniforms.register_fake
def _counter_uniforms_shape(seeds: torch.Tensor, steps: torch.Tensor, stream: int, count: int) -> torch.Tensor:
    return seeds.new_empty((seeds.shape[0], count), dtype=torch.float64)


def counter_normals(seeds: torch.Tensor, steps: torch.Tensor, stream: int, count: int) -> torch.Tensor:
    """Standard normals (Box-Muller on two counter uniforms each). -> [B, count] float64"""
    u = counter_uniforms(seeds, steps, stream, 2 * count).view(-1, count, 2)
    radius = torch.sqrt(-2.0 * torch.log1p(-u[..., 0]))  # 1 - u in (0, 1]: log finite
    return radius * torch.cos(2.0 * torch.pi * u[..., 1])


# Streams: one per purpose, so no two draws of a step share a number.
VERIFY = 0         # column 0: the final token (residual or bonus); column n: node n's test
FIRST_TOKEN = 1    # the token sampled from the prefill's P
JACOBI_FILL = 2    # fresh drafts and extra tree candidates of a Jacobi window
JACOBI_CARRY = 3   # the maximal coupling that carries untested drafts to the next window
GUMBEL = 4         # coupled decoding's public noise: indexed by generated position, not by step
FIRST_FREE_STREAM = 5  # streams from here up are free for proposers defined outside raydec

_LOWEST_EXPONENTIAL = 2.0**-60  # an Exp(1) draw of exactly 0 (u == 0) would win whatever its token's mass


def position_exponentials(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """The public noise of coupled decoding: one Exp(1) draw E per (row, generated position,
    token), a pure function of (seed, position, token). ``-log E`` is a standard Gumbel.

    seeds: [B] int64; positions: [B, M] int64, the generated-token index each entry is for
    (the first generated token is 0)  -> [B, M, V] float64, > 0

    The noise never depends on the step, the window, the batch or the method: a row's sampled
    token at position j is ``argmax(P_j / E_j)`` = ``argmax(log P_j + G_j)`` (Gumbel-max, a
    sample of P_j), fixed once the prefix is, whoever drafted it.
    """
    batch, count = positions.shape
    u = counter_uniforms(seeds.long().repeat_interleave(count), positions.reshape(-1), GUMBEL, vocab)  # [B * M, V]
    return torch.neg(torch.log1p(-u)).clamp_min_(_LOWEST_EXPONENTIAL).view(batch, count, vocab)


@dataclass
class RowRandom:
    """The random streams of the rows in a batch (in batch order).

    seeds: [B] int64  the rows' seeds
    steps: [B] int64  each row's decode-step count (the prefill is step 0)
    positions: [B] int64  each row's generated tokens so far (its root's P predicts generated
               token ``positions``); None until the session sets it for a step
    """

    seeds: torch.Tensor
    steps: torch.Tensor
    positions: torch.Tensor | None = None
    coupled: torch.Tensor | None = None  # [B] bool: the row samples by Gumbel coupling (None: none does)

    def exponentials(self, offsets: torch.Tensor, vocab: int) -> torch.Tensor:
        """``position_exponentials`` at ``positions + offsets``. offsets: [B, M] or [M] long -> [B, M, V] float64"""
        if self.positions is None:
            raise ValueError("coupled noise needs the rows' generated positions (RowRandom.positions)")
        return position_exponentials(self.seeds, self.positions.unsqueeze(1) + offsets.to(self.positions.device), vocab)

    def at_positions(self, positions: torch.Tensor) -> "RowRandom":
        """The same rows with their generated positions ([B] long) for this step."""
        return RowRandom(self.seeds, self.steps, positions.to(self.seeds.device), self.coupled)

    def uniforms(self, stream: int, count: int) -> torch.Tensor:
        """[B, count] float64 in [0, 1)."""
        return counter_uniforms(self.seeds, self.steps, stream, count)

    def normals(self, stream: int, count: int) -> torch.Tensor:
        """[B, count] float64 standard normals."""
        return counter_normals(self.seeds, self.steps, stream, count)

    @classmethod
    def for_seeds(cls, seeds: list[int], device: torch.device | str = "cpu", coupled: list[bool] | None = None) -> "RowRandom":
        """Rows at step 0. Seeds are taken modulo 2**64 (as int64 bits); ``coupled``: which rows
        sample by Gumbel coupling (None: none)."""
        words = [_signed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF) for seed in seeds]
        seeds_t = torch.tensor(words, dtype=torch.long, device=device)
        flags = torch.tensor(coupled, dtype=torch.bool, device=device) if coupled is not None else torch.zeros_like(seeds_t, dtype=torch.bool)
        return cls(seeds_t, torch.zeros_like(seeds_t), None, flags)

    def select(self, index: torch.Tensor) -> "RowRandom":
        """The rows at ``index`` ([B'] long)."""
        index = index.to(self.seeds.device)
        return RowRandom(self.seeds[index], self.steps[index], None, None if self.coupled is None else self.coupled[index])

    def cat(self, other: "RowRandom") -> "RowRandom":
        return RowRandom(torch.cat([self.seeds, other.seeds]), torch.cat([self.steps, other.steps]), None,
                         torch.cat([self.flags(), other.flags()]))

    def flags(self) -> torch.Tensor:
        """[B] bool ``coupled``, all False when unset."""
        return self.coupled if self.coupled is not None else torch.zeros_like(self.seeds, dtype=torch.bool)

    def advanced(self) -> "RowRandom":
        """Every row one step on."""
        return RowRandom(self.seeds, self.steps + 1, None, self.coupled)
