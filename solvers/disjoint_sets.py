"""Disjoint sets over 0..n-1 (union-find), for merging variables and grouping positions."""

from __future__ import annotations


class DisjointSets:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        parent = self.parent
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving
            i = parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        """Join the sets of a and b; the smaller root stays the representative."""
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[max(a, b)] = min(a, b)
