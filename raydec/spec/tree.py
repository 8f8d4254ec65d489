"""Draft trees: what a proposer hands the verifier.

Per row, node 0 is the *root*: the last committed token, whose KV is not yet cached. Every
other node is a draft token with a parent (``parents[i] < i``) and the proposal it was drawn
from: a dense distribution ``q`` (an index into ``proposal_probs``) or ``-1`` for a
deterministic draft (one-hot ``q``). Siblings are ordered by node index; the verifier tests
them in that order. A sibling marked ``without_replacement`` was drawn from its group's ``q``
with the tokens of the earlier siblings sharing that ``q`` removed, and the verifier accounts
for it. A chain is a tree with one child per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

DETERMINISTIC = -1  # proposal_index of a one-hot (deterministic) draft


def identity_mask(width: int) -> torch.Tensor:
    """[width, width] bool identity (``torch.eye`` on bool is oddly slow on CPU)."""
    index = torch.arange(width)
    return index.unsqueeze(0) == index.unsqueeze(1)


@dataclass
class TreeBuilder:
    """Build one row's draft tree node by node (node 0 = root)."""

    root_token: int
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    proposal_index: list[int] = field(default_factory=list)
    without_replacement: list[bool] = field(default_factory=list)
    proposals: list[torch.Tensor] = field(default_factory=list)  # each [V]

    def __post_init__(self) -> None:
        self.tokens.append(int(self.root_token))
        self.parents.append(-1)
        self.proposal_index.append(DETERMINISTIC)
        self.without_replacement.append(False)

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    def add_proposal(self, q: torch.Tensor) -> int:
        """Register a dense proposal distribution q: [V]; returns its index."""
        self.proposals.append(q)
        return len(self.proposals) - 1

    def add(self, parent: int, token: int, proposal: int = DETERMINISTIC, without_replacement: bool = False) -> int:
        """Add a draft node under ``parent``; returns the new node's index."""
        if not 0 <= parent < len(self.tokens):
            raise ValueError(f"parent {parent} does not exist (tree has {len(self.tokens)} nodes)")
        if proposal != DETERMINISTIC and not 0 <= proposal < len(self.proposals):
            raise ValueError(f"proposal {proposal} not registered")
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.proposal_index.append(proposal)
        self.without_replacement.append(bool(without_replacement))
        return len(self.tokens) - 1

    def add_chain(self, parent: int, tokens: Sequence[int], proposals: Sequence[int] | None = None) -> list[int]:
        """Append a chain under ``parent``; ``proposals`` gives each token's proposal index."""
        nodes = []
        for i, token in enumerate(tokens):
            parent = self.add(parent, token, DETERMINISTIC if proposals is None else proposals[i])
            nodes.append(parent)
        return nodes


