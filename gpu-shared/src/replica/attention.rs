//! (family being written)
