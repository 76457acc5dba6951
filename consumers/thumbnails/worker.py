"""The thumbnails stage: renders a document's first pages to WebP at each configured size.

Images are stored content-addressed in the blob store (the same picture is stored once); the
result object lists them; `doc.thumbnailed` carries the same list. Documents that are neither
PDFs nor images get an empty list: having no thumbnail is not a failure.
"""

from __future__ import annotations

import io
import json
from typing import TypedDict

from PIL import Image

from consumers.pages import render_preview
from consumers.stage import UploadStage
from docstream.blobstore import BlobStore
from docstream.settings import Settings, ThumbnailSettings
from docstream.topology import THUMBNAILED
from docstream.validation import IMAGE_TYPES, PDF
from schemas.events import DocUploaded

VERSION = "webp-1"


class ThumbnailSize(TypedDict):
    """One rendered thumbnail (the `Thumbnail` record of schemas/doc_thumbnailed/v4.avsc)."""

    page: int  # 1 for the first
    long_side: int  # the requested length of the longer side, in pixels
    width: int
    height: int
    uri: str  # where the image is, under the blob store


class ThumbnailFields(TypedDict):
    """The thumbnails stage's own fields of `doc.thumbnailed` (schemas/doc_thumbnailed/v4.avsc)."""

    sizes: list[ThumbnailSize]


def thumbnail_version(settings: ThumbnailSettings) -> str:
    """The thumbnails stage's version: the renderer and every setting that changes its pictures."""
    sides = ",".join(str(side) for side in sorted(settings.long_sides))
    return f"{VERSION}:{sides}:q{settings.quality}:p{settings.pages}"


class ThumbnailStage(UploadStage):
    """The thumbnails stage (`consumers.stage.UploadStage`)."""

    name = "thumbnails"
    result_event = "doc.thumbnailed"

    def __init__(
        self, blobs: BlobStore, settings: ThumbnailSettings, result_topic: str = THUMBNAILED
    ) -> None:
        self._blobs, self._settings = blobs, settings
        self.result_topic = result_topic
        self.version = thumbnail_version(settings)

    def compute(self, upload: DocUploaded, content: bytes) -> tuple[bytes, ThumbnailFields]:
        content_type = upload.content_type
        sizes: list[ThumbnailSize] = []
        if content_type == PDF or content_type in IMAGE_TYPES:
            largest = max(self._settings.long_sides)
            previews = render_preview(
                content,
                content_type=content_type,
                pages=self._settings.pages,
                long_side=largest,
                max_pixels=self._settings.max_pixels,
            )
            for page, pixels in enumerate(previews, start=1):
                sizes += [
                    self._thumbnail(Image.fromarray(pixels), page, side)
                    for side in sorted(self._settings.long_sides)
                ]
        fields: ThumbnailFields = {"sizes": sizes}
        return json.dumps(fields, sort_keys=True).encode(), fields

    def summarise(self, stored: bytes) -> ThumbnailFields:
        return {"sizes": json.loads(stored)["sizes"]}

    def _thumbnail(self, page_image: Image.Image, page: int, long_side: int) -> ThumbnailSize:
        image = page_image.copy()
        image.thumbnail((long_side, long_side), Image.Resampling.LANCZOS)
        buffer = io.BytesIO()
        image.save(buffer, format="WEBP", quality=self._settings.quality, method=4)
        stored = self._blobs.put_content(buffer.getvalue())
        return {
            "page": page,
            "long_side": long_side,
            "width": image.width,
            "height": image.height,
            "uri": stored.uri,
        }


def stage_version(settings: Settings) -> str:
    """The version the thumbnails group runs with `settings` (docstream.topology.StageSpec.module)."""
    return thumbnail_version(settings.thumbnails)


def build_stage(settings: Settings, blobs: BlobStore) -> ThumbnailStage:
    """The thumbnails stage of a worker process."""
    return ThumbnailStage(blobs, settings.thumbnails)