@dataclass
class DraftTree:
    """A batch of draft trees, padded to N nodes.

    tokens:              [B, N] long   node tokens (node 0 = root)
    parents:             [B, N] long   parent index, -1 for the root and for padding
    valid:               [B, N] bool   real node (False = padding)
    proposal_index:      [B, N] long   index into proposal_probs, -1 = deterministic / none
    without_replacement: [B, N] bool   drawn from its q after removing earlier siblings' tokens
    proposal_probs:      [B, Q, V]     dense proposals (Q may be 0)
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    valid: torch.Tensor
    proposal_index: torch.Tensor
    without_replacement: torch.Tensor
    proposal_probs: torch.Tensor
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # derived masks

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    def node_counts(self) -> list[int]:
        return self.valid.sum(dim=1).tolist()

    def index_extent(self) -> list[int]:
        """Per row, 1 + the highest valid node index (a row's own layout; holes included)."""
        if bool(self.valid.all()):
            return [self.num_nodes] * self.batch_size
        index = torch.arange(self.num_nodes).expand_as(self.valid)
        return (torch.where(self.valid, index, torch.zeros_like(index)).max(dim=1).values + 1).tolist()

    @classmethod
    def stack(cls, builders: Sequence[TreeBuilder], vocab_size: int, dtype: torch.dtype = torch.float32) -> "DraftTree":
        """Pad and stack per-row builders into one batch."""
        batch = len(builders)
        width = max(b.num_nodes for b in builders)
        num_q = max((len(b.proposals) for b in builders), default=0)
        tokens = torch.zeros(batch, width, dtype=torch.long)
        parents = torch.full((batch, width), -1, dtype=torch.long)
        valid = torch.zeros(batch, width, dtype=torch.bool)
        proposal_index = torch.full((batch, width), DETERMINISTIC, dtype=torch.long)
        without_replacement = torch.zeros(batch, width, dtype=torch.bool)
        proposal_probs = torch.zeros(batch, num_q, vocab_size, dtype=dtype)
        for row, builder in enumerate(builders):
            n = builder.num_nodes
            tokens[row, :n] = torch.tensor(builder.tokens)
            parents[row, :n] = torch.tensor(builder.parents)
            valid[row, :n] = True
            proposal_index[row, :n] = torch.tensor(builder.proposal_index)
            without_replacement[row, :n] = torch.tensor(builder.without_replacement)
            if builder.proposals:
                proposal_probs[row, : len(builder.proposals)] = torch.stack(builder.proposals).to(dtype)
        return cls(tokens, parents, valid, proposal_index, without_replacement, proposal_probs)

    @classmethod
    def roots_only(cls, roots: torch.Tensor, vocab_size: int, dtype: torch.dtype = torch.float32) -> "DraftTree":
        """The empty proposal (plain AR): one root node per row. roots: [B]."""
        batch = roots.shape[0]
        return cls(
            tokens=roots.view(batch, 1).long(),
            parents=torch.full((batch, 1), -1, dtype=torch.long),
            valid=torch.ones(batch, 1, dtype=torch.bool),
            proposal_index=torch.full((batch, 1), DETERMINISTIC, dtype=torch.long),
            without_replacement=torch.zeros(batch, 1, dtype=torch.bool),
            proposal_probs=torch.zeros(batch, 0, vocab_size, dtype=dtype),
        )

    def is_chain(self) -> bool:
        """Every real node i >= 1 hangs under node i - 1 (padding only at the end)."""
        if "chain" not in self._memo:
            expected = torch.arange(-1, self.num_nodes - 1).expand_as(self.parents)
            self._memo["chain"] = bool(((self.parents == expected) | ~self.valid).all())
        return self._memo["chain"]

    def depth(self) -> torch.Tensor:
        """[B, N] long: root 0, child = parent + 1; padding 0."""
        if "depth" not in self._memo:
            if self.is_chain():
                self._memo["depth"] = torch.arange(self.num_nodes).expand_as(self.parents) * self.valid
            else:
                self._memo["depth"] = (self.ancestor_mask().sum(dim=2) - 1) * self.valid
        return self._memo["depth"]

    def ancestor_mask(self) -> torch.Tensor:
        """[B, N, N] bool: node i may attend node j iff j is i or an ancestor of i (padding: self only)."""
        if "ancestors" in self._memo:
            return self._memo["ancestors"]
        batch, width = self.tokens.shape
        eye = identity_mask(width)
        if self.is_chain():  # causal over real nodes, padding sees itself
            causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
            both = self.valid.unsqueeze(1) & self.valid.unsqueeze(2)
            mask = (causal & both) | eye
        else:
            # walk every node's parent pointers up to the root (the root and padding point at themselves)
            index = torch.arange(width).expand(batch, width)
            parent_of = torch.where((self.parents >= 0) & self.valid, self.parents, index)  # [B, N]
            mask = eye.expand(batch, width, width).clone()
            up = parent_of
            for _ in range(width - 1):  # a path has at most N - 1 edges
                mask.scatter_(2, up.unsqueeze(2), True)
                higher = parent_of.gather(1, up)
                if torch.equal(higher, up):
                    break
                up = higher
        self._memo["ancestors"] = mask
        return mask

    def with_structure(self, depth: torch.Tensor, ancestors: torch.Tensor, chain: bool | None = None) -> "DraftTree":
        """Record ``depth()`` [B, N], ``ancestor_mask()`` [B, N, N] and, if given, ``is_chain()``
        that a proposer with a fixed node layout already knows, so they are not derived again
        every step. They must equal what the methods compute (tests check the proposers that do this)."""
        self._memo["depth"], self._memo["ancestors"] = depth, ancestors
        if chain is not None:
            self._memo["chain"] = chain
        return self

    def children_lists(self, row: int) -> list[list[int]]:
        """Per node, its children in sibling order (for the reference law / debugging)."""
        n = int(self.valid[row].sum())
        children: list[list[int]] = [[] for _ in range(n)]
        for node in range(1, n):
            children[int(self.parents[row, node])].append(node)
        return children

    def proposal_of(self, row: int, node: int) -> torch.Tensor:
        """Dense q of a node ([V]; one-hot for deterministic drafts)."""
        index = int(self.proposal_index[row, node])
        if index == DETERMINISTIC:
            q = torch.zeros(self.proposal_probs.shape[-1], dtype=self.proposal_probs.dtype)
            q[int(self.tokens[row, node])] = 1.0
            return q
        return self.proposal_probs[row, index]
