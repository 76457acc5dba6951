"""The embeddings stage: page text -> overlapping chunks -> unit vectors (all-MiniLM-L6-v2, ONNX).

chunking.py  Chunk, chunk_page: a page's text in overlapping chunks on paragraph / sentence
             boundaries (pure: imports no ONNX)
model.py     EmbeddingModel: the ONNX model and its tokenizer, both from installed wheels

Nothing is re-exported here, so that importing the pure chunking module does not load onnxruntime.
"""
