//! Errors of the host side of `toast-accel`.

use crate::abi::{self, Kernel, Status};
use std::path::PathBuf;
use thiserror::Error;

/// Why a plugin file could not be used.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum LoadError {
    #[error("{path}: no such file")]
    Missing { path: PathBuf },
    /// The file failed the check made before loading (not a regular file,
    /// not this machine's shared object, or cut short), so it was not
    /// handed to the dynamic loader.
    #[error("{path}: not a loadable shared library: {reason}")]
    NotLibrary { path: PathBuf, reason: String },
    /// The dynamic loader refused the file; `reason` is its message.
    #[error("{path}: cannot open shared library: {reason}")]
    Open { path: PathBuf, reason: String },
    #[error("{path}: missing entry symbol `{symbol}`: {reason}")]
    MissingSymbol {
        path: PathBuf,
        symbol: &'static str,
        reason: String,
    },
    #[error("{path}: entry `{symbol}` returned a null header")]
    NullHeader { path: PathBuf, symbol: &'static str },
    #[error("{path}: wrong magic 0x{found:016x} (expected 0x{expected:016x}): not a toast backend plugin")]
    BadMagic {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error("{path}: plugin ABI major {plugin} differs from the host's ABI major {host}")]
    AbiMajor {
        path: PathBuf,
        plugin: u32,
        host: u32,
    },
    #[error("{path}: plugin header is malformed: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

/// An error from a backend or from dispatch.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum AccelError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("backend `{backend}` is unavailable: {reason}")]
    Unavailable { backend: String, reason: String },
    /// `init` refused for a reason other than absent hardware or library:
    /// a usage error (e.g. a bad `--backend-options` value), not an
    /// unavailable backend.
    #[error("backend `{backend}` could not be initialised: {kind}: {message}")]
    InitFailed {
        backend: String,
        kind: StatusKind,
        message: String,
    },
    #[error("backend `{backend}` does not implement kernel `{kernel}`")]
    Unsupported { backend: String, kernel: Kernel },
    #[error("backend `{backend}`, kernel `{kernel}`: {kind}: {message}")]
    Kernel {
        backend: String,
        kernel: Kernel,
        kind: StatusKind,
        message: String,
    },
    #[error("backend `{backend}`, {op}: {kind}: {message}")]
    Memory {
        backend: String,
        op: &'static str,
        kind: StatusKind,
        message: String,
    },
    #[error("no backend named `{name}` was found{detail}")]
    NotFound { name: String, detail: String },
    #[error("no backend can run kernel `{kernel}` for operator `{operator}`: {tried}")]
    NoBackend {
        kernel: Kernel,
        operator: String,
        /// Each backend of the dispatch chain and why it was passed over.
        tried: String,
    },
    #[error("dispatch setting `{setting}`: {reason}")]
    Policy { setting: String, reason: String },
}

/// The meaning of a non-zero [`Status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusKind {
    InvalidArgument,
    OutOfMemory,
    Unsupported,
    InvalidHandle,
    Device,
    Unavailable,
    Compile,
    Panic,
    Internal,
    Unknown(Status),
}

impl LoadError {
    /// The plugin file the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            LoadError::Missing { path }
            | LoadError::NotLibrary { path, .. }
            | LoadError::Open { path, .. }
            | LoadError::MissingSymbol { path, .. }
            | LoadError::NullHeader { path, .. }
            | LoadError::BadMagic { path, .. }
            | LoadError::AbiMajor { path, .. }
            | LoadError::Malformed { path, .. } => path,
        }
    }
}

impl StatusKind {
    pub fn from_status(s: Status) -> StatusKind {
        match s {
            abi::ERR_INVALID_ARGUMENT => StatusKind::InvalidArgument,
            abi::ERR_OUT_OF_MEMORY => StatusKind::OutOfMemory,
            abi::ERR_UNSUPPORTED => StatusKind::Unsupported,
            abi::ERR_INVALID_HANDLE => StatusKind::InvalidHandle,
            abi::ERR_DEVICE => StatusKind::Device,
            abi::ERR_UNAVAILABLE => StatusKind::Unavailable,
            abi::ERR_COMPILE => StatusKind::Compile,
            abi::ERR_PANIC => StatusKind::Panic,
            abi::ERR_INTERNAL => StatusKind::Internal,
            other => StatusKind::Unknown(other),
        }
    }
}

impl std::fmt::Display for StatusKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatusKind::InvalidArgument => f.write_str("invalid argument"),
            StatusKind::OutOfMemory => f.write_str("out of memory"),
            StatusKind::Unsupported => f.write_str("unsupported"),
            StatusKind::InvalidHandle => f.write_str("invalid buffer handle"),
            StatusKind::Device => f.write_str("device error"),
            StatusKind::Unavailable => f.write_str("unavailable"),
            StatusKind::Compile => f.write_str("compile error"),
            StatusKind::Panic => f.write_str("plugin panic"),
            StatusKind::Internal => f.write_str("internal error"),
            StatusKind::Unknown(s) => write!(f, "unknown status {s}"),
        }
    }
}
