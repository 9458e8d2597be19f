//! The CLI's subcommands, one per file. Each has clap `Args` and a `run` returning the exit code;
//! `timeline` is `strata bench decode --timeline`'s run and tables.
pub mod bench;
pub mod decode;
pub mod dump;
pub mod file_info;
pub mod info;
pub mod knobs;
pub mod parity;
pub mod synth;
pub mod timeline;
