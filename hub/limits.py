"""Bounds of the memory store, in bytes and lines, never token counts: the same for every Agent and
model, whatever its tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB

ENTRY_NAME = "MEMORY.md"


@dataclass(frozen=True)
class Limits:
    entry_bytes: int = 2 * KIB
    entry_lines: int = 64
    document_bytes: int = 64 * KIB
    scope_documents: int = 1024
    scope_bytes: int = 16 * MIB
    query_bytes: int = 512
    query_terms: int = 16
    search_default_results: int = 5
    search_max_results: int = 20
    scan_files: int = 1024
    scan_bytes: int = 8 * MIB
    scan_seconds: float = 0.250
    # Directory entries visited, skipped ones included, so a tree of junk cannot stall a scan.
    scan_entries: int = 16 * 1024
    response_bytes: int = 8 * KIB
    snippet_bytes: int = 240
    path_bytes: int = 512
    name_bytes: int = 255
    path_depth: int = 16


DEFAULT_LIMITS = Limits()
