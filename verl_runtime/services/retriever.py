"""A retriever that speaks Search-R1's `retrieve` HTTP API (search_r1/search/retrieval_server.py), which verl's
SearchTool calls (verl/tools/utils/search_r1_like_utils.py): POST /retrieve {"queries": [...], "topk": k,
"return_scores": bool} -> {"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}.

The index is BM25 (Pyserini's defaults, k1=0.9, b=0.4, as Search-R1's BM25 retriever) over a corpus in Search-R1's
format: JSON lines {"id", "contents": "\\"Title\\"\\ntext"}. The default is a small corpus bundled here; --corpus
takes a user's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from verl_runtime.services import serving

BUNDLED_CORPUS = Path(__file__).with_name("corpus.jsonl")
MAX_TOPK = 50
QUEUE_PER_SEARCH = 16  # requests that may wait for a search, per search at once (searches take milliseconds)
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass
class Index:
    documents: list[dict]
    counts: list[Counter]
    lengths: list[int]
    document_frequency: Counter
    k1: float = 0.9
    b: float = 0.4

    @classmethod
    def of(cls, documents: list[dict]) -> Index:
        counts = [Counter(words(d["contents"])) for d in documents]
        frequency = Counter(word for c in counts for word in c)
        return cls(documents, counts, [sum(c.values()) for c in counts], frequency)

    def search(self, query: str, topk: int) -> list[tuple[dict, float]]:
        """The topk documents by BM25 score (ties by corpus order), zero-score documents left out."""
        n, average = len(self.documents), (sum(self.lengths) / len(self.lengths)) or 1.0
        terms = set(words(query))
        scored = []
        for i, (count, length) in enumerate(zip(self.counts, self.lengths)):
            score = 0.0
            for term in terms & count.keys():
                idf = math.log(1 + (n - self.document_frequency[term] + 0.5) / (self.document_frequency[term] + 0.5))
                tf = count[term]
                score += idf * tf * (self.k1 + 1) / (tf + self.k1 * (1 - self.b + self.b * length / average))
            if score > 0:
                scored.append((-score, i))
        return [(self.documents[i], -negative) for negative, i in sorted(scored)[:topk]]


def load_corpus(path) -> Index:
    """A Search-R1 corpus (JSON lines with id and contents); ValueError (one line) for one that is not."""
    path = Path(path).expanduser()
    documents = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"corpus {path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            documents.append({"id": str(row.get("id", number - 1)), "contents": str(row["contents"])})
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError(f"corpus {path} line {number} is not JSON with a contents field (Search-R1's format: "
                             '{"id": ..., "contents": "\\"Title\\"\\ntext"})') from None
    if not documents:
        raise ValueError(f"corpus {path} holds no documents")
    return Index.of(documents)


def retrieve(request: dict, index: Index) -> dict:
    """Search-R1's reply to one request; ValueError (one line) for a request it cannot answer."""
    queries, topk = request.get("queries"), request.get("topk", 3)
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError("queries must be a list of strings")
    if not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"topk must be a whole number from 1 to {MAX_TOPK}")
    results = []
    for query in queries:
        hits = index.search(query, topk)
        if request.get("return_scores"):
            results.append([{"document": document, "score": score} for document, score in hits])
        else:
            results.append([document for document, _ in hits])
    return {"result": results}


def serve(host: str, port: int, index: Index, concurrency: int | None = None,
          queue: int | None = None) -> serving.Server:
    """The HTTP server (not yet serving: call serve_forever): at most `concurrency` searches at once (default: one
    per CPU), `queue` more waiting (default: QUEUE_PER_SEARCH per search), the rest turned away with 503."""
    workers = concurrency or os.cpu_count() or 1
    gate = serving.Gate(workers, QUEUE_PER_SEARCH * workers if queue is None else queue)
    endpoint = serving.Endpoint(("/retrieve",), lambda request: retrieve(request, index))
    return serving.Server(serving.app("retriever", [endpoint], gate, serving.Metrics("retriever")), host, port)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_runtime.services.retriever",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--corpus", default="", help="Search-R1 corpus (JSON lines); default (or empty, as "
                                                      "compose.yaml passes an unset one): the small bundled one")
    args = parser.parse_args(argv)
    try:
        index = load_corpus(args.corpus or BUNDLED_CORPUS)
        server = serve(args.host, args.port, index)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return serving.serve_until_stopped(server, f"retriever: serving retrieve on http://{args.host}:"
                                               f"{server.server_port} ({len(index.documents)} documents)")


if __name__ == "__main__":
    sys.exit(main())
