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
from typing import TYPE_CHECKING, Any, TypedDict

from consumers.embeddings.chunking import chunk_page
from consumers.stage import Input, Inputs, Work
from docstream.errors import InvalidEventError
from docstream.idempotency import idempotency_key
from docstream.settings import Settings
from docstream.topology import EMBEDDED
from schemas.events import DocOcrDone, DocUploaded

if TYPE_CHECKING:  # types only: the model module loads onnxruntime
    from consumers.embeddings.model import EmbeddingModel
    from docstream.blobstore import BlobStore

Pages = list[tuple[int, str]]  # (page number, text)


MAX_WORDS, OVERLAP = 120, 20  # the chunking: words per chunk, words shared by neighbours


class EmbeddingFields(TypedDict):
    """The embeddings stage's own fields of `doc.embedded` (schemas/doc_embedded/v3.avsc)."""

    chunks: int
    dimensions: int  # of each vector
    model: str  # the model's version (name and file hash)


def embeddings_version(model_version: str, max_words: int = MAX_WORDS, overlap: int = OVERLAP) -> str:
    """The embeddings stage's version: the model (name and file hash) and the chunking."""
    return f"{model_version}:chunks{max_words}/{overlap}"


class EmbeddingStage:
    """Chunks and vectors of a document's pages (`consumers.stage.Stage`, two inputs).

    An upload is read and checked as every stage reads it (consumers.stage, step 0); a
    doc.ocr.done must come from the ocr stage, and its result_uri must be the OCR result object of
    its own idempotency key, which must be the key of its content and OCR version: an event cannot
    make this stage read another document's text or anything outside the store.
    """

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

    def prepare(self, event: Input, inputs: Inputs) -> Work | None:
        """Pages with text ask for the effect; an upload with pages that need OCR waits for its
        doc.ocr.done, and a doc.ocr.done without OCR'd pages was embedded from its upload."""
        done = event.event
        if isinstance(done, DocUploaded):
            texts = inputs.document(done).texts
            if not all(text.strip() for text in texts):
                return None  # some pages need OCR: wait for doc.ocr.done
            pages: Pages = list(enumerate(texts, start=1))
            return Work(done, self.version, event.offset, lambda: self.compute(pages))
        if not isinstance(done, DocOcrDone):
            raise InvalidEventError(f"a {event.event_type} event where doc.uploaded or doc.ocr.done is read")
        if done.stage != "ocr":
            raise InvalidEventError(f"a {done.stage!r} completion where doc.ocr.done is read")
        if done.pages_ocr == 0:
            return None  # no OCR was needed: the upload was embedded already
        key = idempotency_key(done.content_sha256, "ocr", done.model_version)
        if done.idempotency_key != key:
            raise InvalidEventError(
                f"doc.ocr.done idempotency_key {done.idempotency_key} is not the key of its content"
                f" and OCR version ({key})"
            )
        stored = json.loads(inputs.result("ocr", key, done.result_uri))
        read: Pages = [(int(p["page"]), str(p["text"])) for p in stored["pages"]]
        # Text read by OCR depends on the OCR version too: a re-read (bumped OCR) is embedded anew.
        version = f"{self.version}+{done.model_version}"
        return Work(done, version, done.upload_offset, lambda: self.compute(read))

    def compute(self, pages: Pages) -> tuple[bytes, EmbeddingFields]:
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

    def summarise(self, stored: bytes) -> EmbeddingFields:
        return self.summarise_chunks(json.loads(stored))

    @staticmethod
    def summarise_chunks(stored: dict[str, Any]) -> EmbeddingFields:
        return {"chunks": len(stored["chunks"]), "dimensions": stored["dimensions"], "model": stored["model"]}


def stage_version(settings: Settings) -> str:
    """The version the embeddings group runs (docstream.topology.StageSpec.module): the model's
    name and file hash, read without loading the model."""
    from consumers.embeddings.model import model_version

    return embeddings_version(model_version())


def build_stage(settings: Settings, blobs: BlobStore) -> EmbeddingStage:
    """The embeddings stage of a worker process: the model loads here, once."""
    from consumers.embeddings.model import EmbeddingModel

    return EmbeddingStage(EmbeddingModel(settings.ocr.providers))
