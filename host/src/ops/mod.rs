//! The kernels of the decode step, one module per family: each defines the family's host-slice
//! trait (what parity runs, on every backend), its implementation for the CPU replica and for
//! the GPU backends, and the typed launchers on device buffers that the step runs.
pub mod attention;
pub mod gdn;
pub mod norm;
pub mod route;
pub mod spec;
