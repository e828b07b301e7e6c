//! Timestream templates for the map-maker (TOAST's `toast.templates`).
//!
//! A template maps a vector of amplitudes to timestreams (`add_to_signal`,
//! the matrix `F`) and back (`project_signal`, `Fᵀ`), and supplies a
//! preconditioner. Only TOAST's `Offset` template ("baselines", the
//! destriper) is implemented: see [`offset`].

pub mod offset;

pub use offset::{OffsetConfig, OffsetTemplate};
