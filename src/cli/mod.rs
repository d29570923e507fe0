//! The ctx command line.
