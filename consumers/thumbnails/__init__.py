"""The thumbnails group: the first pages of each document as WebP images, content-addressed."""
