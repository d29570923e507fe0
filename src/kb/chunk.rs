//! Paragraph-boundary chunking with overlap (being written).
