//! Filesystem connector (being written).
