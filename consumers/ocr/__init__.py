"""The OCR stage's library pieces: from a document's bytes to its text.

pages.py     PDF / image bytes -> pages (text layer, or an RGB image for OCR), with limits (pypdfium2)
engine.py    OcrEngine: page images -> text, confidence and line boxes (rapidocr on onnxruntime)
metrics.py   character error rate, to measure OCR quality (pure)

Nothing is imported here, so that `pages` and `metrics` load without onnxruntime.
"""
