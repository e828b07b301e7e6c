//! The device-memory interface that an accelerator backend provides.
//!
//! `toast-core` knows nothing about plugins: `toast-accel` implements this
//! trait for a loaded backend, and the accelerator buffer state machine in
//! this crate drives it. Handles are opaque 64-bit values owned by the
//! backend that created them.

use thiserror::Error;

/// A failure reported by a backend's memory operation.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("{backend}: {op} failed: {message}")]
pub struct DeviceError {
    /// The backend that failed.
    pub backend: String,
    /// The operation (`alloc`, `free`, `copy_to_device`, `copy_to_host`, `reset`).
    pub op: &'static str,
    /// The backend's message (names the buffer and the size where relevant).
    pub message: String,
}

/// Device memory operations of one backend.
pub trait DeviceMemory: Send + Sync {
    /// The backend's name (`cpu`, `cuda`, ...).
    fn backend_name(&self) -> &str;
    /// Allocate `bytes` bytes; `name` is used in error messages.
    fn alloc(&self, bytes: u64, name: &str) -> Result<u64, DeviceError>;
    /// Free a buffer created by [`DeviceMemory::alloc`].
    fn free(&self, handle: u64) -> Result<(), DeviceError>;
    /// Copy `src` into the buffer at byte `offset`.
    fn copy_to_device(&self, handle: u64, offset: u64, src: &[u8]) -> Result<(), DeviceError>;
    /// Copy from the buffer at byte `offset` into `dst`.
    fn copy_to_host(&self, handle: u64, offset: u64, dst: &mut [u8]) -> Result<(), DeviceError>;
    /// Fill `bytes` bytes from byte `offset` with zeros.
    fn reset(&self, handle: u64, offset: u64, bytes: u64) -> Result<(), DeviceError>;
}
