//! The `strata` crate: the embedded device PTX, backend discovery, and the CLI's commands.
pub mod backends;
pub mod commands;
pub mod ptx;

pub use strata_host as host;
