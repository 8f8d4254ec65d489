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


def ancestors_within(parents: torch.Tensor, real: torch.Tensor, levels: int) -> torch.Tensor:
    """[B, N, N] bool: j is i or one of i's ancestors, for trees whose deepest node is at most
    ``levels`` edges below the root. parents [B, N] (-1 = the root's); real [B, N] bool (padding
    nodes see themselves only). By doubling: ``seen[i]`` holds i's nodes at distance < L,
    ``jump[i]`` the node L edges up (the root is its own parent), and each pass doubles L."""
    batch, width = parents.shape
    index = torch.arange(width, device=parents.device)
    eye = (index.unsqueeze(0) == index.unsqueeze(1)).expand(batch, width, width)
    up = torch.where((parents >= 0) & real, parents, index)  # [B, N] one edge up; the root and padding stay
    seen = eye | eye.gather(1, up.unsqueeze(2).expand(batch, width, width))  # L = 2
    jump, span = up.gather(1, up), 2
    while span <= levels:
        seen = seen | seen.gather(1, jump.unsqueeze(2).expand(batch, width, width))
        jump, span = jump.gather(1, jump), 2 * span
    return seen


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

    Host-side facts a proposer knows from its layout (None: derived, reading the tensors back):
    max_children:        most children any node has (the verifier's passes over sibling ranks)
    branch_nodes:        at least as many as the nodes with two or more children, in any row
    any_without_replacement: some node is marked ``without_replacement``
    levels:              at least the deepest node's depth (None: N - 1, no read-back)
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    valid: torch.Tensor
    proposal_index: torch.Tensor
    without_replacement: torch.Tensor
    proposal_probs: torch.Tensor
    max_children: int | None = None
    any_without_replacement: bool | None = None
    branch_nodes: int | None = None
    levels: int | None = None
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # derived masks

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    def children_bound(self) -> int:
        """Most children of any node (``max_children``, or counted: a read-back)."""
        if self.max_children is None:
            counts = self._child_counts()
            self.max_children = int(counts.max()) if counts.numel() else 0
        return self.max_children

    def _child_counts(self) -> torch.Tensor:
        is_child = self.valid & (self.parents >= 0)
        return torch.zeros_like(self.parents).scatter_add_(1, self.parents.clamp(min=0), is_child.long())

    def branch_node_bound(self) -> int:
        """``branch_nodes``, or the most nodes with several children in a row (counted: a read-back)."""
        if self.branch_nodes is None:
            self.branch_nodes = int((self._child_counts() >= 2).sum(dim=1).max()) if self.tokens.numel() else 0
        return self.branch_nodes

    def without_replacement_anywhere(self) -> bool:
        """Some real draft is marked ``without_replacement`` (given, or read back)."""
        if self.any_without_replacement is None:
            self.any_without_replacement = bool((self.without_replacement & self.valid & (self.parents >= 0)).any())
        return self.any_without_replacement

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
        counts = [[b.parents[1:].count(n) for n in range(b.num_nodes)] for b in builders]
        marked = any(any(b.without_replacement[1:]) for b in builders)
        most = max((max(c, default=0) for c in counts), default=0)
        branching = max((sum(n >= 2 for n in c) for c in counts), default=0)
        return cls(tokens, parents, valid, proposal_index, without_replacement, proposal_probs, most, marked, branching)

    @classmethod
    def roots_only(cls, roots: torch.Tensor, vocab_size: int, dtype: torch.dtype = torch.float32) -> "DraftTree":
        """The empty proposal (plain AR): one root node per row. roots: [B]."""
        batch, device = roots.shape[0], roots.device
        tree = cls(
            tokens=roots.view(batch, 1).long(),
            parents=torch.full((batch, 1), -1, dtype=torch.long, device=device),
            valid=torch.ones(batch, 1, dtype=torch.bool, device=device),
            proposal_index=torch.full((batch, 1), DETERMINISTIC, dtype=torch.long, device=device),
            without_replacement=torch.zeros(batch, 1, dtype=torch.bool, device=device),
            proposal_probs=torch.zeros(batch, 0, vocab_size, dtype=dtype, device=device),
            max_children=0,
            any_without_replacement=False,
            branch_nodes=0,
            levels=0,
        )
        zero = torch.zeros(batch, 1, dtype=torch.long, device=device)
        return tree.with_structure(zero, torch.ones(batch, 1, 1, dtype=torch.bool, device=device), chain=True)

    def level_bound(self) -> int:
        """``levels``, or N - 1 (no read-back): at least the deepest node's depth."""
        return self.levels if self.levels is not None else self.num_nodes - 1

    def is_chain(self) -> bool:
        """Every real node i >= 1 hangs under node i - 1 (padding only at the end). Reads back."""
        if "chain" not in self._memo:
            expected = torch.arange(-1, self.num_nodes - 1, device=self.parents.device).expand_as(self.parents)
            self._memo["chain"] = bool(((self.parents == expected) | ~self.valid).all())
        return self._memo["chain"]

    def depth(self) -> torch.Tensor:
        """[B, N] long: root 0, child = parent + 1; padding 0."""
        if "depth" not in self._memo:
            self._memo["depth"] = (self.ancestor_mask().sum(dim=2) - 1) * self.valid
        return self._memo["depth"]

    def ancestor_mask(self) -> torch.Tensor:
        """[B, N, N] bool: node i may attend node j iff j is i or an ancestor of i (padding: self only)."""
        if "ancestors" in self._memo:
            return self._memo["ancestors"]
        self._memo["ancestors"] = ancestors_within(self.parents, self.valid, self.tokens.shape[1] - 1)
        return self._memo["ancestors"]

    def with_structure(self, depth: torch.Tensor, ancestors: torch.Tensor | None = None, chain: bool | None = None) -> "DraftTree":
        """Record ``depth()`` [B, N] and, if given, ``ancestor_mask()`` [B, N, N] and ``is_chain()``
        that a proposer already knows (a fixed node layout, a search that tracked depths), so they
        are not derived again every step. They must equal what the methods would compute from the
        tree's fields."""
        self._memo["depth"] = depth
        if ancestors is not None:
            self._memo["ancestors"] = ancestors
        if chain is not None:
            self._memo["chain"] = chain
        return self

    def to(self, device: torch.device | str) -> "DraftTree":
        """The tree on ``device`` (itself if it is there already); host facts and structure kept."""
        device = torch.device(device)
        if self.tokens.device == device:
            return self
        moved = DraftTree(
            self.tokens.to(device), self.parents.to(device), self.valid.to(device), self.proposal_index.to(device),
            self.without_replacement.to(device), self.proposal_probs.to(device), self.max_children, self.any_without_replacement,
            self.branch_nodes, self.levels,
        )
        moved._memo = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in self._memo.items()}
        return moved

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
