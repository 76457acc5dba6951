"""The embeddings stage: every page's text in chunks, each chunk a unit vector.

It reads two topics. A `doc.uploaded` document whose pages all have text (a text layer, or
plain text) is embedded at once. One with pages that need OCR is left to its `doc.ocr.done`
event, whose result object holds every page's text; a `doc.ocr.done` without OCR'd pages is
ignored, as its upload was embedded already. Either way the effect is keyed by content,
stage and version, so a document is embedded once, whichever event comes first or twice. The
version of text that OCR read is `<embeddings version>+<OCR version>`: a document re-read by a
bumped OCR version is embedded again, under a new key.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from consumers.embeddings.chunking import chunk_page
from consumers.embeddings.model import EmbeddingModel
from consumers.pages import inspect_document
from consumers.runtime import Context, Handler
from consumers.stage import Effects, Outcomes
from docstream.blobstore import BlobStore
from docstream.errors import InvalidEventError
from docstream.idempotency import idempotency_key
from docstream.topology import DOC_UPLOADED, EMBEDDED, OCR_DONE
from docstream.validation import DEFAULT_LIMITS, Limits, validate_completion, validate_upload
from schemas.codec import Codec

Pages = list[tuple[int, str]]  # (page number, text)


MAX_WORDS, OVERLAP = 120, 20  # the chunking: words per chunk, words shared by neighbours


def embeddings_version(model_version: str, max_words: int = MAX_WORDS, overlap: int = OVERLAP) -> str:
    """The embeddings stage's version: the model (name and file hash) and the chunking."""
    return f"{model_version}:chunks{max_words}/{overlap}"


class EmbeddingStage:
    """Chunks and vectors of a document's pages (`consumers.stage.Stage`-like, two inputs)."""

    name = "embeddings"
    result_event = "doc.embedded"

    def __init__(
        self,
        model: EmbeddingModel,
        *,
        max_words: int = MAX_WORDS,
        overlap: int = OVERLAP,
        result_topic: str = EMBEDDED,
    ) -> None:
        self._model, self._max_words, self._overlap = model, max_words, overlap
        self.result_topic = result_topic
        self.version = embeddings_version(model.model_version, max_words, overlap)

    def compute(self, pages: Pages) -> tuple[bytes, dict[str, Any]]:
        chunks: list[dict[str, Any]] = [
            {
                "page": number,
                "index": c.index,
                "text": c.text,
                "char_start": c.char_start,
                "char_end": c.char_end,
            }
            for number, text in pages
            for c in chunk_page(text, max_words=self._max_words, overlap=self._overlap)
        ]
        vectors = self._model.embed([c["text"] for c in chunks])
        for chunk, vector in zip(chunks, vectors, strict=True):
            chunk["vector"] = [round(float(x), 6) for x in vector]
        stored = {"model": self._model.model_version, "dimensions": self._model.dimensions, "chunks": chunks}
        return json.dumps(stored).encode(), self.summarise_chunks(stored)

    def summarise(self, stored: bytes) -> dict[str, Any]:
        return self.summarise_chunks(json.loads(stored))

    @staticmethod
    def summarise_chunks(stored: dict[str, Any]) -> dict[str, Any]:
        return {"chunks": len(stored["chunks"]), "dimensions": stored["dimensions"], "model": stored["model"]}


def embeddings_handler(
    stage: EmbeddingStage,
    blobs: BlobStore,
    codec: Codec,
    *,
    uploads: str = DOC_UPLOADED,
    ocr_done: str = OCR_DONE,
    limits: Limits = DEFAULT_LIMITS,
    clock: Callable[[], float] = time.time,
    outcomes: Outcomes | None = None,
    emit_reused: bool = True,
) -> Handler:
    """The runtime handler: decodes and checks by topic, finds the pages' text, embeds once per key.

    An upload is checked as every stage checks it (consumers.stage, step 0); a doc.ocr.done is
    validated, and its result_uri must be the OCR result object of its own idempotency key, which
    must be the key of its content and OCR version: an event cannot make this stage read another
    document's text or anything outside the store. `outcomes` and `emit_reused` as for
    `consumers.stage.stage_handler`.
    """
    effects = Effects(blobs, codec, clock, outcomes=outcomes, emit_reused=emit_reused)

    def ocr_pages(message: Any, ctx: Context) -> tuple[dict[str, Any], Pages | None]:
        done = codec.decode("doc.ocr.done", message.value() or b"", topic=ocr_done)
        validate_completion(done, limits, produced_at_ms=ctx.origin[3])
        if done["stage"] != "ocr":
            raise InvalidEventError(f"a {done['stage']!r} completion on {ocr_done}")
        if done["pages_ocr"] == 0:
            return done, None  # no OCR was needed: the upload was embedded already
        key = idempotency_key(done["content_sha256"], "ocr", done["model_version"])
        if done["idempotency_key"] != key:
            raise InvalidEventError(
                f"doc.ocr.done idempotency_key {done['idempotency_key']} is not the key of its content and"
                f" OCR version ({key})"
            )
        stored = json.loads(blobs.get_result_at("ocr", key, done["result_uri"]))
        return done, [(int(p["page"]), str(p["text"])) for p in stored["pages"]]

    def upload_pages(message: Any, ctx: Context) -> tuple[dict[str, Any], Pages | None]:
        upload = codec.decode("doc.uploaded", message.value() or b"", topic=uploads)
        validate_upload(upload, limits, produced_at_ms=ctx.origin[3])
        content = blobs.get_document(upload["blob_uri"], upload["content_sha256"], upload["size_bytes"])
        texts = inspect_document(content, upload["content_type"], limits)
        if not all(text.strip() for text in texts):
            return upload, None  # some pages need OCR: wait for doc.ocr.done
        return upload, list(enumerate(texts, start=1))

    def handle(message: Any, ctx: Context) -> None:
        started = clock()
        from_ocr = ctx.origin[0] == ocr_done  # where it was published: a retry comes from the retry topic
        document, pages = (ocr_pages if from_ocr else upload_pages)(message, ctx)
        if pages is None:
            effects.counts.add("ignored")
            return
        # Text read by OCR depends on the OCR version too: a re-read (bumped OCR) is embedded anew.
        version = f"{stage.version}+{document['model_version']}" if from_ocr else stage.version
        effects.once(
            ctx,
            message.key(),
            stage,
            version,
            document,
            upload_offset=document.get("upload_offset") if from_ocr else ctx.origin[2],
            compute=lambda: stage.compute(pages),
            started=started,
        )

    return handle
