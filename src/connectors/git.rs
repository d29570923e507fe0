//! Git connector (being written).
