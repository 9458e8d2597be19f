//! Errors of the host side. Each names what failed: the kernel, the backend or the shape.
use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    /// Inputs whose sizes do not fit the kernel's contract.
    #[error("kernel {kernel}: {detail}")]
    Shape { kernel: &'static str, detail: String },
    /// A CUDA driver call failed while running `kernel` (launch, copy, synchronize).
    /// (`cause` is in the message itself, not a `source()`, so chain printers show it once.)
    #[error("kernel {kernel} on {backend}: {what}: {cause}")]
    Driver {
        backend: &'static str,
        kernel: String,
        what: &'static str,
        cause: cudarc::driver::DriverError,
    },
    /// A kernel wrote into the guard words past the end of its output.
    #[error("kernel {kernel} on {backend} wrote past the end of its output")]
    WrotePastOutput { backend: &'static str, kernel: String },
    /// No usable GPU (no driver library, no device, or too old).
    #[error("{backend}: no usable GPU: {reason}")]
    NoGpu { backend: &'static str, reason: String },
    /// A model file that cannot be decoded: what is wrong, naming the file and the tensor or key.
    #[error("{}: {}{detail}", file.display(), what.as_deref().map(|w| format!("{w}: ")).unwrap_or_default())]
    Model { file: std::path::PathBuf, what: Option<String>, detail: String },
    /// The file is not a valid GGUF file.
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    /// A request the engine cannot serve (a prompt longer than the context, a context larger
    /// than the device memory, ...).
    #[error("{0}")]
    Request(String),
    /// A kernel failed in the simulator (`backends::sim`): a trap, or an access outside its
    /// buffers or shared memory, naming the block and thread.
    #[error("kernel {kernel} in the simulator: {detail}")]
    Simulated { kernel: String, detail: String },
    /// Loading a backend's device code failed.
    #[error("{backend}: {what}: {detail}")]
    Setup { backend: &'static str, what: String, detail: String },
}

pub type Result<T> = std::result::Result<T, Error>;
